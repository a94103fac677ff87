// The arithmetic of ops.cu's kernels that follow ggml's f32 steps, on the
// host (run.sh builds it; no GPU needed), against the bits llama.cpp's CPU
// build gives (the expected values of family-ops' own tests, which come
// from tools/oracle/ggml_kernel_refs.c and ggml_hybrid_refs.c):
// - ggml_expf at family-ops' `expf_is_ggml_v_expf` points;
// - libm_expf and libm_logf, with device-ops' lists of glibc's misrounded
//   arguments, against glibc's expf and logf (check_libm_rounding);
// - ggml_dot_f32 / ggml_dot_f16 over 80 elements (two steps of 32 and
//   16 leftovers; `float_dots_are_ggmls_vec_dot`);
// - the block softmax (ggml_exp_sum, ggml_soft_max_rest; one thread a
//   block here) on `soft_max_is_ggmls_soft_max_ext`'s row;
// - the attention template over an F16 cache (one query token, heads of
//   40: the dots' leftovers) on `cached_attention_is_ggmls_for_f16_...`'s
//   one-token case (a block is one thread here, its reductions trivial);
// - imrope_f32 on `imrope_is_ggmls`' rows with glibc's cosf, sinf and
//   powf in place of the device's correctly rounded ones (libm_cosf,
//   libm_sinf, libm_powf), which glibc's round within a hair of a tie: with
//   the device's, an output here and there moves by an ulp, counted.
#include <algorithm>
#include <cmath>
using std::isinf;
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
using std::min;
typedef long long i64;
typedef unsigned int u32;
#define __device__
#define __forceinline__ inline
#define __noinline__
#define __global__
#define __shared__ static
struct dim3h { unsigned x, y, z; };
static dim3h threadIdx{0, 0, 0}, blockIdx{0, 0, 0}, gridDim{1, 1, 1}, blockDim{1, 1, 1};
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __uint_as_float(u32 u) { float f; memcpy(&f, &u, 4); return f; }
static inline u32 __float_as_uint(float f) { u32 u; memcpy(&u, &f, 4); return u; }
static inline void __syncthreads() {}
static inline double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
template <class V> static inline V __shfl_xor_sync(unsigned, V v, int) { return v; }
typedef unsigned short u16;
#define NEG_INF (__int_as_float(0xff800000))
// The PTX half conversions: round to nearest even, widen exactly.
static inline float h2f(u16 h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
static inline u16 f2h(float x) { _Float16 f = (_Float16)x; u16 h; memcpy(&h, &f, 2); return h; }
namespace device {
#include "ggml.inc"
#include "rope.inc"
#include "attention.inc"
}
namespace glibc {
static inline float libm_cosf(float x) { return ::cosf(x); }
static inline float libm_sinf(float x) { return ::sinf(x); }
static inline float libm_powf(float x, float y) { return ::powf(x, y); }
#include "rope.inc"
}

static int fails = 0;
static u32 bits(float f) { return __float_as_uint(f); }
static void expect(const char* what, u32 got, u32 want) {
    if (got != want) {
        printf("FAIL %s: %08x, llama.cpp's %08x\n", what, got, want);
        ++fails;
    }
}

// device-ops' data/libm_rounding/NAME.bin: each argument's gap from the one
// before, LEB128.
static std::vector<u32> misrounded_list(const char* dir, const char* name) {
    std::string path = std::string(dir) + "/" + name + ".bin";
    FILE* f = fopen(path.c_str(), "rb");
    std::vector<u32> out;
    if (!f) return out;
    u32 at = 0, gap = 0, shift = 0;
    for (int c; (c = fgetc(f)) != EOF;) {
        gap |= (u32)(c & 0x7f) << shift;
        shift += 7;
        if (!(c & 0x80)) {
            at += gap;
            out.push_back(at);
            gap = shift = 0;
        }
    }
    fclose(f);
    return out;
}

// The device's libm_expf and libm_logf, given the lists and windows
// CudaOps::new uploads (LIBM_ROUNDING_DIR, LIBM_TIE_WINDOWS from the test),
// against glibc's: every listed argument and its two neighbours, and every
// 1021st bit pattern. Returns the arguments checked.
static long check_libm_rounding() {
    const char* dir = getenv("LIBM_ROUNDING_DIR");
    const char* windows = getenv("LIBM_TIE_WINDOWS");
    double w[2];
    if (!dir || !windows || sscanf(windows, "%lf %lf", &w[0], &w[1]) != 2) {
        printf("FAIL libm rounding: LIBM_ROUNDING_DIR and LIBM_TIE_WINDOWS unset\n");
        ++fails;
        return 0;
    }
    std::vector<u32> lists[2] = {misrounded_list(dir, "expf"), misrounded_list(dir, "logf")};
    for (int f = 0; f < 2; ++f) {
        device::libm_misrounded[f] = lists[f].data();
        device::libm_misrounded_len[f] = (int)lists[f].size();
        device::libm_tie_window[f] = w[f];
    }
    long checked = 0, wrong[2] = {0, 0};
    auto check = [&](u32 b) {
        float x = __uint_as_float(b);
        if (!std::isfinite(x)) return;
        float want[2] = {::expf(x), ::logf(x)};
        float got[2] = {device::libm_expf(x), device::libm_logf(x)};
        for (int f = 0; f < 2; ++f) {
            if (std::isnan(want[f])) continue;
            ++checked;
            if (bits(got[f]) != bits(want[f]) && wrong[f]++ < 3)
                printf("FAIL libm_%s(%a): %08x, glibc's %08x\n", f ? "logf" : "expf", x, bits(got[f]),
                       bits(want[f]));
        }
    };
    for (int f = 0; f < 2; ++f)
        for (u32 b : lists[f]) {
            check(b - 1);
            check(b);
            check(b + 1);
        }
    for (u32 b = 0; b < 0xffffffffu - 1021; b += 1021) check(b);
    if (lists[0].empty() || lists[1].empty() || wrong[0] || wrong[1]) {
        printf("FAIL libm rounding: lists of %zu and %zu, %ld and %ld arguments off glibc's\n",
               lists[0].size(), lists[1].size(), wrong[0], wrong[1]);
        ++fails;
    }
    return checked;
}

// family-ops' refs.rs `row` and `fnv`, and ggml_cpu.rs' test `input`.
static std::vector<float> row(int n, uint32_t seed, float scale) {
    std::vector<float> v(n);
    for (auto& x : v) {
        seed = seed * 1664525u + 1013904223u;
        x = ((float)(seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f) * scale;
    }
    return v;
}
static uint64_t fnv(const std::vector<float>& v) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (float f : v) {
        u32 b = bits(f);
        for (int k = 0; k < 4; ++k) h = (h ^ ((b >> (8 * k)) & 0xff)) * 0x100000001b3ull;
    }
    return h;
}
static float input(int i, float s) {
    float a = 0.37f * (float)i + s;
    float m = 1.0f + 0.05f * (float)(i % 7);
    return sinf(a) * m;
}
static float as_f16(float x) { return (float)(_Float16)x; }

int main() {
    const struct { float x; u32 want; } exps[] = {
        {0.0f, 0x3f800000}, {-1.0f, 0x3ebc5ab2}, {-0.5f, 0x3f1b4597}, {-10.3f, 0x380d1140},
        {-87.0f, 0x00b33686}, {-90.5f, 0x00056969}, {-100.25f, 0x00000015}, {1.7f, 0x40af2a95},
        {-200.0f, 0x00000000}};
    for (auto e : exps) expect("ggml_expf", bits(device::ggml_expf(e.x)), e.want);

    std::vector<float> x(80), y(80), xh(80), yh(80);
    for (int i = 0; i < 80; ++i) {
        x[i] = input(i, 0.1f * 3.0f);
        y[i] = input(i, 0.1f * 29.0f) * 2.5f;
        xh[i] = as_f16(x[i]);
        yh[i] = as_f16(y[i]);
    }
    auto at = [](const std::vector<float>& v) { return [&v](int i) { return v[i]; }; };
    expect("ggml_dot_f32", bits(device::ggml_dot_f32(at(x), at(y), 80)), 0xc2dee6b1);
    expect("ggml_dot_f16", bits(device::ggml_dot_f16(at(xh), at(yh), 80)), 0xc2dee420);

    std::vector<float> sm(16);
    float mx = -INFINITY;
    for (int i = 0; i < 16; ++i) {
        sm[i] = __fmul_rn(input(i, 0.2f) * 20.0f, 0.125f);
        mx = std::max(mx, sm[i]);
    }
    device::ggml_soft_max_rest(sm.data(), 16, mx);
    const u32 sm_want[16] = {0x3ca8d7ea, 0x3d53cf1d, 0x3decb2eb, 0x3e4e91df, 0x3e7d6786, 0x3e4d9600,
                             0x3ddbd6a0, 0x3cf30db0, 0x3c43ce8e, 0x3b910e96, 0x3ae397cf, 0x3a5a82fd,
                             0x3a11a6d8, 0x3a1311c6, 0x3ae6d16f, 0x3b587b61};
    for (int i = 0; i < 16; ++i) expect("ggml softmax", bits(sm[i]), sm_want[i]);

    // One token of 2 heads of 40 over an F16 cache of 64 cells, the first
    // 35 filled (one K/V head, values of 32; V stored transposed there).
    {
        const int dk = 40, dv = 32, n_ctx = 64, n_kv = 35, n_head = 2;
        std::vector<float> q = row(dk * n_head, 21, 2.0f), k = row(dk * n_ctx, 22, 1.5f),
                           vt = row(n_ctx * dv, 23, 3.0f), out(n_head * dv);
        std::vector<u16> kc(dk * n_ctx), vc(n_ctx * dv);
        for (int i = 0; i < dk * n_ctx; ++i) kc[i] = f2h(k[i]);
        for (int i = 0; i < n_ctx * dv; ++i) vc[i] = f2h(vt[(i % dv) * n_ctx + i / dv]);
        std::vector<double> scratch(64);
        device::attention<u16>(q.data(), kc.data(), vc.data(), nullptr, out.data(), scratch.data(),
                               n_head, 1, dk, dv, n_kv, 1, 1, 0, 0, 0, 1.0f / sqrtf((float)dk), 0.0f,
                               0, 0);
        expect("attention_f16 first value", bits(out[0]), 0xbe26600f);
        if (fnv(out) != 0xebda5c04016335ffull) {
            printf("FAIL attention_f16: bits %016llx, llama.cpp's ebda5c04016335ff\n",
                   (unsigned long long)fnv(out));
            ++fails;
        }
    }

    // A ubatch of 3 tokens of 2 heads over the same cache, token t seeing
    // its first 35 + t cells (causal from position 34): tinyBLAS's sums for
    // the scores and the output, as ggml's mul_mat takes a ubatch's
    // (family-ops' batched case of the same test, llama.cpp's bits; ggml
    // lays the output out [head][token][dv]).
    {
        const int dk = 40, dv = 32, n_ctx = 64, n_head = 2, n_tok = 3, n_kv = 37;
        std::vector<float> q = row(dk * n_head * n_tok, 21, 2.0f), k = row(dk * n_ctx, 22, 1.5f),
                           vt = row(n_ctx * dv, 23, 3.0f), out(n_tok * n_head * dv), ggml(out.size());
        std::vector<u16> kc(dk * n_ctx), vc(n_ctx * dv);
        for (int i = 0; i < dk * n_ctx; ++i) kc[i] = f2h(k[i]);
        for (int i = 0; i < n_ctx * dv; ++i) vc[i] = f2h(vt[(i % dv) * n_ctx + i / dv]);
        std::vector<double> scratch(64);
        device::attention<u16>(q.data(), kc.data(), vc.data(), nullptr, out.data(), scratch.data(),
                               n_head, 1, dk, dv, n_kv, n_tok, 1, 1, 34, 0, 1.0f / sqrtf((float)dk),
                               0.0f, 1, 1);
        for (int t = 0; t < n_tok; ++t)
            for (int h = 0; h < n_head; ++h)
                for (int c = 0; c < dv; ++c) ggml[(h * n_tok + t) * dv + c] = out[(t * n_head + h) * dv + c];
        expect("attention_f16 ubatch first value", bits(ggml[0]), 0xbe266010);
        if (fnv(ggml) != 0x3a4159c3afebd3d3ull) {
            printf("FAIL attention_f16 ubatch: bits %016llx, llama.cpp's 3a4159c3afebd3d3\n",
                   (unsigned long long)fnv(ggml));
            ++fails;
        }
    }

    // Two tokens of 2 heads of 32, all 32 dims rotated, sections [8; 4].
    std::vector<float> r = row(128, 19, 1.0f), g(128), d(128);
    int pos[8] = {29, 29, 29, 0, 5, 7, 11, 3};
    glibc::imrope_f32(r.data(), pos, g.data(), 2, 64, 32, 32, 10000.0f, 8, 8, 8, 8);
    device::imrope_f32(r.data(), pos, d.data(), 2, 64, 32, 32, 10000.0f, 8, 8, 8, 8);
    uint64_t got = fnv(g), want = 0xf0106b19a7b1634full;
    if (got != want) {
        printf("FAIL imrope_f32: bits %016llx, llama.cpp's %016llx\n", (unsigned long long)got,
               (unsigned long long)want);
        ++fails;
    }
    int moved = 0, far = 0;
    for (int i = 0; i < 128; ++i) {
        float e = std::fabs(g[i] - d[i]);
        moved += e != 0.0f;
        far += e > std::fabs(g[i]) * 2.4e-7f;
    }
    if (far) {
        printf("FAIL imrope_f32: %d outputs past an ulp of glibc's with the device's libm\n", far);
        ++fails;
    }
    long libm_checked = check_libm_rounding();
    if (fails) return 1;
    printf("libm_expf, libm_logf: glibc's bits at %ld arguments\n", libm_checked);
    printf("ggml_steps: ggml_expf, the f32/f16 dots, the softmax and F16 attention (one token, a ubatch) are llama.cpp's bits\n");
    printf("imrope_f32: the oracle's bits with glibc's libm; %d of 128 outputs an ulp off with the device's\n",
           moved);
    return 0;
}
