// Encode one synthetic image with llama.cpp's mtmd/clip loader and print the
// image embeddings as JSON: the projector oracle for muse_glimmer
// (docs/families/muse_glimmer.md section 7). Built against the vendored
// llama.cpp without libmtmd (the oracle build turns mtmd off), from the clip
// sources and the oracle's ggml libraries (LC = vendor/llama.cpp of the
// sdist, BIN = /tmp/lcp/build/bin):
//
//   for f in $LC/tools/mtmd/{clip,mtmd-image,mtmd-audio}.cpp $LC/tools/mtmd/models/*.cpp; do
//     g++ -O2 -std=c++17 -fPIC -I$LC/tools/mtmd -I$LC/include -I$LC/ggml/include -I$LC/vendor \
//         -c $f -o $(basename $f .cpp).o; done
//   g++ -O2 -std=c++17 mm_encode.cpp *.o -I$LC/tools/mtmd -I$LC/include -I$LC/ggml/include \
//       -L$BIN -lggml -lggml-base -Wl,-rpath,$BIN -o mm_encode
//   mm_encode MMPROJ.gguf WIDTH HEIGHT > out.json
//
// The image bypasses mtmd's preprocessing (resize, normalisation): the f32
// buffer handed to clip_image_encode is pixel-major interleaved RGB,
// value(x, y, c) = sin(0.37*x + 0.61*y + 1.3*c) (already "normalised"), so a
// reference can rebuild it exactly.
#include "clip.h"
#include "clip-impl.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char ** argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MMPROJ.gguf WIDTH HEIGHT\n", argv[0]);
        return 2;
    }
    const int w = atoi(argv[2]);
    const int h = atoi(argv[3]);

    clip_context_params params = {};
    params.use_gpu = false;
    params.device = nullptr;
    params.flash_attn_type = CLIP_FLASH_ATTN_TYPE_DISABLED;
    params.image_min_tokens = -1;
    params.image_max_tokens = -1;
    params.warmup = false;
    clip_init_result res = clip_init(argv[1], params);
    if (res.ctx_v == nullptr) {
        fprintf(stderr, "clip_init failed\n");
        return 1;
    }

    std::vector<float> buf((size_t) w * h * 3);
    for (int y = 0; y < h; y++) {
        for (int x = 0; x < w; x++) {
            for (int c = 0; c < 3; c++) {
                buf[((size_t) y * w + x) * 3 + c] = sinf(0.37f * x + 0.61f * y + 1.3f * c);
            }
        }
    }
    clip_image_f32 img;
    img.set_size({w, h}, false, false);
    img.cpy_buf(buf);

    const int n_tok = clip_n_output_tokens(res.ctx_v, &img);
    const int n_embd = clip_n_mmproj_embd(res.ctx_v);
    std::vector<float> out((size_t) n_tok * n_embd);  // clip_encode copies only into a sized buffer
    if (!clip_image_encode(res.ctx_v, 4, &img, out)) {
        fprintf(stderr, "clip_image_encode failed\n");
        return 1;
    }
    printf("{\"width\": %d, \"height\": %d, \"n_tokens\": %d, \"n_embd\": %d, \"embeddings\": [", w, h, n_tok, n_embd);
    for (size_t i = 0; i < out.size(); i++) {
        printf(i ? ", %.9g" : "%.9g", out[i]);
    }
    printf("]}\n");
    clip_free(res.ctx_v);
    return 0;
}
