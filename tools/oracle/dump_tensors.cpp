// Dumps llama.cpp's named intermediate tensors at one position of the
// one-token path (the prompt fed one token per decode, F32 K/V cache, no
// flash attention, as llama_goldens.py's `incremental`), through the eval
// callback: how the muse_glimmer mixed-type mismatch was traced
// (docs/families/muse_glimmer.md section 10). Build against the oracle:
//
//   g++ -O1 -std=c++17 -I$LC/include -I$LC/ggml/include dump_tensors.cpp
//       -L$BIN -lllama -lggml -lggml-base -Wl,-rpath,$BIN -o dump_tensors   (one command)
//   dump_tensors MODEL.gguf 106,77,93 POS OUT.bin
//   dump_tensors MODEL.gguf 106,77,93 batched OUT.bin   (the prompt as one
//       ubatch, every tensor of that pass: position p is column p)
//
// POS -1 dumps no tensor (the logits only). DUMP_NGL (default 0) offloads
// that many layers (999: llama.cpp's CUDA build, as tools/h200_goldens_cuda.sh
// runs it); DUMP_CACHE f32 (default) or f16 is the K/V cache type.
// DUMP_CTX (default 256) is n_ctx.
//
// OUT.bin: per F32/F16 contiguous tensor evaluated at position POS, the name
// length (i32), the name, ne[4] (i64), the op (i32), the values (f32);
// OUT.bin.logits: every position's logits (f32 rows).
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static bool g_dump = false;
static FILE * g_out = nullptr;

static bool on_eval(struct ggml_tensor * t, bool ask, void *) {
    if (ask || !g_dump) {
        return true;
    }
    const int64_t n = ggml_nelements(t);
    std::vector<uint8_t> raw(ggml_nbytes(t));
    ggml_backend_tensor_get(t, raw.data(), 0, raw.size());
    std::vector<float> f(n);
    if (t->type == GGML_TYPE_F32 && ggml_is_contiguous(t)) {
        memcpy(f.data(), raw.data(), n * sizeof(float));
    } else if (t->type == GGML_TYPE_F16 && ggml_is_contiguous(t)) {
        for (int64_t i = 0; i < n; i++) {
            f[i] = ggml_fp16_to_fp32(((const ggml_fp16_t *) raw.data())[i]);
        }
    } else {
        return true;
    }
    const int32_t len = (int32_t) strlen(t->name);
    const int64_t ne[4] = { t->ne[0], t->ne[1], t->ne[2], t->ne[3] };
    const int32_t op = t->op;
    fwrite(&len, 4, 1, g_out);
    fwrite(t->name, 1, len, g_out);
    fwrite(ne, 8, 4, g_out);
    fwrite(&op, 4, 1, g_out);
    fwrite(f.data(), 4, n, g_out);
    return true;
}

int main(int argc, char ** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s MODEL.gguf TOKENS POS OUT.bin\n", argv[0]);
        return 2;
    }
    const std::string list = argv[2];
    const bool batched = strcmp(argv[3], "batched") == 0;
    const int pos = batched ? -1 : atoi(argv[3]);
    const std::string out = argv[4];
    std::vector<llama_token> tokens;
    for (size_t s = 0; s < list.size();) {
        size_t e = list.find(',', s);
        if (e == std::string::npos) {
            e = list.size();
        }
        tokens.push_back(atoi(list.substr(s, e - s).c_str()));
        s = e + 1;
    }
    llama_backend_init();
    auto mp = llama_model_default_params();
    const char * ngl = getenv("DUMP_NGL");
    mp.n_gpu_layers = ngl ? atoi(ngl) : 0;
    const char * cache = getenv("DUMP_CACHE");
    const bool f16 = cache && std::string(cache) == "f16";
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        return 1;
    }
    auto cp = llama_context_default_params();
    const char * n_ctx = getenv("DUMP_CTX");
    cp.n_ctx = n_ctx ? atoi(n_ctx) : 256;
    cp.n_batch = cp.n_ubatch = 256;
    cp.n_threads = cp.n_threads_batch = 2;
    cp.type_k = cp.type_v = f16 ? GGML_TYPE_F16 : GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.cb_eval = on_eval;
    llama_context * ctx = llama_init_from_model(model, cp);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * logits = fopen((out + ".logits").c_str(), "wb");
    if (batched) {
        g_dump = true;
        g_out = fopen(out.c_str(), "wb");
        llama_batch b = llama_batch_init((int32_t) tokens.size(), 0, 1);
        for (size_t i = 0; i < tokens.size(); i++) {
            b.token[i] = tokens[i];
            b.pos[i] = (llama_pos) i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = true;
        }
        b.n_tokens = (int32_t) tokens.size();
        if (llama_decode(ctx, b)) {
            fprintf(stderr, "batched decode failed\n");
            return 1;
        }
        for (size_t i = 0; i < tokens.size(); i++) {
            fwrite(llama_get_logits_ith(ctx, (int32_t) i), 4, n_vocab, logits);
        }
        fclose(g_out);
        llama_batch_free(b);
    }
    for (size_t i = 0; !batched && i < tokens.size(); i++) {
        g_dump = (int) i == pos;
        if (g_dump) {
            g_out = fopen(out.c_str(), "wb");
        }
        llama_batch b = llama_batch_get_one(&tokens[i], 1);
        if (llama_decode(ctx, b)) {
            fprintf(stderr, "decode failed at %zu\n", i);
            return 1;
        }
        fwrite(llama_get_logits_ith(ctx, -1), 4, n_vocab, logits);
        if (g_dump) {
            fclose(g_out);
            g_dump = false;
        }
    }
    fclose(logits);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
