// Test vectors for families/ops/src/ggml_f32.rs: calls the oracle's own
// libggml-cpu.so (tools/oracle/build_llama.sh: llama-cpp-python 0.3.36's
// vendored ggml, GGML_NATIVE on an AVX2+FMA machine) on the rows the Rust
// tests generate, and prints the result bits the tests compare with.
//
//   gcc -O0 -ffp-contract=off tools/oracle/ggml_f32_vectors.c \
//       -L$BIN -lggml-cpu -lggml-base -lm -Wl,-rpath,$BIN -o ggml_f32_vectors
//
// -ffp-contract=off keeps this file's own arithmetic (the row generator, the
// softmax's scale and mask) as unfused as the Rust test's.
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
typedef double ggml_float;
void ggml_vec_dot_f32(int n, float *s, size_t bs, const float *x, size_t bx, const float *y, size_t by, int nrc);
typedef uint16_t bf16;
void ggml_vec_dot_bf16(int n, float *s, size_t bs, bf16 *x, size_t bx, bf16 *y, size_t by, int nrc);
static bf16 tobf(float f){uint32_t u; memcpy(&u,&f,4); return (u + (0x7fff + ((u >> 16) & 1))) >> 16;}
ggml_float ggml_vec_soft_max_f32(const int n, float *y, const float *x, float max);
static void row(int n, uint32_t seed, float scale, float *out) {
    uint32_t s = seed;
    for (int i = 0; i < n; i++) { s = s*1664525u + 1013904223u; out[i] = ((float)(s >> 8) / 16777216.0f * 2.0f - 1.0f) * scale; }
}
static uint32_t bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
int main(void) {
    float x[512], y[512];
    int ns[] = {512, 192, 11, 77}; uint32_t seeds[] = {1, 2, 3, 4};
    for (int t = 0; t < 4; t++) {
        row(ns[t], seeds[t], 30.0f, x); row(ns[t], seeds[t] + 100, 3.0f, y);
        float s; ggml_vec_dot_f32(ns[t], &s, 0, x, 0, y, 0, 1);
        printf("dot n %d seed %u: 0x%08X (%g)\n", ns[t], seeds[t], bits(s), s);
    }
    float ex[8] = {0.0f, -1.0f, -0.5f, -10.3f, -87.0f, -90.5f, -100.25f, 1.7f}; float ey[8];
    ggml_vec_soft_max_f32(8, ey, ex, 0.0f);
    for (int i = 0; i < 8; i++) printf("expf(%g) = 0x%08X (%g) glibc 0x%08X\n", ex[i], bits(ey[i]), ey[i], bits(expf(ex[i])));
    float w[11], m[11] = {0}; m[5] = -INFINITY; float out[11];
    row(11, 9, 900.0f, x);
    float scale = 1.0f / sqrtf(192.0f);
    for (int i = 0; i < 11; i++) { w[i] = x[i]*scale; w[i] += 1.0f*m[i]; }
    float mx = -INFINITY; for (int i = 0; i < 11; i++) mx = mx > w[i] ? mx : w[i];
    ggml_float sum = ggml_vec_soft_max_f32(11, out, w, mx);
    sum = 1.0/sum; float v = sum;
    printf("softmax:");
    for (int i = 0; i < 11; i++) { out[i] *= v; printf(" 0x%08X,", bits(out[i])); }
    printf("\n");
    { int ns2[] = {512, 77, 512}; uint32_t sd[] = {5, 6, 14}; bf16 bx[512], by[512];
      for (int t = 0; t < 3; t++) { row(ns2[t], sd[t], 30.0f, x); row(ns2[t], sd[t]+100, 3.0f, y);
        for (int i = 0; i < ns2[t]; i++) { bx[i] = tobf(x[i]); by[i] = tobf(y[i]); }
        float s; ggml_vec_dot_bf16(ns2[t], &s, 0, bx, 0, by, 0, 1); printf("bf16 dot n %d: 0x%08X (%g)\n", ns2[t], bits(s), s); } }
    return 0;
}
