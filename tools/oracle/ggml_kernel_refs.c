// The values `families/ops/src/ggml_cpu.rs`'s tests hold: what the oracle's
// libggml (llama-cpp-python 0.3.36, built by build_llama.sh with
// -march=native on an AVX2 + FMA + F16C machine without AVX512) computes for
// small inputs, printed as f32 bits. Inputs are in(i, s) = sinf(0.37*i + s) *
// (1 + 0.05*(i % 7)), or for the longer rows row(n, seed, scale) (an LCG,
// the tests' `row`), each step rounded to f32 (hence -ffp-contract=off):
//
//   LC=.../vendor/llama.cpp BIN=/tmp/lcp/build/bin
//   gcc -O1 -ffp-contract=off -I$LC/ggml/include ggml_kernel_refs.c
//       -L$BIN -lggml -lggml-base -lggml-cpu -lm -Wl,-rpath,$BIN -o ggml_kernel_refs
//   (one command)
//
// vec_dot through ggml_get_type_traits_cpu; the ops as a one-thread CPU graph
// (a plain context: no weight repacking, so the repacked Q4_0 gemv is checked
// by the muse_glimmer goldens instead).
#include "ggml.h"
#include "ggml-cpu.h"
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

// Exported by libggml-cpu (vec.cpp) though no public header declares it: the
// exp of softmax's whole 8s, i.e. ggml_v_expf, when max is 0.
double ggml_vec_soft_max_f32(const int n, float *y, const float *x, float max);

static float in(int i, float s) {
    float a = 0.37f * (float)i;
    a = a + s;
    float m = 0.05f * (float)(i % 7);
    m = 1.0f + m;
    return sinf(a) * m;
}

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
        printf(" 0x%08x", u);
    }
    printf("\n");
}

static void fill(struct ggml_tensor *t, float s, float k) {
    float *d = t->data;
    for (int i = 0; i < ggml_nelements(t); i++) d[i] = in(i, s) * k;
}

// vec_dot of n = 80 (floats: two whole 32s and 16 leftovers) or 64 (quants)
// values of x = in(i, sx) stored as ty and y = 2.5 in(i, sy).
static void dot(enum ggml_type ty, float sx, float sy, int print_weight) {
    int n = (ty == GGML_TYPE_Q8_0 || ty == GGML_TYPE_Q4_0) ? 64 : 80;
    const struct ggml_type_traits_cpu *tc = ggml_get_type_traits_cpu(ty);
    const struct ggml_type_traits_cpu *td = ggml_get_type_traits_cpu(tc->vec_dot_type);
    float x[80], y[80];
    char wx[512], wy[512];
    for (int i = 0; i < n; i++) { x[i] = in(i, sx); y[i] = in(i, sy) * 2.5f; }
    if (ty == GGML_TYPE_F32) memcpy(wx, x, n * 4); else tc->from_float(x, wx, n);
    if (tc->vec_dot_type == GGML_TYPE_F32) memcpy(wy, y, n * 4); else td->from_float(y, wy, n);
    float s;
    tc->vec_dot(n, &s, 0, wx, 0, wy, 0, 1);
    printf("vec_dot %s sx=%g sy=%g", ggml_type_name(ty), sx, sy);
    pr("", &s, 1);
    if (print_weight) {
        printf("weight row %s:", ggml_type_name(ty));
        for (size_t i = 0; i < ggml_row_size(ty, n); i++) printf(" %d,", (unsigned char)wx[i]);
        printf("\n");
    }
}

// vec_dot of row(n, seed, 30) by row(n, seed + 100, 3), as F32 or (both
// rounded to BF16) BF16.
static void dot_rows(enum ggml_type ty, int n, uint32_t seed) {
    const struct ggml_type_traits_cpu *tc = ggml_get_type_traits_cpu(ty);
    float x[512], y[512], s;
    uint16_t bx[512], by[512];
    row(n, seed, 30.0f, x);
    row(n, seed + 100, 3.0f, y);
    if (ty == GGML_TYPE_F32) {
        tc->vec_dot(n, &s, 0, x, 0, y, 0, 1);
    } else {
        tc->from_float(x, bx, n);
        tc->from_float(y, by, n);
        tc->vec_dot(n, &s, 0, bx, 0, by, 0, 1);
    }
    printf("vec_dot %s n=%d seed=%u", ggml_type_name(ty), n, seed);
    pr("", &s, 1);
}

// llama.cpp's attention without flash attention (build_attn_mha): q
// [dk, n_head, n_tokens] = row(.., 21, 2), one K/V head of n_kv = 64 cells
// (K [dk, n_kv] = row(.., 22, 1.5), V transposed [n_kv, dv] = row(.., 23,
// 3)) stored as ty, token t sees cells 0..=34+t (mask -inf after), scale
// 1/sqrt(dk): kq = mul_mat(k, q), soft_max_ext, kqv = mul_mat(v, kq).
static void attn(enum ggml_type ty, int dk, int dv, int n_head, int n_tokens) {
    const int n_kv = 64;
    struct ggml_init_params ip = { 16 * 1024 * 1024, NULL, false };
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, dk, n_head, n_tokens);
    row(dk * n_head * n_tokens, 21, 2.0f, q->data);
    float kf[64 * 64], vf[64 * 64];
    row(dk * n_kv, 22, 1.5f, kf);
    row(n_kv * dv, 23, 3.0f, vf);
    struct ggml_tensor *k = ggml_new_tensor_3d(ctx, ty, dk, 1, n_kv);
    struct ggml_tensor *v = ggml_new_tensor_3d(ctx, ty, n_kv, dv, 1);
    if (ty == GGML_TYPE_F32) {
        memcpy(k->data, kf, dk * n_kv * 4);
        memcpy(v->data, vf, n_kv * dv * 4);
    } else {
        ggml_fp32_to_fp16_row(kf, k->data, dk * n_kv);
        ggml_fp32_to_fp16_row(vf, v->data, n_kv * dv);
    }
    struct ggml_tensor *mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_kv, n_tokens);
    for (int t = 0; t < n_tokens; t++)
        for (int j = 0; j < n_kv; j++)
            ((float *)mask->data)[t * n_kv + j] = j <= 34 + t ? 0.0f : -INFINITY;
    struct ggml_tensor *qp = ggml_permute(ctx, q, 0, 2, 1, 3);
    struct ggml_tensor *kp = ggml_permute(ctx, k, 0, 2, 1, 3);
    struct ggml_tensor *kq = ggml_mul_mat(ctx, kp, qp);
    ggml_prec_set_acc(kq, GGML_PREC_F32);
    kq = ggml_soft_max_ext(ctx, kq, mask, 1.0f / sqrtf((float)dk), 0.0f);
    struct ggml_tensor *kqv = ggml_mul_mat(ctx, v, kq);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, kqv);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    printf("attention %s dk=%d dv=%d n_head=%d n_tokens=%d", ggml_type_name(ty), dk, dv, n_head, n_tokens);
    pr("", kqv->data, dv * n_tokens * n_head);
    ggml_free(ctx);
}

// ggml_norm (LayerNorm, no weight) of row(77, 31, 4) + 1.5 with eps 0 and
// 1e-5; the Hadamard mul_mat (ggml_mul_mat_set_hint) of 2 rows of 128
// (row(256, 32, 2)); the lightning indexer of 2 heads of 64 (q =
// row(128, 33, 1)) over 5 F16 keys (row(320, 34, 1)), weights row(2, 35,
// 0.3), the fourth key masked.
static void indexer_ops(void) {
    struct ggml_init_params ip = { 16 * 1024 * 1024, NULL, false };
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 77);
    row(77, 31, 4.0f, x->data);
    for (int i = 0; i < 77; i++) ((float *)x->data)[i] += 1.5f;
    struct ggml_tensor *n0 = ggml_norm(ctx, x, 0.0f);
    struct ggml_tensor *n1 = ggml_norm(ctx, x, 1e-5f);
    struct ggml_tensor *h = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 128, 128);
    for (int i = 0; i < 128; i++)
        for (int j = 0; j < 128; j++)
            ((float *)h->data)[i * 128 + j] = (__builtin_popcount(i & j) & 1) ? -1.0f : 1.0f;
    struct ggml_tensor *hx = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 128, 2);
    row(256, 32, 2.0f, hx->data);
    struct ggml_tensor *ht = ggml_mul_mat(ctx, h, hx);
    ggml_mul_mat_set_hint(ht, GGML_HINT_SRC0_IS_HADAMARD);
    struct ggml_tensor *q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 64, 2, 1, 1);
    row(128, 33, 1.0f, q->data);
    float kf[320];
    row(320, 34, 1.0f, kf);
    struct ggml_tensor *k = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 64, 1, 5, 1);
    ggml_fp32_to_fp16_row(kf, k->data, 320);
    struct ggml_tensor *w = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 2, 1, 1, 1);
    row(2, 35, 0.3f, w->data);
    struct ggml_tensor *m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, 5, 1, 1, 1);
    for (int i = 0; i < 5; i++) ((ggml_fp16_t *)m->data)[i] = ggml_fp32_to_fp16(i == 3 ? -INFINITY : 0.0f);
    struct ggml_tensor *li = ggml_lightning_indexer(ctx, q, k, w, m);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    struct ggml_tensor *outs[] = { n0, n1, ht, li };
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) ggml_build_forward_expand(gf, outs[i]);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    pr("norm eps 0", n0->data, 77);
    pr("norm eps 1e-5", n1->data, 77);
    pr("hadamard", ht->data, 256);
    pr("lightning indexer", li->data, 5);
    ggml_free(ctx);
}

int main(void) {
    ggml_cpu_init();
    volatile float three = 3.0f, seven = 7.0f, twenty_nine = 29.0f;
    dot(GGML_TYPE_F32, 0.1f * three, 0.1f * twenty_nine, 0);
    dot(GGML_TYPE_F16, 0.1f * three, 0.1f * twenty_nine, 0);
    dot(GGML_TYPE_BF16, 0.1f * three, 0.1f * twenty_nine, 0);
    dot(GGML_TYPE_Q8_0, 0.3f, 1.1f, 1);
    dot(GGML_TYPE_Q4_0, 0.3f, 1.1f, 1);
    dot(GGML_TYPE_Q8_0, 0.3f, 0.1f * seven, 0);
    dot(GGML_TYPE_Q4_0, 0.3f, 0.1f * seven, 0);
    // Longer rows and leftovers of every length after the whole 32s.
    dot_rows(GGML_TYPE_F32, 512, 1);
    dot_rows(GGML_TYPE_F32, 192, 2);
    dot_rows(GGML_TYPE_F32, 11, 3);
    dot_rows(GGML_TYPE_F32, 77, 4);
    for (int n = 32; n < 64; n++) dot_rows(GGML_TYPE_F32, n, 1000 + n);
    dot_rows(GGML_TYPE_BF16, 512, 5);
    dot_rows(GGML_TYPE_BF16, 77, 6);
    dot_rows(GGML_TYPE_BF16, 512, 14);
    // ggml_v_expf: ggml_vec_soft_max_f32 of one whole 8 with max 0.
    float ex[8] = { 0.0f, -1.0f, -0.5f, -10.3f, -87.0f, -90.5f, -100.25f, 1.7f }, ey[8];
    ggml_vec_soft_max_f32(8, ey, ex, 0.0f);
    pr("ggml_v_expf", ey, 8);
    pr("glibc expf", (float[8]){ expf(ex[0]), expf(ex[1]), expf(ex[2]), expf(ex[3]),
                                 expf(ex[4]), expf(ex[5]), expf(ex[6]), expf(ex[7]) }, 8);

    struct ggml_init_params ip = { 16 * 1024 * 1024, NULL, false };
    struct ggml_context *ctx = ggml_init(ip);
    // mul_mat of a 4 x 48 F32 weight by 2 tokens: llamafile's tinyBLAS.
    struct ggml_tensor *a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 48, 4); fill(a, 0.3f, 1.0f);
    struct ggml_tensor *b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 48, 2); fill(b, 1.1f, 2.5f);
    struct ggml_tensor *mm = ggml_mul_mat(ctx, a, b);
    // unary ops over 20 values in [-12, 12] (two whole 8s and 4 leftovers).
    struct ggml_tensor *u = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 20);
    for (int i = 0; i < 20; i++) ((float *)u->data)[i] = -12.0f + 1.25f * (float)i + 0.0625f;
    struct ggml_tensor *g = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 20); fill(g, 0.7f, 1.0f);
    struct ggml_tensor *si = ggml_silu(ctx, u);
    struct ggml_tensor *sw = ggml_swiglu_split(ctx, u, g);
    struct ggml_tensor *sg = ggml_sigmoid(ctx, u);
    // soft_max_ext of 16 scores (scale 0.125), and of 20 over [-150, 11.5].
    struct ggml_tensor *sc = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 16); fill(sc, 0.2f, 20.0f);
    struct ggml_tensor *sm = ggml_soft_max_ext(ctx, sc, NULL, 0.125f, 0.0f);
    struct ggml_tensor *sc2 = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 20);
    for (int i = 0; i < 20; i++) ((float *)sc2->data)[i] = -150.0f + 8.5f * (float)i;
    struct ggml_tensor *sm2 = ggml_soft_max_ext(ctx, sc2, NULL, 1.0f, 0.0f);
    // soft_max_ext of 11 scores row(11, 9, 900) with scale 1/sqrt(192) and
    // an F32 mask dropping the sixth.
    struct ggml_tensor *sc3 = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 11);
    row(11, 9, 900.0f, sc3->data);
    struct ggml_tensor *mk = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 11);
    for (int i = 0; i < 11; i++) ((float *)mk->data)[i] = i == 5 ? -INFINITY : 0.0f;
    struct ggml_tensor *sm3 = ggml_soft_max_ext(ctx, sc3, mk, 1.0f / sqrtf(192.0f), 0.0f);
    // RoPE, normal mode, 2 heads of 8 at position 29, base 10000.
    struct ggml_tensor *rx = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 8, 2, 1); fill(rx, 0.9f, 1.0f);
    struct ggml_tensor *pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1); ((int *)pos->data)[0] = 29;
    struct ggml_tensor *ro = ggml_rope_ext(ctx, rx, pos, NULL, 8, 0, 4096, 10000.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    struct ggml_tensor *outs[] = { mm, si, sw, sg, sm, sm2, sm3, ro };
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) ggml_build_forward_expand(gf, outs[i]);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    pr("mul_mat tinyblas", mm->data, 8);
    pr("silu", si->data, 20);
    pr("swiglu", sw->data, 20);
    pr("sigmoid", sg->data, 20);
    pr("soft_max", sm->data, 16);
    pr("soft_max wide", sm2->data, 20);
    pr("soft_max masked", sm3->data, 11);
    pr("rope", ro->data, 16);
    ggml_free(ctx);
    attn(GGML_TYPE_F16, 40, 32, 2, 1);
    attn(GGML_TYPE_F16, 40, 32, 2, 3);
    attn(GGML_TYPE_F32, 40, 32, 1, 3);
    attn(GGML_TYPE_F32, 40, 32, 2, 3);
    indexer_ops();
    return 0;
}
