// The values the tests of `families/ops/src/ggml_cpu/{gdn,hyper,mrope,
// unary}.rs` hold: what the oracle's libggml (llama-cpp-python 0.3.36,
// -march=native on an AVX2 + FMA + F16C machine without AVX512) computes
// for the ops of the hybrid architectures (qwen4exp's graph,
// src/models/qwen4exp.cpp): the Gated DeltaNet's short conv, L2 norm and
// recurrence, the hyper-connections' fused pre and post, IMROPE, RMSNorm
// times a weight, softplus, silu over a row, sum_rows. Each op runs as a
// one-thread CPU graph; outputs are printed as FNV-1a hashes of their f32
// bits (`refs::fnv`) and, for short ones, the bits. Inputs are row(n, seed,
// scale) (ggml_kernel_refs.c's LCG).
//
//   LC=.../vendor/llama.cpp BIN=/tmp/lcp/build/bin
//   gcc -O1 -ffp-contract=off -I$LC/ggml/include ggml_hybrid_refs.c
//       -L$BIN -lggml -lggml-base -lggml-cpu -lm -Wl,-rpath,$BIN -o ggml_hybrid_refs
//   (one command)
#include "ggml.h"
#include "ggml-cpu.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static void row(int n, uint32_t seed, float scale, float *out) {
    uint32_t s = seed;
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        out[i] = ((float)(s >> 8) / 16777216.0f * 2.0f - 1.0f) * scale;
    }
}

static uint64_t fnv(const float *v, int n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        for (int b = 0; b < 4; b++) {
            h ^= (u >> (8 * b)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

static void out(const char *name, struct ggml_tensor *t, int n_print) {
    const float *v = t->data;
    int n = (int) ggml_nelements(t);
    printf("%s: n=%d fnv=0x%016llx", name, n, (unsigned long long) fnv(v, n));
    for (int i = 0; i < n_print && i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        printf(" 0x%08x,", u);
    }
    printf("\n");
}

static struct ggml_tensor *rows(struct ggml_context *c, int64_t n0, int64_t n1, int64_t n2, int64_t n3,
                                uint32_t seed, float scale) {
    struct ggml_tensor *t = ggml_new_tensor_4d(c, GGML_TYPE_F32, n0, n1, n2, n3);
    row((int) ggml_nelements(t), seed, scale, t->data);
    return t;
}

int main(void) {
    ggml_cpu_init();
    struct ggml_init_params ip = { 64 * 1024 * 1024, NULL, false };
    struct ggml_context *c = ggml_init(ip);

    // RMSNorm of 2 rows of 256 (eps 1e-6) times a weight of 256 (the fused
    // rms_norm + mul).
    struct ggml_tensor *nx = rows(c, 256, 2, 1, 1, 1, 3.0f);
    struct ggml_tensor *nw = rows(c, 256, 1, 1, 1, 2, 1.5f);
    struct ggml_tensor *norm = ggml_mul(c, ggml_rms_norm(c, nx, 1e-6f), nw);

    // The GDN L2 norm of 3 heads of 128 (eps 1e-6): build_gdn_l2_norm.
    struct ggml_tensor *lx = rows(c, 128, 3, 1, 1, 3, 2.0f);
    const float ln = 128.0f;
    struct ggml_tensor *l2 = ggml_scale(c, ggml_rms_norm(c, lx, 1e-6f / ln), 1.0f / sqrtf(ln));

    // ssm_conv of 40 channels, kernel 4, over 3 tokens after a state of 3.
    struct ggml_tensor *sx = rows(c, 3 + 3, 40, 1, 1, 4, 2.0f);
    struct ggml_tensor *sk = rows(c, 4, 40, 1, 1, 5, 0.7f);
    struct ggml_tensor *conv = ggml_ssm_conv(c, sx, sk);

    // silu over rows of 20 (two whole 8s and 4 leftovers), softplus across
    // its cut at 20, sum_rows of 2 rows of 300.
    struct ggml_tensor *ux = rows(c, 20, 2, 1, 1, 6, 9.0f);
    struct ggml_tensor *silu = ggml_silu(c, ux);
    struct ggml_tensor *px = rows(c, 16, 1, 1, 1, 7, 30.0f);
    struct ggml_tensor *softplus = ggml_softplus(c, px);
    struct ggml_tensor *rx = rows(c, 300, 2, 1, 1, 8, 5.0f);
    struct ggml_tensor *sums = ggml_sum_rows(c, rx);

    // gated_delta_net: S 32, 2 K heads, 4 V heads, 3 tokens, one sequence.
    const int S = 32, HK = 2, HV = 4, T = 3;
    struct ggml_tensor *q = ggml_scale(c, ggml_rms_norm(c, rows(c, S, HK, T, 1, 9, 1.0f), 1e-6f), 0.2f);
    struct ggml_tensor *k = ggml_scale(c, ggml_rms_norm(c, rows(c, S, HK, T, 1, 10, 1.0f), 1e-6f), 0.2f);
    struct ggml_tensor *v = rows(c, S, HV, T, 1, 11, 1.5f);
    struct ggml_tensor *g = rows(c, 1, HV, T, 1, 12, 0.5f);
    for (int i = 0; i < HV * T; i++) ((float *) g->data)[i] -= 0.6f;
    struct ggml_tensor *beta = ggml_sigmoid(c, rows(c, 1, HV, T, 1, 13, 2.0f));
    struct ggml_tensor *state = rows(c, S, S, HV, 1, 14, 0.3f);
    struct ggml_tensor *gdn = ggml_gated_delta_net(c, q, k, v, g, beta, state, 1);

    // The fused hyper-connection pre (gated, scale 1/4) and post, 24 x 4
    // streams x 2 tokens.
    struct ggml_tensor *hx = rows(c, 24, 4, 2, 1, 15, 3.0f);
    struct ggml_tensor *hg = rows(c, 24, 4, 2, 1, 16, 4.0f);
    struct ggml_tensor *pre = ggml_dsv4_hc_pre_gated(c, hx, hg, 0.25f);
    struct ggml_tensor *bo = rows(c, 24, 2, 1, 1, 17, 2.0f);
    struct ggml_tensor *post_w = ggml_scale(c, ggml_sigmoid(c, rows(c, 4, 2, 1, 1, 18, 3.0f)), 2.0f);
    struct ggml_tensor *post = ggml_dsv4_hc_post(c, bo, hx, post_w, NULL);

    // IMROPE: 2 heads of 32 (n_rot 32, sections 8,8,8,8, base 10000) at 2
    // tokens: (29, 29, 29, 0) and (5, 7, 11, 3).
    struct ggml_tensor *mx = rows(c, 32, 2, 2, 1, 19, 1.0f);
    struct ggml_tensor *mp = ggml_new_tensor_1d(c, GGML_TYPE_I32, 4 * 2);
    int pos[8] = { 29, 5, 29, 7, 29, 11, 0, 3 };
    memcpy(mp->data, pos, sizeof pos);
    int sections[4] = { 8, 8, 8, 8 };
    struct ggml_tensor *mrope = ggml_rope_multi(c, mx, mp, NULL, 32, sections, GGML_ROPE_TYPE_IMROPE,
                                                4096, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);

    struct ggml_cgraph *gf = ggml_new_graph(c);
    struct ggml_tensor *all[] = { norm, l2, conv, silu, softplus, sums, gdn, pre, post, mrope };
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ggml_build_forward_expand(gf, all[i]);
    ggml_graph_compute_with_ctx(c, gf, 1);

    out("rms_norm mul", norm, 4);
    out("l2 norm", l2, 4);
    out("ssm_conv", conv, 6);
    out("silu", silu, 40);
    out("softplus", softplus, 16);
    out("sum_rows", sums, 2);
    out("gated_delta_net", gdn, 4);
    out("hc_pre_gated", pre, 4);
    out("hc_post", post, 4);
    out("rope_multi imrope", mrope, 4);
    ggml_free(c);
    return 0;
}
