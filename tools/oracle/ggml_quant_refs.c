// The values `families/ops/src/ggml_cpu/quants.rs`'s tests hold: what the
// oracle's libggml (llama-cpp-python 0.3.36, -march=native on an AVX2 + FMA
// + F16C machine without AVX512) computes for the products of quantized
// weights, printed as f32 bits:
//
// - `vec_dot` of one weight row by one activation row, through
//   ggml_get_type_traits_cpu (the activations converted by the vec_dot
//   type's from_float: Q8_0, Q8_1 or Q8_K);
// - `mul_mat` of 8 rows by 1 and by 6 columns on the CPU backend, the weight
//   in the CPU repack buffer (ggml repacks Q4_0, Q4_K and IQ4_NL of a
//   multiple of 8 rows: gemv for one column, gemm for each 4, gemv for the
//   rest);
// - `mul_mat` of 4 rows by 3 columns in a plain context (llamafile's
//   tinyBLAS_Q0_AVX for Q8_0, Q4_0, Q5_0 and IQ4_NL; vec_dot for the rest);
// - `mul_mat` of 4 rows by 9 columns in a plain context: the tiled K-quant
//   kernel (tiled/tiled-kernel.cpp) for the K- and IQ types it takes.
//
// Weight rows are pseudo-random bytes (the LCG `bytes` below, the tests'
// `weight_bytes`) with every f16 scale field of block b set to
// f16(0.011 + 0.0007 b) (a min: f16(0.0043 + 0.0003 b)), so any bit
// pattern of the codes is a valid block. Activations are row(n, seed,
// scale), as in ggml_kernel_refs.c.
//
//   LC=.../vendor/llama.cpp BIN=/tmp/lcp/build/bin
//   gcc -O1 -ffp-contract=off -I$LC/ggml/include ggml_quant_refs.c
//       -L$BIN -lggml -lggml-base -lggml-cpu -lm -Wl,-rpath,$BIN -o ggml_quant_refs
//   (one command)
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void row(int n, uint32_t seed, float scale, float *out) {
    uint32_t s = seed;
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        out[i] = ((float)(s >> 8) / 16777216.0f * 2.0f - 1.0f) * scale;
    }
}

static void pr(const char *name, const float *v, int n) {
    printf("%s:", name);
    for (int i = 0; i < n; i++) {
        unsigned u;
        memcpy(&u, &v[i], 4);
        printf(" 0x%08x,", u);
    }
    printf("\n");
}

// Offsets of a block's f16 scale fields (d) and min fields (m), -1 ends.
struct layout { enum ggml_type ty; int d[2]; int m; };
static const struct layout LAYOUTS[] = {
    { GGML_TYPE_Q8_0,    { 0, -1 }, -1 },
    { GGML_TYPE_Q4_0,    { 0, -1 }, -1 },
    { GGML_TYPE_Q4_1,    { 0, -1 },  2 },
    { GGML_TYPE_Q5_0,    { 0, -1 }, -1 },
    { GGML_TYPE_Q5_1,    { 0, -1 },  2 },
    { GGML_TYPE_IQ4_NL,  { 0, -1 }, -1 },
    { GGML_TYPE_Q2_K,    { 80, -1 }, 82 },
    { GGML_TYPE_Q3_K,    { 108, -1 }, -1 },
    { GGML_TYPE_Q4_K,    { 0, -1 },  2 },
    { GGML_TYPE_Q5_K,    { 0, -1 },  2 },
    { GGML_TYPE_Q6_K,    { 208, -1 }, -1 },
    { GGML_TYPE_IQ4_XS,  { 0, -1 }, -1 },
    { GGML_TYPE_IQ2_XXS, { 0, -1 }, -1 },
};

static const struct layout *layout_of(enum ggml_type ty) {
    for (size_t i = 0; i < sizeof LAYOUTS / sizeof LAYOUTS[0]; i++)
        if (LAYOUTS[i].ty == ty) return &LAYOUTS[i];
    abort();
}

static void put_f16(uint8_t *p, float v) {
    ggml_fp16_t h = ggml_fp32_to_fp16(v);
    memcpy(p, &h, 2);
}

// `rows` rows of n elements of ty: LCG bytes, scale fields as above.
static void weight_bytes(enum ggml_type ty, int n, int rows, uint32_t seed, uint8_t *out) {
    size_t total = ggml_row_size(ty, n) * rows;
    uint32_t s = seed;
    for (size_t i = 0; i < total; i++) {
        s = s * 1664525u + 1013904223u;
        out[i] = (uint8_t)(s >> 24);
    }
    const struct layout *l = layout_of(ty);
    size_t bs = ggml_type_size(ty);
    for (size_t b = 0; b < total / bs; b++) {
        put_f16(out + b * bs + l->d[0], 0.011f + 0.0007f * (float)b);
        if (l->m >= 0) put_f16(out + b * bs + l->m, 0.0043f + 0.0003f * (float)b);
    }
}

// vec_dot of row 0 of a weight of ty by row(n, seed, 2.5).
static void dot(enum ggml_type ty, int n, uint32_t wseed, uint32_t xseed) {
    const struct ggml_type_traits_cpu *tc = ggml_get_type_traits_cpu(ty);
    const struct ggml_type_traits_cpu *td = ggml_get_type_traits_cpu(tc->vec_dot_type);
    uint8_t *w = malloc(ggml_row_size(ty, n));
    uint8_t *xq = malloc(ggml_row_size(tc->vec_dot_type, n));
    float *x = malloc(n * sizeof(float));
    weight_bytes(ty, n, 1, wseed, w);
    row(n, xseed, 2.5f, x);
    td->from_float(x, xq, n);
    float s;
    tc->vec_dot(n, &s, 0, w, 0, xq, 0, 1);
    printf("vec_dot %s n=%d wseed=%u xseed=%u", ggml_type_name(ty), n, wseed, xseed);
    pr("", &s, 1);
    free(w); free(xq); free(x);
}

// mul_mat of `rows` x n of ty (seed wseed) by `cols` columns row(n, xseed +
// c, 2.5), on the CPU backend, the weight in `buft`.
static void mul_mat(const char *what, ggml_backend_t be, ggml_backend_buffer_type_t buft,
                    enum ggml_type ty, int n, int rows, int cols, uint32_t wseed, uint32_t xseed) {
    struct ggml_init_params ip = { 4 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context *cw = ggml_init(ip);
    struct ggml_context *ca = ggml_init(ip);
    struct ggml_tensor *w = ggml_new_tensor_2d(cw, ty, n, rows);
    struct ggml_tensor *x = ggml_new_tensor_2d(ca, GGML_TYPE_F32, n, cols);
    struct ggml_tensor *y = ggml_mul_mat(ca, w, x);
    ggml_backend_buffer_t bw = ggml_backend_alloc_ctx_tensors_from_buft(cw, buft);
    ggml_backend_buffer_t ba = ggml_backend_alloc_ctx_tensors(ca, be);
    uint8_t *wb = malloc(ggml_nbytes(w));
    weight_bytes(ty, n, rows, wseed, wb);
    ggml_backend_tensor_set(w, wb, 0, ggml_nbytes(w));
    float *xb = malloc(ggml_nbytes(x));
    for (int c = 0; c < cols; c++) row(n, xseed + c, 2.5f, xb + c * n);
    ggml_backend_tensor_set(x, xb, 0, ggml_nbytes(x));
    struct ggml_cgraph *gf = ggml_new_graph(ca);
    ggml_build_forward_expand(gf, y);
    ggml_backend_graph_compute(be, gf);
    float *out = malloc(ggml_nbytes(y));
    ggml_backend_tensor_get(y, out, 0, ggml_nbytes(y));
    printf("%s %s n=%d rows=%d cols=%d wseed=%u xseed=%u", what, ggml_type_name(ty), n, rows, cols, wseed, xseed);
    pr("", out, rows * cols);
    free(wb); free(xb); free(out);
    ggml_backend_buffer_free(bw); ggml_backend_buffer_free(ba);
    ggml_free(cw); ggml_free(ca);
}

int main(void) {
    ggml_cpu_init();
    // One row by one column: every vec_dot kernel, two rows of blocks.
    const enum ggml_type vec[] = {
        GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1,
        GGML_TYPE_IQ4_NL, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
        GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS, GGML_TYPE_IQ2_XXS,
    };
    for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
        dot(vec[i], 512, 7 + (uint32_t)i, 100 + (uint32_t)i);
        dot(vec[i], 768, 17 + (uint32_t)i, 200 + (uint32_t)i);
    }
    // IQ4_NL's odd last block.
    dot(GGML_TYPE_IQ4_NL, 96, 41, 42);

    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, 1);
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t extra =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t repack = NULL;
    for (ggml_backend_buffer_type_t *b = extra(dev); *b; b++)
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) repack = *b;
    if (!repack) { fprintf(stderr, "no CPU_REPACK buffer type\n"); return 1; }
    ggml_backend_buffer_type_t plain = ggml_backend_cpu_buffer_type();

    const enum ggml_type rep[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q4_K, GGML_TYPE_IQ4_NL };
    for (size_t i = 0; i < 3; i++) {
        int n = rep[i] == GGML_TYPE_Q4_K ? 512 : 96;
        mul_mat("repacked", be, repack, rep[i], n, 8, 1, 300 + (uint32_t)i, 400);
        mul_mat("repacked", be, repack, rep[i], n, 8, 6, 300 + (uint32_t)i, 400);
    }
    // Several columns in a plain buffer: tinyBLAS_Q0_AVX for the 32-element
    // types it takes, vec_dot per column for the others.
    const enum ggml_type tiled[] = { GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, GGML_TYPE_IQ4_NL, GGML_TYPE_Q5_1, GGML_TYPE_Q6_K };
    for (size_t i = 0; i < 5; i++) {
        int n = ggml_blck_size(tiled[i]) == 256 ? 512 : 96;
        mul_mat("plain", be, plain, tiled[i], n, 4, 3, 500 + (uint32_t)i, 600);
    }
    // 9 columns of a plain weight: the tiled K-quant kernel (from 8 tokens)
    // for the K- and IQ types it takes.
    const enum ggml_type tiles[] = { GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS, GGML_TYPE_IQ2_XXS };
    for (size_t i = 0; i < 5; i++) {
        mul_mat("tiled", be, plain, tiles[i], 512, 4, 9, 700 + (uint32_t)i, 800);
    }
    ggml_backend_free(be);
    return 0;
}
