// greedy_top2: llama.cpp's greedy tokens with the top-2 logits of every step,
// and its load / prefill / first-token / decode times, as one JSON object.
//
//   greedy_top2 MODEL.gguf TOKENS STEPS N_GPU_LAYERS [--ctx N] [--kv-f32]
//               [--one-token] [--threads N] [--dump-logits PATH]
//
// TOKENS: comma-separated prompt ids. Loads the model (llama.cpp's default
// model params: mmap on), decodes the prompt in one batch, then STEPS greedy
// tokens one at a time (step 0 is the argmax at the prompt's last position;
// steps 1..STEPS-1 each decode one token). Greedy = argmax, ties to the lower
// id. Context params are llama.cpp's defaults except n_ctx = prompt + STEPS
// + 8 (or --ctx) and n_batch = n_ubatch = max(prompt, 512). --kv-f32: F32 K
// and V caches and no flash attention (as tools/oracle's goldens run).
// --one-token: feed the prompt one token per llama_decode call (as seam's
// families do) instead of one batch; prefill_seconds then covers them all.
// --threads N: n_threads and n_threads_batch (default: llama.cpp's).
// --dump-logits PATH: write the last step's logits (those whose argmax is
// the last token; with STEPS 1 the prompt's last position) as f32 LE, as
// seam's --dump-logits does.
// first_token_seconds_since_process_start is taken from a clock read first
// thing in main: it excludes exec and dynamic linking before main.
//
// Build (against a build of the stripped tree, tools/peer/make_llama_src.sh;
// L = its source, B = its build dir; tools/h200_peer_bench.sh does this):
//   g++ -O2 -std=c++17 tools/peer/greedy_top2.cpp -I$L/include -I$L/ggml/include
//       -L$B/bin -lllama -lggml -lggml-base -Wl,-rpath,$B/bin -o $B/bin/greedy_top2
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using clk = std::chrono::steady_clock;

static double secs(clk::time_point a, clk::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}

static void quiet_log(ggml_log_level level, const char * text, void *) {
    if (level >= GGML_LOG_LEVEL_WARN) fputs(text, stderr);
}

static void json_float(std::string & out, float v) {
    char buf[64];
    if (std::isfinite(v)) snprintf(buf, sizeof buf, "%.9g", v);
    else snprintf(buf, sizeof buf, "null");
    out += buf;
}

// Top two of logits[0..n): larger logit first, ties to the lower id.
static void top2(const float * l, int n, int & a, int & b) {
    a = -1; b = -1;
    for (int i = 0; i < n; i++) {
        if (a < 0 || l[i] > l[a]) { b = a; a = i; }
        else if (b < 0 || l[i] > l[b]) { b = i; }
    }
}

int main(int argc, char ** argv) {
    const auto t_start = clk::now();
    if (argc < 5) {
        fprintf(stderr, "usage: %s MODEL TOKENS STEPS N_GPU_LAYERS [--ctx N] [--kv-f32] [--one-token]"
                        " [--threads N] [--dump-logits PATH]\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    std::vector<llama_token> prompt;
    for (const char * p = argv[2]; *p;) {
        char * end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0) { fprintf(stderr, "bad token list: %s\n", argv[2]); return 2; }
        prompt.push_back((llama_token) v);
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') { fprintf(stderr, "bad token list: %s\n", argv[2]); return 2; }
    }
    const int steps = atoi(argv[3]);
    const int ngl = atoi(argv[4]);
    int n_ctx = (int) prompt.size() + steps + 8;
    bool kv_f32 = false, one_token = false;
    int n_threads = 0;
    const char * dump_path = nullptr;
    for (int i = 5; i < argc; i++) {
        if (!strcmp(argv[i], "--ctx") && i + 1 < argc) n_ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kv-f32")) kv_f32 = true;
        else if (!strcmp(argv[i], "--one-token")) one_token = true;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dump-logits") && i + 1 < argc) dump_path = argv[++i];
        else { fprintf(stderr, "unknown argument %s\n", argv[i]); return 2; }
    }
    if (prompt.empty() || steps < 1) { fprintf(stderr, "need a prompt and STEPS >= 1\n"); return 2; }

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();

    const auto t_load0 = clk::now();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = ngl;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "failed to load %s\n", model_path); return 1; }
    const auto t_load1 = clk::now();

    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) n_ctx;
    cp.n_batch = cp.n_ubatch = (uint32_t) std::max<size_t>(prompt.size(), 512);
    if (kv_f32) {
        cp.type_k = cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    if (n_threads > 0) cp.n_threads = cp.n_threads_batch = n_threads;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "failed to create the context\n"); return 1; }
    const auto t_ctx1 = clk::now();

    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    for (llama_token t : prompt) {
        if (t >= n_vocab) { fprintf(stderr, "token %d >= n_vocab %d\n", t, n_vocab); return 2; }
    }

    std::string out_steps;
    double first_token_s = 0, prefill_s = 0;
    auto t_dec0 = clk::now();
    llama_token tok = 0;
    for (int s = 0; s < steps; s++) {
        const auto t0 = clk::now();
        int rc = 0;
        if (s > 0) rc = llama_decode(ctx, llama_batch_get_one(&tok, 1));
        else if (!one_token) rc = llama_decode(ctx, llama_batch_get_one(prompt.data(), (int32_t) prompt.size()));
        else for (size_t i = 0; i < prompt.size() && rc == 0; i++) rc = llama_decode(ctx, llama_batch_get_one(&prompt[i], 1));
        if (rc != 0) { fprintf(stderr, "llama_decode failed at step %d: %d\n", s, rc); return 1; }
        const float * l = llama_get_logits_ith(ctx, -1);
        if (dump_path && s == steps - 1) {
            FILE * f = fopen(dump_path, "wb");
            if (!f || fwrite(l, sizeof(float), (size_t) n_vocab, f) != (size_t) n_vocab || fclose(f) != 0) {
                fprintf(stderr, "cannot write %s\n", dump_path); return 1;
            }
        }
        int a, b;
        top2(l, n_vocab, a, b);
        tok = a;
        const auto t1 = clk::now();
        if (s == 0) {
            prefill_s = secs(t0, t1);
            first_token_s = secs(t_start, t1);
            t_dec0 = t1;
        }
        char buf[64];
        snprintf(buf, sizeof buf, "%s{\"token\":%d,\"top2\":[[%d,", s ? "," : "", a, a);
        out_steps += buf;
        json_float(out_steps, l[a]);
        snprintf(buf, sizeof buf, "],[%d,", b);
        out_steps += buf;
        if (b >= 0) json_float(out_steps, l[b]); else out_steps += "null";
        out_steps += "]]}";
    }
    const double decode_s = secs(t_dec0, clk::now());

    printf("{\"model\":\"%s\",\"n_gpu_layers\":%d,\"n_ctx\":%u,\"n_batch\":%u,\"n_threads\":%d,"
           "\"kv_f32\":%s,\"one_token\":%s,\"n_vocab\":%d,\"load_seconds\":%.6f,\"context_seconds\":%.6f,\"prompt_tokens\":%zu,"
           "\"prefill_seconds\":%.6f,\"first_token_seconds_since_process_start\":%.6f,"
           "\"decode_steps\":%d,\"decode_seconds\":%.6f,\"decode_tokens_per_second\":",
           model_path, ngl, llama_n_ctx(ctx), cp.n_batch, cp.n_threads, kv_f32 ? "true" : "false", one_token ? "true" : "false", n_vocab,
           secs(t_load0, t_load1), secs(t_load1, t_ctx1), prompt.size(), prefill_s, first_token_s,
           steps - 1, decode_s);
    if (steps > 1 && decode_s > 0) printf("%.6f", (steps - 1) / decode_s); else printf("null");
    printf(",\"steps\":[%s]}\n", out_steps.c_str());
    fflush(stdout);

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
