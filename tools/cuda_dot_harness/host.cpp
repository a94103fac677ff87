// Host harness for platforms/cuda/src/ops.cu's products (run.sh builds and
// runs it; no GPU needed): the code up to the gathers, extracted by
// extract.py with the PTX half conversions, dp4a and the warp reductions
// replaced by host versions, on the CPU. For every weight type with float
// products: each row_dot (all 32 lanes) against the per-element deq<T> in
// double, over row and x alignments and activation-row masks; the matmul
// and matmul_id bodies over emulated grids (rows not a multiple of 8, 1..9
// activation rows, repeated and out-of-range expert ids). For the types
// with int8 products instead (ops.rs INT8_KERNELS): row_dot_i8,
// matvec_i8_impl, matmul_i8_impl, matvec_id_i8_impl and matmul_id_i8_impl
// against deq<T> times the int8 codes and their block scales, the same
// way. And TQ1_0/NVFP4's deq, bit for bit, against a port of family-ops'
// dequant.rs.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
using std::isinf;
#include <cstdint>
#include <vector>
#include <random>
#include <algorithm>
using std::min;
typedef unsigned int u32_;
#define __device__
#define __forceinline__ inline
#define __noinline__
#define __global__
#define __constant__ static
#define __shared__ static
#define extern
struct dim3h { unsigned x, y, z; };
static dim3h threadIdx, blockIdx, gridDim, blockDim;
static inline float __uint_as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t __float_as_uint(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline int __popc(uint32_t v) { return __builtin_popcount(v); }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __int2float_rn(int v) { return (float)v; }
static inline void __syncwarp() {}
static inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh) {
    return (uint32_t)((((uint64_t)hi << 32) | lo) >> (sh & 31));
}
static inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    uint64_t v = ((uint64_t)y << 32) | x;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= (uint32_t)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
template <class V> static inline V __shfl_xor_sync(unsigned, V v, int) { return v; }
// Declared for the device-only lane meetings (replaced by host emulations).
template <class V> static inline V __shfl_down_sync(unsigned, V v, int) { return v; }
template <class V> static inline V __shfl_sync(unsigned, V v, int) { return v; }
static inline void __syncthreads() {}
struct float4 { float x, y, z, w; };
struct uint4 { uint32_t x, y, z, w; };
struct uint2 { uint32_t x, y; };
static float h2f(uint16_t h) {
    uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
static uint16_t f2h(float f) { (void)f; return 0; }
unsigned long long iq2xxs_grid[256], iq2xs_grid[512], iq2s_grid[1024], iq1s_grid[2048];
unsigned int iq3xxs_grid[256], iq3s_grid[512];
static inline int dp4a(unsigned a, unsigned b, int c) {
    for (int k = 0; k < 4; ++k) c += (int)(signed char)(a >> (8 * k)) * (int)(signed char)(b >> (8 * k));
    return c;
}
#include "extracted.inc"

static std::mt19937_64 rng(12345);
static float unif(float lo, float hi) { return lo + (hi - lo) * (float)((rng() >> 40) * (1.0 / (1 << 24))); }
static uint16_t f16_of(float v) {  // small positive normal values only
    int e; float m = frexpf(v, &e);  // v = m * 2^e, m in [0.5, 1)
    int he = e - 1 + 15; uint32_t mant = (uint32_t)lrintf((m * 2 - 1) * 1024);
    if (mant == 1024) { mant = 0; he++; }
    return (uint16_t)((he << 10) | mant);
}

struct Ty { int id; const char* name; int be, bb; };
static const Ty TYPES[] = {
    {0, "F32", 1, 4}, {1, "F16", 1, 2}, {30, "BF16", 1, 2}, {2, "Q4_0", 32, 18}, {3, "Q4_1", 32, 20},
    {6, "Q5_0", 32, 22}, {7, "Q5_1", 32, 24}, {8, "Q8_0", 32, 34}, {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110}, {12, "Q4_K", 256, 144}, {13, "Q5_K", 256, 176}, {14, "Q6_K", 256, 210},
    {20, "IQ4_NL", 32, 18}, {23, "IQ4_XS", 256, 136}, {35, "TQ2_0", 256, 66}, {39, "MXFP4", 32, 17},
    {16, "IQ2_XXS", 256, 66}, {17, "IQ2_XS", 256, 74}, {22, "IQ2_S", 256, 82}, {18, "IQ3_XXS", 256, 98},
    {21, "IQ3_S", 256, 110}, {19, "IQ1_S", 256, 50}, {29, "IQ1_M", 256, 56},
    {34, "TQ1_0", 256, 54}, {40, "NVFP4", 64, 36},
};

static void random_row(const Ty& t, int ne0, uint8_t* out) {
    int nblk = ne0 / t.be, bytes = nblk * t.bb;
    if (t.id == 0) { for (int i = 0; i < ne0; ++i) { float v = unif(-1, 1); memcpy(out + 4 * i, &v, 4); } return; }
    if (t.id == 1) { for (int i = 0; i < ne0; ++i) { float v = unif(-1, 1); uint16_t h = f16_of(fabsf(v) + 1e-3f) | (v < 0 ? 0x8000 : 0); memcpy(out + 2 * i, &h, 2); } return; }
    if (t.id == 30) { for (int i = 0; i < ne0; ++i) { float v = unif(-1, 1); uint32_t u = __float_as_uint(v); uint16_t h = u >> 16; memcpy(out + 2 * i, &h, 2); } return; }
    for (int i = 0; i < bytes; ++i) out[i] = (uint8_t)rng();
    for (int k = 0; k < nblk; ++k) {
        uint8_t* b = out + k * t.bb;
        std::vector<int> f;
        switch (t.id) {
            case 2: case 6: case 8: case 20: case 23: case 16: case 17: case 22: case 18: case 21: case 19: f = {0}; break;
            case 3: case 7: case 12: case 13: f = {0, 2}; break;
            case 10: f = {80, 82}; break;
            case 11: f = {108}; break;
            case 14: f = {208}; break;
            case 35: f = {64}; break;
            case 34: f = {52}; break;
        }
        for (int o : f) { uint16_t h = f16_of(unif(0.002f, 0.03f)); memcpy(b + o, &h, 2); }
        if (t.id == 29) {
            uint16_t d = f16_of(unif(0.002f, 0.03f));
            for (int q = 0; q < 4; ++q) { uint16_t w; memcpy(&w, b + 48 + 2 * q, 2); w = (w & 0x0fff) | (((d >> (4 * q)) & 0xf) << 12); memcpy(b + 48 + 2 * q, &w, 2); }
        }
        if (t.id == 39) b[0] = 120 + rng() % 6;
    }
}

static int fails = 0;

template <int T>
static double ref_dot(const uint8_t* row, int ne0, const float* x, double* mag) {
    double s = 0, m = 0;
    for (int i = 0; i < ne0; ++i) { double p = (double)deq<T>(row, i) * x[i]; s += p; m += fabs(p); }
    *mag = m;
    return s;
}

static bool close(double got, double want, double mag) {
    return fabs(got - want) <= 2e-6 * mag + 1e-30 && std::isfinite(got);
}

// row_dot over emulated lanes vs the reference, every alignment.
template <int T>
static void test_dots(const Ty& t) {
    std::vector<int> ne0s;
    if (t.be == 1) ne0s = {1, 3, 4, 8, 37, 100, 512, 2048};
    else for (int nb : {1, 2, 3, 16, 33, 64}) if ((long)nb * t.be <= 16384) ne0s.push_back(nb * t.be);
    double worst = 0;
    int cases = 0;
    for (int ne0 : ne0s) for (int wo = 0; wo < 4; ++wo) for (int xo = 0; xo < 2; ++xo) for (int nb : {1, 4}) {
        if (t.be == 1 && wo % t.bb) continue;  // F types: element-aligned rows
        int rb = ne0 / t.be * t.bb;
        std::vector<uint8_t> buf(rb + 64);
        uint8_t* row = buf.data() + wo;
        random_row(t, ne0, row);
        std::vector<float> xbuf(4 * ne0 + 8);
        float* x = xbuf.data() + 4 + xo;  // xo = 1: not 16-byte aligned
        for (int i = 0; i < 4 * ne0; ++i) x[i] = unif(-2, 2);
        bool xa = x_aligned(x, ne0);
        const float* xr[4] = {x, x + ne0, x + 2 * ne0, x + 3 * ne0};
        u32 live = nb == 1 ? 1u : 0xbu;  // rows 0, 1, 3
        float acc[4] = {0, 0, 0, 0};
        for (int lane = 0; lane < 32; ++lane) {
            if (nb == 1) row_dot<T, 1>(row, ne0, xr, live, xa, lane, 32, acc);
            else row_dot<T, 4>(row, ne0, xr, live, xa, lane, 32, acc);
        }
        for (int j = 0; j < nb; ++j) {
            ++cases;
            if (!((live >> j) & 1)) {
                if (acc[j] != 0.0f) { printf("FAIL %s: row %d not live but written\n", t.name, j); ++fails; }
                continue;
            }
            double mag, want = ref_dot<T>(row, ne0, xr[j], &mag);
            double e = fabs(acc[j] - want) / (mag + 1e-30);
            worst = std::max(worst, e);
            if (!close(acc[j], want, mag)) {
                if (fails < 40) printf("FAIL %s ne0 %d wo %d xa %d nb %d j %d: got %.9g want %.9g (mag %.3g)\n", t.name, ne0, wo, (int)xa, nb, j, acc[j], want, mag);
                ++fails;
            }
        }
    }
    printf("%-8s dots: %4d cases, worst |err|/sum|w x| %.2e\n", t.name, cases, worst);
}

// The kernels' bodies over an emulated grid vs the reference.
template <int T>
static void test_kernels(const Ty& t) {
    int ne0 = t.be == 1 ? 96 : (t.be == 32 ? 128 : 512);
    int rows = 19, n_expert = 3;
    int rb = ne0 / t.be * t.bb;
    std::vector<uint8_t> w(rb * rows * n_expert + 8);
    for (int r = 0; r < rows * n_expert; ++r) random_row(t, ne0, w.data() + r * rb);
    int checked = 0;
    // A warp a row (gridDim.x = ceil(rows / 8)), then a block a row
    // (gridDim.x = rows: its 8 warps share each row).
    for (int split : {0, 1}) for (int n : {1, 2, 3, 4, 5, 7, 9}) for (int gy : {1, 2, 3}) {
        unsigned gx = split ? (unsigned)rows : (unsigned)((rows + 7) / 8);
        std::vector<float> x(n * ne0);
        for (auto& v : x) v = unif(-2, 2);
        std::vector<float> y(n * rows, -777.0f);
        gridDim = {gx, (unsigned)gy, 1};
        for (unsigned bx = 0; bx < gridDim.x; ++bx) for (unsigned by = 0; by < gridDim.y; ++by) for (unsigned wp = 0; wp < 8; ++wp) {
            blockIdx = {bx, by, 0}; threadIdx = {32 * wp, 0, 0};
            matmul_impl<T>(w.data(), x.data(), y.data(), ne0, rows, n, rb);
        }
        for (int b = 0; b < n; ++b) for (int r = 0; r < rows; ++r) {
            double mag, want = ref_dot<T>(w.data() + r * rb, ne0, x.data() + b * ne0, &mag);
            ++checked;
            if (!close(y[b * rows + r], want, mag)) { if (fails < 40) printf("FAIL %s matmul n %d gy %d b %d r %d: %g vs %g\n", t.name, n, gy, b, r, y[b * rows + r], want); ++fails; }
        }
        // Expert products: k picks per token, repeats and bad ids.
        for (int per_pick : {0, 1}) {
            int k = 3, picks = n * k;
            std::vector<int> ids(picks);
            for (int p = 0; p < picks; ++p) { int v = rng() % 9; ids[p] = v < 7 ? (int)(rng() % n_expert) : (v == 7 ? -1 : n_expert); }
            if (n >= 2) ids[1] = ids[0];  // a repeat in one group
            std::vector<float> xi((per_pick ? picks : n) * ne0);
            for (auto& v : xi) v = unif(-2, 2);
            std::vector<float> yi(picks * rows, -777.0f);
            gridDim = {gx, (unsigned)gy, 1};
            for (unsigned bx = 0; bx < gridDim.x; ++bx) for (unsigned by = 0; by < gridDim.y; ++by) for (unsigned wp = 0; wp < 8; ++wp) {
                blockIdx = {bx, by, 0}; threadIdx = {32 * wp, 0, 0};
                matmul_id_impl<T>(w.data(), xi.data(), ids.data(), yi.data(), ne0, rows, n_expert, picks, k, per_pick, rb);
            }
            for (int p = 0; p < picks; ++p) for (int r = 0; r < rows; ++r) {
                float g = yi[p * rows + r];
                ++checked;
                if (ids[p] < 0 || ids[p] >= n_expert) { if (!std::isnan(g)) { printf("FAIL %s id %d not NaN\n", t.name, ids[p]); ++fails; } continue; }
                double mag, want = ref_dot<T>(w.data() + (ids[p] * rows + r) * rb, ne0, xi.data() + (per_pick ? p : p / k) * ne0, &mag);
                if (!close(g, want, mag)) { if (fails < 40) printf("FAIL %s matmul_id n %d gy %d pp %d p %d r %d: %g vs %g\n", t.name, n, gy, per_pick, p, r, g, want); ++fails; }
            }
        }
    }
    printf("%-8s kernels: %d outputs checked\n", t.name, checked);
}

// Independent ports of family-ops' dequant.rs tq1_0 and nvfp4 (block by
// block, as written there), against deq<T> element by element.
static void rs_tq1_0(const uint8_t* b, float* o) {
    const uint8_t POW3[5] = {1, 3, 9, 27, 81};
    float d = h2f((uint16_t)(b[52] | (b[53] << 8)));
    auto digit = [&](uint8_t q, int p) -> float {
        uint16_t t = (uint8_t)(q * POW3[p]);
        return (float)((int8_t)((t * 3) >> 8) - 1);
    };
    struct Part { const uint8_t* bytes; int n; int digits; };
    Part parts[3] = {{b, 32, 5}, {b + 32, 16, 5}, {b + 48, 4, 4}};
    int i = 0;
    for (auto& pt : parts)
        for (int p = 0; p < pt.digits; ++p)
            for (int k = 0; k < pt.n; ++k) o[i++] = d * digit(pt.bytes[k], p);
}
static float rs_ue4m3_half(uint8_t x) {
    if (x == 0 || x == 0x7f) return 0.0f;
    int exp = (x >> 3) & 0xf;
    float man = (float)(x & 7);
    float v = exp == 0 ? man * (1.0f / 512.0f) : (1.0f + man / 8.0f) * __uint_as_float((uint32_t)(exp - 7 + 127) << 23);
    return v * 0.5f;
}
static void rs_nvfp4(const uint8_t* b, float* o) {
    const int8_t FP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    for (int s = 0; s < 4; ++s) {
        float d = rs_ue4m3_half(b[s]);
        for (int j = 0; j < 8; ++j) {
            uint8_t q = b[4 + 8 * s + j];
            o[16 * s + j] = d * (float)FP4[q & 0xf];
            o[16 * s + j + 8] = d * (float)FP4[q >> 4];
        }
    }
}
// F32 and F16: float_lanes_row bit for bit ggml_dot_f32 / ggml_dot_f16 of
// one thread (which ggml_steps.cpp holds to llama.cpp's bits), over rows
// with and without leftovers past the last whole 32.
template <int T> static void float_lanes_checks(const Ty& t) {
    int n = 0, bad = 0;
    for (int ne0 : {32, 45, 80, 100, 512, 519, 1028}) for (int rep = 0; rep < 20; ++rep) {
        std::vector<uint8_t> row(ne0 * t.bb / t.be + 16);
        random_row(t, ne0, row.data());
        std::vector<float> x(ne0);
        for (auto& v : x) v = T == T_F16 ? h2f(f16_of(unif(-2.0f, 2.0f))) : unif(-2.0f, 2.0f);
        const float* xr[1] = {x.data()};
        float got[1];
        float_lanes_row<T, 1>(row.data(), ne0, xr, 1u, got);
        auto w = [&](int i) { return deq<T>(row.data(), i); };
        auto xi = [&](int i) { return x[i]; };
        float want = T == T_F32 ? ggml_dot_f32(w, xi, ne0) : ggml_dot_f16(w, xi, ne0);
        ++n;
        if (memcmp(&got[0], &want, 4) != 0) {
            if (bad < 10) printf("FAIL %s float lanes ne0 %d: %.9g vs ggml %.9g\n", t.name, ne0, got[0], want);
            ++bad;
        }
    }
    fails += bad;
    printf("%-8s float lanes: %d rows bit for bit ggml's dot\n", t.name, n - bad);
}

template <int T> static void extra_checks(const Ty& t) {
    if constexpr (T == T_F32 || T == T_F16) float_lanes_checks<T>(t);
    if (T != T_TQ1_0 && T != T_NVFP4) return;
    int bad = 0, n = 0;
    for (int rep = 0; rep < 2000; ++rep) {
        uint8_t b[64];
        for (auto& v : b) v = (uint8_t)rng();
        if (T == T_TQ1_0) { uint16_t h = f16_of(unif(0.002f, 0.03f)); memcpy(b + 52, &h, 2); }
        if (rep < 256 && T == T_NVFP4) { b[0] = rep; b[1] = 0x7f; b[2] = 0; b[3] = 0xff; }
        float o[256];
        if (T == T_TQ1_0) rs_tq1_0(b, o); else rs_nvfp4(b, o);
        for (int i = 0; i < t.be; ++i) {
            float g = deq<T>(b, i);
            ++n;
            if (__float_as_uint(g) != __float_as_uint(o[i])) { if (bad < 5) printf("FAIL %s deq %d: %g vs %g\n", t.name, i, g, o[i]); ++bad; }
        }
    }
    fails += bad;
    printf("%-8s deq vs dequant.rs port: %d elements, %d differ in bits\n", t.name, n, bad);
}


// Random int8 activations: codes in [-127, 127] (the extremes included)
// and a positive scale a block of `blk`.
static void random_i8(int n, int blk, std::vector<uint8_t>& q, std::vector<float>& d) {
    q.resize(n);
    d.resize(n / blk);
    for (int i = 0; i < n; ++i) { int v = (int)(rng() % 255) - 127; q[i] = (uint8_t)(int8_t)v; }
    for (auto& s : d) s = unif(0.001f, 0.05f);
}

template <int T>
static double ref_dot_i8(const uint8_t* row, int ne0, const uint8_t* q, const float* d, int blk, double* mag) {
    double s = 0, m = 0;
    for (int i = 0; i < ne0; ++i) {
        double p = (double)deq<T>(row, i) * ((double)(int8_t)q[i] * d[i / blk]);
        s += p; m += fabs(p);
    }
    *mag = m;
    return s;
}

// The int8 products: row_dot_i8 over every weight and code alignment and
// activation-row mask, then the kernels' bodies over emulated grids
// (matvec_i8_impl and matvec_id_i8_impl: n == 1 and the grids of 3 rows
// of blocks; matmul_i8_impl and matmul_id_i8_impl the rest).
template <int T>
static void test_i8(const Ty& t) {
    int blk = T == T_Q8_0 || T == T_IQ4_NL ? 32 : 256;
    double worst = 0;
    int cases = 0;
    for (int nb : {1, 2, 3, 16, 33}) for (int wo = 0; wo < 4; ++wo) for (int xo : {0, 16, 3}) for (int nr : {1, 4}) {
        int ne0 = nb * t.be, rb = nb * t.bb;
        std::vector<uint8_t> buf(rb + 64);
        uint8_t* row = buf.data() + wo;
        random_row(t, ne0, row);
        std::vector<uint8_t> q, qb(4 * ne0 + 64);
        std::vector<float> d;
        random_i8(4 * ne0, blk, q, d);
        memcpy(qb.data() + xo, q.data(), 4 * ne0);
        const u8* xq[4];
        const float* xd[4];
        for (int j = 0; j < 4; ++j) { xq[j] = qb.data() + xo + j * ne0; xd[j] = d.data() + j * ne0 / blk; }
        u32 live = nr == 1 ? 1u : 0xbu;  // rows 0, 1, 3
        float acc[4] = {0, 0, 0, 0};
        for (int lane = 0; lane < 32; ++lane) {
            if (nr == 1) row_dot_i8<T, 1>(row, ne0, xq, xd, live, lane, 32, acc);
            else row_dot_i8<T, 4>(row, ne0, xq, xd, live, lane, 32, acc);
        }
        for (int j = 0; j < nr; ++j) {
            ++cases;
            if (!((live >> j) & 1)) {
                if (acc[j] != 0.0f) { printf("FAIL %s i8: row %d not live but written\n", t.name, j); ++fails; }
                continue;
            }
            double mag, want = ref_dot_i8<T>(row, ne0, q.data() + j * ne0, d.data() + j * ne0 / blk, blk, &mag);
            worst = std::max(worst, fabs(acc[j] - want) / (mag + 1e-30));
            if (!close(acc[j], want, mag)) {
                if (fails < 40) printf("FAIL %s i8 ne0 %d wo %d xo %d nr %d j %d: got %.9g want %.9g (mag %.3g)\n", t.name, ne0, wo, xo, nr, j, acc[j], want, mag);
                ++fails;
            }
        }
    }
    // IQ4_NL: an odd count of blocks (ggml's odd last block), and rows of
    // a multiple of 8 too (the weight ggml repacks: one chain a row; Q4_K
    // too, two chains).
    for (int rows : {19, 24}) {
    if (rows == 24 && T != T_IQ4_NL && T != T_Q4_K) continue;
    int nbk = T == T_IQ4_NL ? 3 : 2;
    int ne0 = nbk * t.be, n_expert = 3, rb = nbk * t.bb, checked = 0;
    std::vector<uint8_t> w(rb * rows * n_expert + 8);
    for (int r = 0; r < rows * n_expert; ++r) random_row(t, ne0, w.data() + r * rb);
    for (int split : {0, 1}) for (int n : {1, 2, 3, 4, 5, 9}) for (int gy : {1, 2, 3}) {
        unsigned gx = split ? (unsigned)rows : (unsigned)((rows + 7) / 8);
        std::vector<uint8_t> q;
        std::vector<float> d;
        random_i8(n * ne0, blk, q, d);
        std::vector<float> y(n * rows, -777.0f);
        gridDim = {gx, (unsigned)gy, 1};
        for (unsigned bx = 0; bx < gx; ++bx) for (unsigned by = 0; by < (unsigned)gy; ++by) for (unsigned wp = 0; wp < 8; ++wp) {
            blockIdx = {bx, by, 0}; threadIdx = {32 * wp, 0, 0};
            if (n == 1 || gy == 3) matvec_i8_impl<T>(w.data(), q.data(), d.data(), y.data(), ne0, rows, n, rb);
            else matmul_i8_impl<T>(w.data(), q.data(), d.data(), y.data(), ne0, rows, n, rb);
        }
        for (int b = 0; b < n; ++b) for (int r = 0; r < rows; ++r) {
            double mag, want = ref_dot_i8<T>(w.data() + r * rb, ne0, q.data() + b * ne0, d.data() + b * ne0 / blk, blk, &mag);
            ++checked;
            if (!close(y[b * rows + r], want, mag)) { if (fails < 40) printf("FAIL %s matvec_i8 n %d gy %d b %d r %d: %g vs %g\n", t.name, n, gy, b, r, y[b * rows + r], want); ++fails; }
        }
        for (int per_pick : {0, 1}) {
            int k = 3, picks = n * k;
            std::vector<int> ids(picks);
            for (int p = 0; p < picks; ++p) { int v = rng() % 9; ids[p] = v < 7 ? (int)(rng() % n_expert) : (v == 7 ? -1 : n_expert); }
            if (n >= 2) ids[1] = ids[0];  // a repeat in one group
            std::vector<uint8_t> qi;
            std::vector<float> di;
            random_i8((per_pick ? picks : n) * ne0, blk, qi, di);
            std::vector<float> yi(picks * rows, -777.0f);
            for (unsigned bx = 0; bx < gx; ++bx) for (unsigned by = 0; by < (unsigned)gy; ++by) for (unsigned wp = 0; wp < 8; ++wp) {
                blockIdx = {bx, by, 0}; threadIdx = {32 * wp, 0, 0};
                if (n == 1 || gy == 3) matvec_id_i8_impl<T>(w.data(), qi.data(), di.data(), ids.data(), yi.data(), ne0, rows, n_expert, picks, k, per_pick, rb);
                else matmul_id_i8_impl<T>(w.data(), qi.data(), di.data(), ids.data(), yi.data(), ne0, rows, n_expert, picks, k, per_pick, rb);
            }
            for (int p = 0; p < picks; ++p) for (int r = 0; r < rows; ++r) {
                float g = yi[p * rows + r];
                ++checked;
                if (ids[p] < 0 || ids[p] >= n_expert) { if (!std::isnan(g)) { printf("FAIL %s i8 id %d not NaN\n", t.name, ids[p]); ++fails; } continue; }
                int xb = per_pick ? p : p / k;
                double mag, want = ref_dot_i8<T>(w.data() + (ids[p] * rows + r) * rb, ne0, qi.data() + xb * ne0, di.data() + xb * ne0 / blk, blk, &mag);
                if (!close(g, want, mag)) { if (fails < 40) printf("FAIL %s matvec_id_i8 n %d gy %d pp %d p %d r %d: %g vs %g\n", t.name, n, gy, per_pick, p, r, g, want); ++fails; }
            }
        }
    }
    printf("%-8s int8: %d dots (worst |err|/sum|w x| %.2e), %d outputs checked (%d rows)\n", t.name, cases, worst, checked, rows);
    }
}

// The types with int8 products (ops.rs INT8_KERNELS).
static constexpr bool int8_type(int t) { return t == 8 || t == 12 || t == 13 || t == 14 || t == 16 || t == 17 || t == 22 || t == 18 || t == 23 || t == 20; }

// A type's float products, or its int8 ones (it has no other).
template <int T>
static void run(const Ty& t) {
    extra_checks<T>(t);
    if constexpr (int8_type(T)) {
        test_i8<T>(t);
    } else {
        test_dots<T>(t);
        test_kernels<T>(t);
    }
}

int main() {
    // Random grids; the IQ2 and IQ3_XXS grids' bytes in 1..127, as the
    // real ones (the int8 products negate them a byte at a time; ops.rs
    // tests the real grids for it).
    auto grid_bytes = [](int n) { uint64_t v = 0; for (int k = 0; k < n; ++k) v |= (uint64_t)(1 + rng() % 127) << (8 * k); return v; };
    for (auto& g : iq2xxs_grid) g = grid_bytes(8); for (auto& g : iq2xs_grid) g = grid_bytes(8); for (auto& g : iq2s_grid) g = grid_bytes(8);
    for (auto& g : iq3xxs_grid) g = (u32)grid_bytes(4);
    for (auto& g : iq1s_grid) g = rng(); for (auto& g : iq3s_grid) g = (u32)rng();
    for (const Ty& t : TYPES) {
        switch (t.id) {
#define CASE(ID) case ID: run<ID>(t); break;
            CASE(0) CASE(1) CASE(30) CASE(2) CASE(3) CASE(6) CASE(7) CASE(8) CASE(10) CASE(11) CASE(12)
            CASE(13) CASE(14) CASE(20) CASE(23) CASE(35) CASE(39) CASE(16) CASE(17) CASE(22) CASE(18)
            CASE(21) CASE(19) CASE(29)
            CASE(34) CASE(40)
        }
    }
    printf(fails ? "%d FAILURES\n" : "all passed\n", fails);
    return fails != 0;
}
