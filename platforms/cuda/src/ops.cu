// The device op layer's kernels (platform-cuda's `ops` module), compiled at
// run time by NVRTC with `--fmad=false`, so each multiply and add rounds as
// the CPU reference's (family-ops) does and dequantization is exact.
//
// Weights are read from the staged bytes in place. Products: one warp per
// output row, per-type dots of whole units (scales decoded once, quants by
// aligned 32-bit loads: rows of block types are not aligned), up to 4
// activation rows per pass (see "products"). Gathers: every element
// dequantized where it is read (deq). No header is included: the F16
// conversions are PTX `cvt`.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define NEG_INF (__int_as_float(0xff800000))

// --- scalars -----------------------------------------------------------------

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ u16 ld16(const u8* p) { return (u16)p[0] | ((u16)p[1] << 8); }

__device__ __forceinline__ u32 ld32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

__device__ __forceinline__ float f16_at(const u8* p) { return h2f(ld16(p)); }

// bf16 to f32 rounding to nearest even (half's `bf16::from_f32`), NaN kept
// quiet.
__device__ __forceinline__ float round_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((u | 0x00400000u) & 0xffff0000u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return __uint_as_float(u & 0xffff0000u);
}

// --- block reductions (blockDim.x a multiple of 32, at most 1024) -----------

__device__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The block's sum, in every thread.
__device__ float block_sum(float v) {
    __shared__ float s[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) s[wid] = v;
    __syncthreads();
    v = (lane < nw) ? s[lane] : 0.0f;
    return warp_sum(v);
}

__device__ double block_sum_d(double v) {
    __shared__ double s[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) s[wid] = v;
    __syncthreads();
    v = (lane < nw) ? s[lane] : 0.0;
    return warp_sum_d(v);
}

__device__ float block_max(float v) {
    __shared__ float s[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) s[wid] = v;
    __syncthreads();
    v = (lane < nw) ? s[lane] : NEG_INF;
    return warp_max(v);
}

// --- dequantization of element i of a row (family-ops' dequant.rs) ---------

// ggml type ids.
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q3_K 11
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30
#define T_IQ4_NL 20
#define T_IQ4_XS 23
#define T_TQ2_0 35
#define T_MXFP4 39
#define T_TQ1_0 34
#define T_NVFP4 40
#define T_IQ2_XXS 16
#define T_IQ2_XS 17
#define T_IQ3_XXS 18
#define T_IQ1_S 19
#define T_IQ3_S 21
#define T_IQ2_S 22
#define T_IQ1_M 29

// IQ4_NL's non-linear code book (`kvalues_iq4nl`).
__device__ __forceinline__ int iq4nl_value(int q) {
    const signed char v[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};
    return v[q];
}

// E2M1 code points, doubled (`kvalues_mxfp4`).
__device__ __forceinline__ int fp4_value(int q) {
    const signed char v[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
    return v[q];
}

// Q4_K/Q5_K: group g's 6-bit scale and min (`get_scale_min_k4`).
__device__ __forceinline__ void k4_scale_min(const u8* s, int g, int* sc, int* m) {
    if (g < 4) {
        *sc = s[g] & 63;
        *m = s[g + 4] & 63;
    } else {
        int j = g - 4;
        *sc = (s[j + 8] & 0xf) | ((s[j] >> 2) & 0x30);
        *m = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
}

// `ksigns_iq2xs`: 7 stored sign bits and an eighth that makes the count of
// minus signs even.
__device__ __forceinline__ u32 ksigns(u32 i) {
    i &= 0x7f;
    return i | ((u32)(__popc(i) & 1) << 7);
}

// `v`, negated when bit j of `signs` is set.
__device__ __forceinline__ float signed_by(float v, u32 signs, int j) {
    return ((signs >> j) & 1) ? -v : v;
}

// Byte j of a grid entry (the grids are generated, see ops.rs `source`).
__device__ __forceinline__ float grid_byte(unsigned long long entry, int j) {
    return (float)(u8)(entry >> (8 * j));
}

// NVFP4's unsigned E4M3 scale (bias 7), halved for the doubled code book;
// 0 and 0x7f (NaN) read as 0, the top bit ignored (family-ops'
// `ue4m3_half`).
__device__ __forceinline__ float ue4m3_half(u32 x) {
    if (x == 0 || x == 0x7f) return 0.0f;
    int ex = (x >> 3) & 0xf;
    float man = (float)(x & 7);
    float v = ex == 0 ? man * (1.0f / 512.0f)
                      : (1.0f + man / 8.0f) * __uint_as_float((u32)(ex - 7 + 127) << 23);
    return v * 0.5f;
}

// TQ1_0's base-3 digit p of byte q: ((q * 3^p mod 256) * 3) >> 8, for
// pw = 3^p.
__device__ __forceinline__ u32 tq1_digit(u32 q, u32 pw) { return (((q * pw) & 0xffu) * 3u) >> 8; }

// 3^p for p < 5.
__device__ __forceinline__ u32 pow3(int p) { return p < 4 ? (0x1b090301u >> (8 * p)) & 0xffu : 81u; }

template <int T>
__device__ __forceinline__ float deq(const u8* row, int i) {
    if (T == T_F32) {
        return __uint_as_float(ld32(row + 4 * (i64)i));
    } else if (T == T_F16) {
        return f16_at(row + 2 * (i64)i);
    } else if (T == T_BF16) {
        return __uint_as_float((u32)ld16(row + 2 * (i64)i) << 16);
    } else if (T == T_Q4_0) {
        const u8* b = row + (i64)(i / 32) * 18;
        int j = i % 32;
        int q = j < 16 ? (b[2 + j] & 0xf) : (b[2 + j - 16] >> 4);
        return f16_at(b) * (float)(q - 8);
    } else if (T == T_Q4_1) {
        const u8* b = row + (i64)(i / 32) * 20;
        int j = i % 32;
        int q = j < 16 ? (b[4 + j] & 0xf) : (b[4 + j - 16] >> 4);
        return f16_at(b) * (float)q + f16_at(b + 2);
    } else if (T == T_Q5_0) {
        const u8* b = row + (i64)(i / 32) * 22;
        int j = i % 32;
        u32 qh = ld32(b + 2);
        int q = (j < 16 ? (b[6 + j] & 0xf) : (b[6 + j - 16] >> 4)) | (((qh >> j) & 1) << 4);
        return f16_at(b) * (float)(q - 16);
    } else if (T == T_Q5_1) {
        const u8* b = row + (i64)(i / 32) * 24;
        int j = i % 32;
        u32 qh = ld32(b + 4);
        int q = (j < 16 ? (b[8 + j] & 0xf) : (b[8 + j - 16] >> 4)) | (((qh >> j) & 1) << 4);
        return f16_at(b) * (float)q + f16_at(b + 2);
    } else if (T == T_Q8_0) {
        const u8* b = row + (i64)(i / 32) * 34;
        return (float)(i8)b[2 + i % 32] * f16_at(b);
    } else if (T == T_Q2_K) {
        const u8* b = row + (i64)(i / 256) * 84;
        int e = i % 256;
        int sc = b[e / 16];
        int n = e / 128, j = (e / 32) % 4, l = e % 32;
        int q = (b[16 + 32 * n + l] >> (2 * j)) & 3;
        float dl = f16_at(b + 80) * (float)(sc & 0xf);
        float ml = f16_at(b + 82) * (float)(sc >> 4);
        return dl * (float)q - ml;
    } else if (T == T_Q3_K) {
        const u8* b = row + (i64)(i / 256) * 110;
        const u8* hmask = b;
        const u8* qs = b + 32;
        const u8* sc = b + 96;
        int e = i % 256;
        int k = e / 16;
        int low = k < 8 ? (sc[k] & 0xf) : (sc[k - 8] >> 4);
        int high = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
        float dl = f16_at(b + 108) * (float)((int)(i8)(u8)(low | (high << 4)) - 32);
        int n = e / 128, j = (e / 32) % 4, l = e % 32;
        int q = (qs[32 * n + l] >> (2 * j)) & 3;
        if (((hmask[l] >> (e / 32)) & 1) == 0) q -= 4;
        return dl * (float)q;
    } else if (T == T_Q4_K || T == T_Q5_K) {
        const u8* b = row + (i64)(i / 256) * (T == T_Q4_K ? 144 : 176);
        int e = i % 256;
        int sc, m;
        k4_scale_min(b + 4, e / 32, &sc, &m);
        float dl = f16_at(b) * (float)sc;
        float ml = f16_at(b + 2) * (float)m;
        int c = e / 64, h = (e / 32) % 2, l = e % 32;
        int q;
        if (T == T_Q4_K) {
            q = (b[16 + 32 * c + l] >> (4 * h)) & 0xf;
        } else {
            q = ((b[48 + 32 * c + l] >> (4 * h)) & 0xf) | (((b[16 + l] >> (e / 32)) & 1) << 4);
        }
        return dl * (float)q - ml;
    } else if (T == T_IQ4_NL) {
        const u8* b = row + (i64)(i / 32) * 18;
        int j = i % 32;
        int q = j < 16 ? (b[2 + j] & 0xf) : (b[2 + j - 16] >> 4);
        return f16_at(b) * (float)iq4nl_value(q);
    } else if (T == T_IQ4_XS) {
        const u8* b = row + (i64)(i / 256) * 136;
        int e = i % 256;
        int g = e / 32, j = e % 32;
        int low = (b[4 + g / 2] >> (4 * (g % 2))) & 0xf;
        int high = (ld16(b + 2) >> (2 * g)) & 3;
        float dl = f16_at(b) * (float)((low | (high << 4)) - 32);
        const u8* qs = b + 8 + 16 * g;
        int q = j < 16 ? (qs[j] & 0xf) : (qs[j - 16] >> 4);
        return dl * (float)iq4nl_value(q);
    } else if (T == T_TQ2_0) {
        const u8* b = row + (i64)(i / 256) * 66;
        int e = i % 256;
        int q = (b[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
        return f16_at(b + 64) * (float)(q - 1);
    } else if (T == T_MXFP4) {
        const u8* b = row + (i64)(i / 32) * 17;
        u32 ex = b[0];
        float d = __uint_as_float(ex < 2 ? (0x00200000u << ex) : ((ex - 1) << 23));
        int j = i % 32;
        int q = j < 16 ? (b[1 + j] & 0xf) : (b[1 + j - 16] >> 4);
        return d * (float)fp4_value(q);
    } else if (T == T_IQ2_XXS) {
        const u8* b = row + (i64)(i / 256) * 66;
        int e = i % 256;
        int g = e / 32, l = (e / 8) % 4, j = e % 8;
        u32 aux = ld32(b + 6 + 8 * g);
        float db = f16_at(b) * (0.5f + (float)(aux >> 28)) * 0.25f;
        unsigned long long entry = iq2xxs_grid[b[2 + 8 * g + l]];
        return signed_by(db * grid_byte(entry, j), ksigns(aux >> (7 * l)), j);
    } else if (T == T_IQ2_XS) {
        const u8* b = row + (i64)(i / 256) * 74;
        int e = i % 256;
        int k = e / 8, j = e % 8, s16 = e / 16;
        u32 sc = (b[66 + s16 / 2] >> (4 * (s16 % 2))) & 0xf;
        float db = f16_at(b) * (0.5f + (float)sc) * 0.25f;
        u32 q = ld16(b + 2 + 2 * k);
        unsigned long long entry = iq2xs_grid[q & 511];
        return signed_by(db * grid_byte(entry, j), ksigns(q >> 9), j);
    } else if (T == T_IQ2_S) {
        const u8* b = row + (i64)(i / 256) * 82;
        int e = i % 256;
        int k = e / 8, j = e % 8, s16 = e / 16;
        u32 sc = (b[74 + s16 / 2] >> (4 * (s16 % 2))) & 0xf;
        float db = f16_at(b) * (0.5f + (float)sc) * 0.25f;
        u32 high = (b[66 + k / 4] >> (2 * (k % 4))) & 3;
        unsigned long long entry = iq2s_grid[(u32)b[2 + k] | (high << 8)];
        return signed_by(db * grid_byte(entry, j), b[34 + k], j);
    } else if (T == T_IQ3_XXS) {
        const u8* b = row + (i64)(i / 256) * 98;
        int e = i % 256;
        int g = e / 32, l = (e / 8) % 4, j = e % 8;
        u32 aux = ld32(b + 66 + 4 * g);
        float db = f16_at(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
        u32 entry = iq3xxs_grid[b[2 + 8 * g + 2 * l + j / 4]];
        return signed_by(db * grid_byte(entry, j % 4), ksigns(aux >> (7 * l)), j);
    } else if (T == T_IQ3_S) {
        const u8* b = row + (i64)(i / 256) * 110;
        int e = i % 256;
        int g = e / 32, k = e / 4;
        u32 sc = (b[106 + g / 2] >> (4 * (g % 2))) & 0xf;
        float db = f16_at(b) * (float)(1 + 2 * sc);
        u32 index = (u32)b[2 + k] | (((u32)(b[66 + k / 8] >> (k % 8)) & 1) << 8);
        return signed_by(db * grid_byte(iq3s_grid[index], e % 4), b[74 + e / 8], e % 8);
    } else if (T == T_IQ1_S) {
        const u8* b = row + (i64)(i / 256) * 50;
        int e = i % 256;
        int g = e / 32, l = (e / 8) % 4, j = e % 8;
        u32 h = ld16(b + 34 + 2 * g);
        float dl = f16_at(b) * (float)(2 * ((h >> 12) & 7) + 1);
        float delta = (h & 0x8000) ? -0.125f : 0.125f;
        u32 index = (u32)b[2 + 4 * g + l] | (((h >> (3 * l)) & 7) << 8);
        float v = (float)(signed char)(u8)(iq1s_grid[index] >> (8 * j));
        return dl * (v + delta);
    } else if (T == T_IQ1_M) {
        const u8* b = row + (i64)(i / 256) * 56;
        int e = i % 256;
        int k = e / 8, j = e % 8, s = k / 2;
        u32 sc0 = ld16(b + 48), sc1 = ld16(b + 50), sc2 = ld16(b + 52), sc3 = ld16(b + 54);
        u32 d_bits = (sc0 >> 12) | ((sc1 >> 8) & 0xf0) | ((sc2 >> 4) & 0xf00) | (sc3 & 0xf000);
        float d = h2f((u16)d_bits);
        u32 scw = ld16(b + 48 + 2 * (s / 4));
        float dl = d * (float)(2 * ((scw >> (3 * (s % 4))) & 7) + 1);
        u32 nib = (b[32 + k / 2] >> (4 * (k % 2))) & 0xf;
        u32 index = (u32)b[k] | ((nib & 7) << 8);
        float delta = (nib & 8) ? -0.125f : 0.125f;
        float v = (float)(signed char)(u8)(iq1s_grid[index] >> (8 * j));
        return dl * (v + delta);
    } else if (T == T_TQ1_0) {
        // Elements 0..160: digit e / 32 of byte e % 32; 160..240: digit
        // (e - 160) / 16 of byte 32 + e % 16; 240..256: digit (e - 240) / 4
        // of byte 48 + e % 4.
        const u8* b = row + (i64)(i / 256) * 54;
        int e = i % 256;
        u32 q;
        int p;
        if (e < 160) {
            q = b[e % 32];
            p = e / 32;
        } else if (e < 240) {
            q = b[32 + e % 16];
            p = (e - 160) / 16;
        } else {
            q = b[48 + e % 4];
            p = (e - 240) / 4;
        }
        return f16_at(b + 52) * (float)((int)tq1_digit(q, pow3(p)) - 1);
    } else if (T == T_NVFP4) {
        const u8* b = row + (i64)(i / 64) * 36;
        int e = i % 64, s = e / 16, j = e % 16;
        int q = j < 8 ? (b[4 + 8 * s + j] & 0xf) : (b[4 + 8 * s + j - 8] >> 4);
        return ue4m3_half(b[s]) * (float)fp4_value(q);
    } else if (T == T_Q6_K) {
        const u8* b = row + (i64)(i / 256) * 210;
        int e = i % 256;
        int n = e / 128;
        int low = (b[64 * n + e % 64] >> (4 * ((e / 64) % 2))) & 0xf;
        int high = (b[128 + 32 * n + e % 32] >> (2 * ((e / 32) % 4))) & 3;
        int q = (int)(i8)(u8)(low | (high << 4)) - 32;
        float dl = f16_at(b + 208) * (float)(i8)b[192 + e / 16];
        return dl * (float)q;
    }
    return 0.0f;
}

// --- ggml's CPU arithmetic, bit for bit (family-ops' `ggml_cpu`) -----------
// The ops whose results an F16 cache rounds (attention's query and
// probabilities, the k-pool's pooled keys, RoPE's keys) compute as the CPU
// reference does, each step rounded where it rounds (the _rn intrinsics: NVRTC
// would otherwise contract a product and a sum into one fma): a difference
// of one f32 ulp there moves an f16 across its rounding now and then, and
// the activations' int8 rounding downstream carries that to the logits.

// ggml_v_expf (AVX2 + FMA) of one lane (family-ops' `ggml_cpu::expf`).
__device__ float ggml_expf(float x) {
    const float r = __int_as_float(0x4b400000);  // 0x1.8p23
    float z = __fmaf_rn(x, __int_as_float(0x3fb8aa3b), r);
    float n = __fsub_rn(z, r);
    float b = __fmaf_rn(-n, __int_as_float(0x35bfbe8e), __fmaf_rn(-n, __int_as_float(0x3f317200), x));
    u32 e = __float_as_uint(z) << 23;
    float k = __uint_as_float(e + __float_as_uint(1.0f));
    float u = __fmul_rn(b, b);
    float j = __fmaf_rn(__fmaf_rn(__fmaf_rn(__int_as_float(0x3c072010), b, __int_as_float(0x3d2b9f17)), u,
                                  __fmaf_rn(__int_as_float(0x3e2aaf33), b, __int_as_float(0x3efffedb))),
                        u, __fmul_rn(__int_as_float(0x3f7ffff6), b));
    if (fabsf(n) <= 126.0f || n != n) return __fmaf_rn(j, k, k);
    u32 g = n <= 0.0f ? 0x82000000u : 0u;
    float s1 = __uint_as_float(g + 0x7f000000u);
    if (fabsf(n) > 192.0f) return __fmul_rn(s1, s1);
    float s2 = __uint_as_float(e - g);
    return __fmul_rn(__fmaf_rn(s2, j, s2), s1);
}

// The host libm's rounding of expf and logf (device_ops::libm_rounding):
// for each, the arguments (f32 bits, ascending) at which it gives the
// other neighbour of the correctly rounded value, and how near a tie such a
// value lies (ulps). CudaOps::new uploads them before the first launch.
__device__ const unsigned* libm_misrounded[2];
__device__ int libm_misrounded_len[2];
__device__ double libm_tie_window[2];
#define LIBM_EXPF 0
#define LIBM_LOGF 1

// Whether argument bits `key` are in function fn's list (binary search);
// out of line, as only arguments near a tie get here.
__device__ __noinline__ bool libm_listed(int fn, unsigned key) {
    const unsigned* list = libm_misrounded[fn];
    int lo = 0, hi = libm_misrounded_len[fn];
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (list[mid] < key) lo = mid + 1; else hi = mid;
    }
    return lo < libm_misrounded_len[fn] && list[lo] == key;
}

// `exact` (f(x) in f64) rounded as the host's libm rounds f(x): the
// nearest float, or, for a listed argument whose value lies within the
// window of a tie, the neighbour on the exact value's side
// (device_ops::libm_rounding::rounded_as_libm).
__device__ __forceinline__ float rounded_as_libm(int fn, float x, double exact) {
    float nearest = (float)exact;
    double off = fabs(exact - (double)nearest);
    if (off == 0.0 || isinf(nearest)) return nearest;
    // The float next to `nearest` on the exact value's side (from zero, the
    // smallest subnormal of the exact value's sign).
    u32 b = __float_as_uint(nearest);
    bool up = exact > (double)nearest;
    u32 ob = (b & 0x7fffffffu) == 0 ? (up ? 1u : 0x80000001u) : (up == !(b >> 31) ? b + 1 : b - 1);
    float other = __uint_as_float(ob);
    double ulp = fabs((double)other - (double)nearest);
    if (!(off > (0.5 - libm_tie_window[fn]) * ulp)) return nearest;
    return libm_listed(fn, __float_as_uint(x)) ? other : nearest;
}

// libm's expf and logf where ggml takes them (expf past the last whole 8,
// the sigmoid, softplus, the clamped SwiGLU): glibc's bits.
__device__ __forceinline__ float libm_expf(float x) { return rounded_as_libm(LIBM_EXPF, x, exp((double)x)); }
__device__ __forceinline__ float libm_logf(float x) { return rounded_as_libm(LIBM_LOGF, x, log((double)x)); }

// libm's cosf, sinf and powf where ggml takes them (RoPE's angles), the
// same way: the correctly rounded value, which glibc's give but near a
// tie (CUDA's own are up to 2 ulp off).
__device__ __forceinline__ float libm_cosf(float x) { return (float)cos((double)x); }
__device__ __forceinline__ float libm_sinf(float x) { return (float)sin((double)x); }
__device__ __forceinline__ float libm_powf(float x, float y) { return (float)pow((double)x, (double)y); }

// ggml's sigmoid (ggml_vec_sigmoid_f32, family-ops' `ggml_cpu::sigmoid`):
// 1 / (1 + expf(-x)), each step rounded.
__device__ __forceinline__ float ggml_sigmoid(float x) {
    return __fdiv_rn(1.0f, __fadd_rn(1.0f, libm_expf(-x)));
}

// ggml's softplus (family-ops' `ggml_cpu::softplus`): x above 20, else
// logf(1 + expf(x)), each step rounded.
__device__ __forceinline__ float ggml_softplus(float x) {
    return x > 20.0f ? x : libm_logf(__fadd_rn(1.0f, libm_expf(x)));
}

// hsum_float_8's order: (v4 + v0, ...), then (t0 + t2) + (t1 + t3).
__device__ __forceinline__ float reduce_movehl8(const float* v) {
    float t0 = __fadd_rn(v[4], v[0]), t1 = __fadd_rn(v[5], v[1]);
    float t2 = __fadd_rn(v[6], v[2]), t3 = __fadd_rn(v[7], v[3]);
    return __fadd_rn(__fadd_rn(t0, t2), __fadd_rn(t1, t3));
}

// GGML_F32x8_REDUCE's last stage: (v0 + v4, ...), then (t0 + t1) + (t2 + t3).
__device__ __forceinline__ float reduce_hadd8(const float* v) {
    float t0 = __fadd_rn(v[0], v[4]), t1 = __fadd_rn(v[1], v[5]);
    float t2 = __fadd_rn(v[2], v[6]), t3 = __fadd_rn(v[3], v[7]);
    return __fadd_rn(__fadd_rn(t0, t1), __fadd_rn(t2, t3));
}

// family-ops' `fma_steps`: x(k) * y(k) over the whole 32s of n into 4
// accumulators of 8 lanes (fma), the lanes then (c1 + c3) + (c2 + c4);
// returns where the leftovers start. One thread; X and Y give element k.
template <typename X, typename Y>
__device__ __forceinline__ int ggml_fma_steps(X x, Y y, int n, float* v) {
    float acc[32];
#pragma unroll
    for (int k = 0; k < 32; ++k) acc[k] = 0.0f;
    int np = n & ~31;
    for (int i = 0; i < np; i += 32) {
#pragma unroll
        for (int k = 0; k < 32; ++k) acc[k] = __fmaf_rn(x(i + k), y(i + k), acc[k]);
    }
#pragma unroll
    for (int l = 0; l < 8; ++l)
        v[l] = __fadd_rn(__fadd_rn(acc[l], acc[16 + l]), __fadd_rn(acc[8 + l], acc[24 + l]));
    return np;
}

// ggml_vec_dot_f32's leftovers (family-ops' `dot_f32`) after its steps'
// reduced sum: elements np..n as GCC's loop adds them, runs of 8 and one
// of 4 as rounded products, the last 0-3 by fma.
template <typename X, typename Y>
__device__ __forceinline__ float ggml_dot_f32_tail(float sum, X x, Y y, int np, int n) {
    int left = n - np;
    int unfused = (left & ~7) + ((left & 7) >= 4 ? 4 : 0);
    for (int i = np; i < np + unfused; ++i) sum = __fadd_rn(sum, __fmul_rn(x(i), y(i)));
    for (int i = np + unfused; i < n; ++i) sum = __fmaf_rn(x(i), y(i), sum);
    return sum;
}

// ggml_vec_dot_f16's and _bf16's leftovers (family-ops' `dot_f16`,
// `dot_bf16`): the rounded products of elements np..n summed in f64 after
// the steps' reduced sum.
template <typename X, typename Y>
__device__ __forceinline__ float ggml_dot_f16_tail(float reduced, X x, Y y, int np, int n) {
    double sum = (double)reduced;
    for (int i = np; i < n; ++i) sum += (double)__fmul_rn(x(i), y(i));
    return (float)sum;
}

// ggml_vec_dot_f32 (family-ops' `dot_f32`): the steps, then the leftovers.
template <typename X, typename Y>
__device__ float ggml_dot_f32(X x, Y y, int n) {
    float v[8];
    int np = ggml_fma_steps(x, y, n, v);
    return ggml_dot_f32_tail(reduce_hadd8(v), x, y, np, n);
}

// ggml_vec_dot_f16 on widened halves (family-ops' `dot_f16`): the steps,
// then the leftovers.
template <typename X, typename Y>
__device__ float ggml_dot_f16(X x, Y y, int n) {
    float v[8];
    int np = ggml_fma_steps(x, y, n, v);
    return ggml_dot_f16_tail(reduce_hadd8(v), x, y, np, n);
}

// llamafile's tinyBLAS sum of one output (family-ops' `dot_tinyblas`),
// which ggml's mul_mat takes for several tokens of a float weight of a
// multiple of 4 rows of whole 8s and for the products of a ubatch's
// attention: lane l the fma chain of elements l, l + 8, ... in order,
// then hsum_float_8 (reduce_movehl8). One thread.
template <typename X, typename Y>
__device__ float tinyblas_dot(X x, Y y, int n) {
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int k = 0; k < n; ++k) v[k & 7] = __fmaf_rn(x(k), y(k), v[k & 7]);
    return reduce_movehl8(v);
}

// The block's part of ggml_vec_soft_max_f32 on row v of n (every thread
// calls it): v[i] = exp(v[i] - mx) in place (ggml_expf on the whole 8s,
// libm's on the rest), then the sum as ggml adds it: each 8 summed in f32
// (reduce_movehl8), those and the rest added in order in f64 (one thread;
// 1024 eights a pass). Returns the sum to every thread.
__device__ double ggml_exp_sum(float* v, int n, float mx) {
    __shared__ float eights[1024];
    __shared__ double total;
    int whole = n & ~7;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float w = __fsub_rn(v[i], mx);
        v[i] = i < whole ? ggml_expf(w) : libm_expf(w);
    }
    if (threadIdx.x == 0) total = 0.0;
    __syncthreads();
    for (int c0 = 0; c0 < whole / 8; c0 += 1024) {
        int nc = min(1024, whole / 8 - c0);
        for (int c = threadIdx.x; c < nc; c += blockDim.x) eights[c] = reduce_movehl8(v + 8 * (c0 + c));
        __syncthreads();
        if (threadIdx.x == 0)
            for (int c = 0; c < nc; ++c) total += (double)eights[c];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        for (int i = whole; i < n; ++i) total += (double)v[i];
    __syncthreads();
    double t = total;
    __syncthreads();
    return t;
}

// The rest of ggml's soft_max on row v of n once every thread has the
// row's maximum mx (block_max): ggml_exp_sum's exp and sum, then each
// value times the reciprocal of the sum rounded to f32. Every thread
// calls it.
__device__ void ggml_soft_max_rest(float* v, int n, float mx) {
    __shared__ float inv_sum;
    double sum = ggml_exp_sum(v, n, mx);
    if (threadIdx.x == 0) inv_sum = (float)(1.0 / sum);
    __syncthreads();
    float inv = inv_sum;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = __fmul_rn(v[i], inv);
    __syncthreads();
}

// --- products: one warp per output row -----------------------------------------
//
// A block of 256 threads computes MM_ROWS = 8 output rows, one warp each.
// A row's dot product is split into units (see `row_dot`); lane l takes
// units l, l + 32, ..., so neighbouring lanes read neighbouring bytes. Each
// lane sums in f32 for up to MM_NB activation rows at once (the weight unit
// decoded once for all of them), then the warp reduces by shuffles.

#define MM_ROWS 8
// NVRTC's -DMM_NB=N (SEAM_NVRTC_EXTRA) tries another width when tuning: a
// prefill's weights are read once per MM_NB activation rows.
#ifndef MM_NB
#define MM_NB 4
#endif
static_assert(MM_NB >= 1 && MM_NB <= 32, "MM_NB activation rows fit a u32 mask");

typedef unsigned long long u64;

// Σ q[i] * x[i] for i < K (K a multiple of 4), x read as float4 where xa
// (x 16-byte aligned), in four partial sums of fused multiply-adds (one
// rounding a term: the products' tolerance holds, and half the
// instructions of --fmad=false's separate multiply and add).
template <int K>
__device__ __forceinline__ float dotx(const float* q, const float* x, bool xa) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    if (xa) {
#pragma unroll
        for (int i = 0; i < K; i += 4) {
            float4 v = *(const float4*)(x + i);
            s0 = __fmaf_rn(q[i], v.x, s0);
            s1 = __fmaf_rn(q[i + 1], v.y, s1);
            s2 = __fmaf_rn(q[i + 2], v.z, s2);
            s3 = __fmaf_rn(q[i + 3], v.w, s3);
        }
    } else {
#pragma unroll
        for (int i = 0; i < K; i += 4) {
            s0 = __fmaf_rn(q[i], x[i], s0);
            s1 = __fmaf_rn(q[i + 1], x[i + 1], s1);
            s2 = __fmaf_rn(q[i + 2], x[i + 2], s2);
            s3 = __fmaf_rn(q[i + 3], x[i + 3], s3);
        }
    }
    return (s0 + s1) + (s2 + s3);
}

// The generic unit: 32 elements from element 32u, each through deq<T>
// (correct for every type, its scales decoded per element).
template <int T, int NB>
__device__ __forceinline__ void unit_deq(const u8* row, int u, const float* const* xr, u32 live,
                                         float* acc) {
    int off = 32 * u;
#pragma unroll 1
    for (int i = off; i < off + 32; ++i) {
        float wv = deq<T>(row, i);
#pragma unroll
        for (int j = 0; j < NB; ++j)
            if ((live >> j) & 1) acc[j] += wv * xr[j][i];
    }
}

// N little-endian 32-bit words from p (any alignment): 16-byte vector
// loads where p is 16-byte aligned and N a multiple of 4 (the K-quants'
// quant runs in an aligned row: 2 loads for 32 bytes, not 9), else
// aligned 32-bit loads funnel-shifted into place: every word loaded holds
// at least one of the 4N bytes, so no load leaves the allocation they are
// in.
template <int N>
__device__ __forceinline__ void ldw(const u8* p, u32* out) {
    u64 a = (u64)p;
    if constexpr (N % 4 == 0) {
        if ((a & 15) == 0) {
            const uint4* v = (const uint4*)p;
#pragma unroll
            for (int i = 0; i < N / 4; ++i) {
                uint4 t = v[i];
                out[4 * i] = t.x;
                out[4 * i + 1] = t.y;
                out[4 * i + 2] = t.z;
                out[4 * i + 3] = t.w;
            }
            return;
        }
    }
    const u32* q = (const u32*)(a & ~3ull);
    u32 sh = (u32)(a & 3) * 8;
    u32 lo = q[0];
#pragma unroll
    for (int i = 0; i < N; ++i) {
        u32 hi = (i + 1 < N || sh != 0) ? q[i + 1] : 0u;
        out[i] = __funnelshift_r(lo, hi, sh);
        lo = hi;
    }
}

// Byte k of w.
__device__ __forceinline__ u32 byte_of(u32 w, int k) { return (w >> (8 * k)) & 0xffu; }

// v - C as a float, exactly (v < 2^23, C small): the bits of 2^23 + v less
// 2^23 + C, no integer conversion.
template <int C>
__device__ __forceinline__ float uf(u32 v) {
    return __uint_as_float(0x4b000000u | v) - (float)(8388608 + C);
}

// Four signed bytes packed little-endian in a word.
#define PACK4(a, b, c, d) \
    ((u32)(u8)(i8)(a) | ((u32)(u8)(i8)(b) << 8) | ((u32)(u8)(i8)(c) << 16) | ((u32)(u8)(i8)(d) << 24))

// Entry q (0..15) of a 16-entry table of signed bytes packed in t0..t3,
// plus 128 (so uf<128> gives the entry).
__device__ __forceinline__ u32 lut16(u32 t0, u32 t1, u32 t2, u32 t3, u32 q) {
    u32 v = q < 8 ? __byte_perm(t0, t1, q) : __byte_perm(t2, t3, q - 8);
    return (v & 0xffu) ^ 0x80u;
}

// IQ4_NL's code book (iq4nl_value) and the doubled E2M1 points
// (fp4_value), as lut16 tables.
#define IQ4NL_LUT                                                                  \
    PACK4(-127, -104, -83, -65), PACK4(-49, -35, -22, -10), PACK4(1, 13, 25, 38), \
        PACK4(53, 69, 89, 113)
#define FP4_LUT PACK4(0, 1, 2, 3), PACK4(4, 6, 8, 12), PACK4(0, -1, -2, -3), PACK4(-4, -6, -8, -12)

// Σ q[i] x[i] and Σ x[i] (into *sx) for i < K, as dotx.
template <int K>
__device__ __forceinline__ float dotx_sum(const float* q, const float* x, bool xa, float* sx) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f, t0 = 0.0f, t1 = 0.0f;
#pragma unroll
    for (int i = 0; i < K; i += 4) {
        float v0, v1, v2, v3;
        if (xa) {
            float4 v = *(const float4*)(x + i);
            v0 = v.x, v1 = v.y, v2 = v.z, v3 = v.w;
        } else {
            v0 = x[i], v1 = x[i + 1], v2 = x[i + 2], v3 = x[i + 3];
        }
        s0 = __fmaf_rn(q[i], v0, s0);
        s1 = __fmaf_rn(q[i + 1], v1, s1);
        s2 = __fmaf_rn(q[i + 2], v2, s2);
        s3 = __fmaf_rn(q[i + 3], v3, s3);
        t0 += v0 + v1;
        t1 += v2 + v3;
    }
    *sx = t0 + t1;
    return (s0 + s1) + (s2 + s3);
}

// acc[j] += d * (q · unit u of x_j) for the rows j in `live`.
template <int NB>
__device__ __forceinline__ void acc_unit(const float* q, float d, int u, const float* const* xr,
                                         u32 live, bool xa, float* acc) {
    i64 off = 32 * (i64)u;
#pragma unroll
    for (int j = 0; j < NB; ++j)
        if ((live >> j) & 1) acc[j] += d * dotx<32>(q, xr[j] + off, xa);
}

// The units of the block types. A unit's dot goes into acc[j] for each
// activation row j in `live` (xr[j] the row's start, element e of unit u
// at xr[j][off + ...]). Legacy 32-element blocks are split in halves
// (units of 16 elements: lane-sized shares of the short rows of expert
// products); for the nibble types half h holds bytes 8h..8h+8 of qs, so
// elements 8h..8h+8 (low nibbles) and 16+8h..16+8h+8 (high nibbles).

// The nibble halves of Q4_0, Q4_1, MXFP4: `L` the type. The codes lo
// (elements 8h..) and hi (16+8h..) as floats: q - 8 (Q4_0), q (Q4_1), the
// code book (MXFP4); d and (Q4_1) m the block's scale and min.
template <int L, int NB>
__device__ __forceinline__ void unit_nibbles(const u8* row, int u, const float* const* xr,
                                             u32 live, bool xa, float* acc) {
    constexpr int BB = L == T_Q4_0 ? 18 : L == T_Q4_1 ? 20 : 17;
    constexpr int QS = L == T_Q4_1 ? 4 : L == T_MXFP4 ? 1 : 2;
    const u8* b = row + (i64)(u >> 1) * BB;
    int h = u & 1;
    float d, m = 0.0f;
    if (L == T_MXFP4) {
        u32 ex = b[0];
        d = __uint_as_float(ex < 2 ? (0x00200000u << ex) : ((ex - 1) << 23));
    } else {
        d = f16_at(b);
        if (L == T_Q4_1) m = f16_at(b + 2);
    }
    u32 w[2];
    ldw<2>(b + QS + 8 * h, w);
    float lo[8], hi[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        u32 c = byte_of(w[i >> 2], i & 3);
        if (L == T_Q4_0) {
            lo[i] = uf<8>(c & 0xfu);
            hi[i] = uf<8>(c >> 4);
        } else if (L == T_Q4_1) {
            lo[i] = uf<0>(c & 0xfu);
            hi[i] = uf<0>(c >> 4);
        } else {
            lo[i] = uf<128>(lut16(FP4_LUT, c & 0xfu));
            hi[i] = uf<128>(lut16(FP4_LUT, c >> 4));
        }
    }
    i64 off = 32 * (i64)(u >> 1) + 8 * h;
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        if (!((live >> j) & 1)) continue;
        const float* x = xr[j] + off;
        if (L == T_Q4_1) {
            float s1, s2;
            float a = dotx_sum<8>(lo, x, xa, &s1) + dotx_sum<8>(hi, x + 16, xa, &s2);
            acc[j] += d * a + m * (s1 + s2);
        } else {
            acc[j] += d * (dotx<8>(lo, x, xa) + dotx<8>(hi, x + 16, xa));
        }
    }
}

// Q5_0 { f16 d; u32 qh; u8 qs[16] } and Q5_1 { f16 d, m; u32 qh; u8 qs[16] }:
// the nibble halves plus bit e of qh for element e.
template <int L, int NB>
__device__ __forceinline__ void unit_q5(const u8* row, int u, const float* const* xr, u32 live,
                                        bool xa, float* acc) {
    constexpr int BB = L == T_Q5_0 ? 22 : 24, QH = L == T_Q5_0 ? 2 : 4;
    const u8* b = row + (i64)(u >> 1) * BB;
    int h = u & 1;
    float d = f16_at(b), m = L == T_Q5_1 ? f16_at(b + 2) : 0.0f;
    u32 qh;
    ldw<1>(b + QH, &qh);
    qh >>= 8 * h;
    u32 w[2];
    ldw<2>(b + QH + 4 + 8 * h, w);
    float lo[8], hi[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        u32 c = byte_of(w[i >> 2], i & 3);
        u32 ql = (c & 0xfu) | (((qh >> i) & 1u) << 4);
        u32 qu = (c >> 4) | (((qh >> (16 + i)) & 1u) << 4);
        if (L == T_Q5_0) {
            lo[i] = uf<16>(ql);
            hi[i] = uf<16>(qu);
        } else {
            lo[i] = uf<0>(ql);
            hi[i] = uf<0>(qu);
        }
    }
    i64 off = 32 * (i64)(u >> 1) + 8 * h;
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        if (!((live >> j) & 1)) continue;
        const float* x = xr[j] + off;
        if (L == T_Q5_1) {
            float s1, s2;
            float a = dotx_sum<8>(lo, x, xa, &s1) + dotx_sum<8>(hi, x + 16, xa, &s2);
            acc[j] += d * a + m * (s1 + s2);
        } else {
            acc[j] += d * (dotx<8>(lo, x, xa) + dotx<8>(hi, x + 16, xa));
        }
    }
}

// Units of the 256-element super-blocks: sub-block g = u % 8 (elements
// 32g..32g+32) of super-block u / 8.

// Q2_K { u8 scales[16]; u8 qs[64]; f16 d, dmin }: bits 2(g % 4) of
// qs[32(g/4) + l]; per 16 elements (d * (sc & 15)) * q - dmin * (sc >> 4).
// Q3_K { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d }: the same 2-bit
// codes, minus 4 where bit g of hmask[l] is clear; per 16 elements
// d * (s - 32) with 6-bit s. TQ2_0 { u8 qs[64]; f16 d }: the same codes,
// d * (q - 1).
template <int L, int NB>
__device__ __forceinline__ void unit_2bit(const u8* row, int u, const float* const* xr, u32 live,
                                          bool xa, float* acc) {
    constexpr int BB = L == T_Q2_K ? 84 : L == T_Q3_K ? 110 : 66;
    constexpr int QS = L == T_Q2_K ? 16 : L == T_Q3_K ? 32 : 0;
    const u8* b = row + (i64)(u >> 3) * BB;
    int g = u & 7;
    u32 w[8], hm[8];
    ldw<8>(b + QS + 32 * (g >> 2), w);
    if (L == T_Q3_K) ldw<8>(b, hm);
    int sh = 2 * (g & 3);
    float q[32];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        u32 v = (w[t] >> sh) & 0x03030303u;
        if (L == T_Q3_K) v |= ((hm[t] >> g) & 0x01010101u) << 2;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            u32 c = byte_of(v, k);
            q[4 * t + k] = L == T_Q2_K ? uf<0>(c) : L == T_Q3_K ? uf<4>(c) : uf<1>(c);
        }
    }
    i64 off = 32 * (i64)u;
    if (L == T_Q2_K) {
        float d = f16_at(b + 80), dmin = f16_at(b + 82);
        u32 sc0 = b[2 * g], sc1 = b[2 * g + 1];
        float dl0 = d * (float)(sc0 & 0xf), ml0 = dmin * (float)(sc0 >> 4);
        float dl1 = d * (float)(sc1 & 0xf), ml1 = dmin * (float)(sc1 >> 4);
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            if (!((live >> j) & 1)) continue;
            const float* x = xr[j] + off;
            float sx0, sx1;
            float a0 = dotx_sum<16>(q, x, xa, &sx0);
            float a1 = dotx_sum<16>(q + 16, x + 16, xa, &sx1);
            acc[j] += (dl0 * a0 - ml0 * sx0) + (dl1 * a1 - ml1 * sx1);
        }
    } else if (L == T_Q3_K) {
        const u8* sc = b + 96;
        float d = f16_at(b + 108);
        float dl[2];
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            int k = 2 * g + s;
            int low = k < 8 ? (sc[k] & 0xf) : (sc[k - 8] >> 4);
            int high = (sc[8 + k % 4] >> (2 * (k / 4))) & 3;
            dl[s] = d * (float)((low | (high << 4)) - 32);
        }
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            if (!((live >> j) & 1)) continue;
            const float* x = xr[j] + off;
            acc[j] += dl[0] * dotx<16>(q, x, xa) + dl[1] * dotx<16>(q + 16, x + 16, xa);
        }
    } else {
        float d = f16_at(b + 64);
#pragma unroll
        for (int j = 0; j < NB; ++j)
            if ((live >> j) & 1) acc[j] += d * dotx<32>(q, xr[j] + off, xa);
    }
}

// TQ1_0 { u8 qs[48]; u8 qh[4]; f16 d }: sub-blocks 0..5 are digit g of
// qs[l]; 5 and 6 digits 2(g - 5) (l < 16) and 2(g - 5) + 1 (l >= 16) of
// qs[32 + l % 16]; 7 digit 4 of qs[32 + l] (l < 16), then digit
// (l - 16) / 4 of qh[(l - 16) % 4]. The value d * (digit - 1).
template <int NB>
__device__ __forceinline__ void unit_tq1_0(const u8* row, int u, const float* const* xr, u32 live,
                                           bool xa, float* acc) {
    const u8* b = row + (i64)(u >> 3) * 54;
    int g = u & 7;
    float q[32];
    if (g < 5) {
        u32 w[8];
        ldw<8>(b, w);
        u32 pw = pow3(g);
#pragma unroll
        for (int l = 0; l < 32; ++l) q[l] = uf<1>(tq1_digit(byte_of(w[l >> 2], l & 3), pw));
    } else {
        u32 w[4];
        ldw<4>(b + 32, w);
        if (g < 7) {
            u32 p0 = pow3(2 * (g - 5)), p1 = pow3(2 * (g - 5) + 1);
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                u32 c = byte_of(w[l >> 2], l & 3);
                q[l] = uf<1>(tq1_digit(c, p0));
                q[l + 16] = uf<1>(tq1_digit(c, p1));
            }
        } else {
            u32 qh;
            ldw<1>(b + 48, &qh);
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                q[l] = uf<1>(tq1_digit(byte_of(w[l >> 2], l & 3), 81u));
                q[l + 16] = uf<1>(tq1_digit(byte_of(qh, l & 3), pow3(l >> 2)));
            }
        }
    }
    float d = f16_at(b + 52);
    i64 off = 32 * (i64)u;
#pragma unroll
    for (int j = 0; j < NB; ++j)
        if ((live >> j) & 1) acc[j] += d * dotx<32>(q, xr[j] + off, xa);
}

// NVFP4 { u8 d[4]; u8 qs[32] }: units of 16 (sub-block s = u % 4 of block
// u / 4), scale ue4m3_half(d[s]), its 8 bytes qs[8s..] the low nibbles
// (elements 0..8) then the high (8..16).
template <int NB>
__device__ __forceinline__ void unit_nvfp4(const u8* row, int u, const float* const* xr, u32 live,
                                           bool xa, float* acc) {
    const u8* b = row + (i64)(u >> 2) * 36;
    int s = u & 3;
    float d = ue4m3_half(b[s]);
    u32 w[2];
    ldw<2>(b + 4 + 8 * s, w);
    float q[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        u32 c = byte_of(w[i >> 2], i & 3);
        q[i] = uf<128>(lut16(FP4_LUT, c & 0xfu));
        q[i + 8] = uf<128>(lut16(FP4_LUT, c >> 4));
    }
    i64 off = 16 * (i64)u;
#pragma unroll
    for (int j = 0; j < NB; ++j)
        if ((live >> j) & 1) acc[j] += d * dotx<16>(q, xr[j] + off, xa);
}

// Elements per unit of a block type.
template <int T>
__device__ constexpr int unit_elems() {
    return (T == T_Q4_0 || T == T_Q4_1 || T == T_Q5_0 || T == T_Q5_1 || T == T_MXFP4 ||
            T == T_NVFP4)
               ? 16
               : 32;
}

template <int T, int NB>
__device__ __forceinline__ void unit_dot(const u8* row, int u, const float* const* xr, u32 live,
                                         bool xa, float* acc) {
    if constexpr (T == T_Q4_0 || T == T_Q4_1 || T == T_MXFP4) {
        unit_nibbles<T, NB>(row, u, xr, live, xa, acc);
    } else if constexpr (T == T_Q5_0 || T == T_Q5_1) {
        unit_q5<T, NB>(row, u, xr, live, xa, acc);
    } else if constexpr (T == T_Q2_K || T == T_Q3_K || T == T_TQ2_0) {
        unit_2bit<T, NB>(row, u, xr, live, xa, acc);
    } else if constexpr (T == T_TQ1_0) {
        unit_tq1_0<NB>(row, u, xr, live, xa, acc);
    } else if constexpr (T == T_NVFP4) {
        unit_nvfp4<NB>(row, u, xr, live, xa, acc);
    } else {
        unit_deq<T, NB>(row, u, xr, live, acc);
    }
}

// acc[j] += (one lane's share of) row · x_j for the activation rows j in
// `live` (xr[j] the row's start). F32/F16/BF16: lane l takes the 16-byte
// chunks l, l + 32, ... of a 16-byte aligned row (one vector load each),
// then the elements past the last whole chunk (every element of an
// unaligned row) one by one. Block types: lane l takes units l, l + 32, ...
template <int T, int NB>
__device__ __forceinline__ void row_dot(const u8* row, int ne0, const float* const* xr, u32 live,
                                        bool xa, int lane, int stride, float* acc) {
    if constexpr (T == T_F32 || T == T_F16 || T == T_BF16) {
        constexpr int CH = T == T_F32 ? 4 : 8;
        int done = 0;
        if ((((u64)row) & 15) == 0) {
            int nc = ne0 / CH;
            for (int c = lane; c < nc; c += stride) {
                uint4 v = *(const uint4*)(row + 16 * (i64)c);
                u32 wv[4] = {v.x, v.y, v.z, v.w};
                float q[CH];
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    if (T == T_F32) {
                        q[t] = __uint_as_float(wv[t]);
                    } else if (T == T_F16) {
                        q[2 * t] = h2f((u16)(wv[t] & 0xffffu));
                        q[2 * t + 1] = h2f((u16)(wv[t] >> 16));
                    } else {
                        q[2 * t] = __uint_as_float(wv[t] << 16);
                        q[2 * t + 1] = __uint_as_float(wv[t] & 0xffff0000u);
                    }
                }
#pragma unroll
                for (int j = 0; j < NB; ++j)
                    if ((live >> j) & 1) acc[j] += dotx<CH>(q, xr[j] + (i64)CH * c, xa);
            }
            done = nc * CH;
        }
        for (int i = done + lane; i < ne0; i += stride) {
            float wv = deq<T>(row, i);
#pragma unroll
            for (int j = 0; j < NB; ++j)
                if ((live >> j) & 1) acc[j] += wv * xr[j][i];
        }
    } else {
        int nu = ne0 / unit_elems<T>();
        for (int u = lane; u < nu; u += stride) unit_dot<T, NB>(row, u, xr, live, xa, acc);
    }
}

// Whether activation rows of ne0 floats from xq are 16-byte aligned.
__device__ __forceinline__ bool x_aligned(const float* xq, int ne0) {
    return ((((u64)xq) & 15) == 0) && ((ne0 & 3) == 0);
}

// The lanes' sums acc reduced over the warp and, a block a row (parts > 1),
// over its warps in shared memory (lane 0 of warp 0 gets them).
template <int NB>
__device__ __forceinline__ void reduce_row(float* acc, int part, int parts) {
#pragma unroll
    for (int j = 0; j < NB; ++j) acc[j] = warp_sum(acc[j]);
    if (parts > 1) {
        __shared__ float red[MM_ROWS][MM_NB];
        __syncthreads();
        if ((threadIdx.x & 31) == 0) {
#pragma unroll
            for (int j = 0; j < NB; ++j) red[part][j] = acc[j];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
#pragma unroll
            for (int j = 0; j < NB; ++j) {
                float t = 0.0f;
                for (int q = 0; q < parts; ++q) t += red[q][j];
                acc[j] = t;
            }
        }
    }
}

// --- float products in ggml's lanes --------------------------------------------
// ggml's F32, F16 and BF16 dots (ggml_vec_dot_f32/_f16/_bf16; family-ops'
// dot_f32, dot_f16, dot_bf16) keep 32 accumulators (4 registers of 8
// lanes): accumulator k takes fma(w, x, acc) over element k of each whole
// 32, so a warp computes a row as ggml does, lane k accumulator k, its
// loads coalesced; the lanes then meet as ggml's registers do.

// Whether products follow ggml's order where a type has it: compiling
// with -DSEAM_SUMMED_PRODUCTS (SEAM_NVRTC_EXTRA) sums every type in any
// order, to measure what the order costs.
#ifdef SEAM_SUMMED_PRODUCTS
#define GGML_ORDER false
#else
#define GGML_ORDER true
#endif

template <int T>
__device__ __forceinline__ constexpr bool ggml_float_lanes() {
    return GGML_ORDER && (T == T_F32 || T == T_F16 || T == T_BF16);
}

// Element i of a row of T (F32/F16/BF16): one load where the row is
// aligned to its elements (staged rows are), deq's bytes where not.
template <int T>
__device__ __forceinline__ float float_at(const u8* row, bool aligned, int i) {
    if (!aligned) return deq<T>(row, i);
    if constexpr (T == T_F32) return ((const float*)row)[i];
    else if constexpr (T == T_F16) return h2f(((const u16*)row)[i]);
    else return __uint_as_float((u32)((const u16*)row)[i] << 16);
}

// Whether a row of T is aligned to its elements.
template <int T>
__device__ __forceinline__ bool float_aligned(const u8* row) {
    return ((u64)row & (T == T_F32 ? 3 : 1)) == 0;
}

// Lane k's accumulator over the whole 32s of a row of T (F32/F16/BF16) for
// the activation rows in `live` (phase one). The chain leaves a row 32
// threads, so each loads a batch of its elements (32 for one activation
// row, a decode's) before it multiplies.
template <int T, int NB>
__device__ __forceinline__ void float_lane_chain(const u8* row, int ne0, const float* const* xr,
                                                 u32 live, int k, float* a) {
    constexpr int BATCH = NB == 1 ? 32 : 8;
#pragma unroll
    for (int j = 0; j < NB; ++j) a[j] = 0.0f;
    bool aligned = float_aligned<T>(row);
    auto w_at = [&](int i) { return float_at<T>(row, aligned, i); };
    int chunks = ne0 >> 5, c = 0;
    for (; c + BATCH <= chunks; c += BATCH) {
        float w[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; ++b) w[b] = w_at(32 * (c + b) + k);
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            if ((live >> j) & 1) {
                float x[BATCH];
#pragma unroll
                for (int b = 0; b < BATCH; ++b) x[b] = xr[j][32 * (c + b) + k];
#pragma unroll
                for (int b = 0; b < BATCH; ++b) a[j] = __fmaf_rn(w[b], x[b], a[j]);
            }
        }
    }
    for (; c < chunks; ++c) {
        float w = w_at(32 * c + k);
#pragma unroll
        for (int j = 0; j < NB; ++j)
            if ((live >> j) & 1) a[j] = __fmaf_rn(w, xr[j][32 * c + k], a[j]);
    }
}

// A row's sum from its 8 lanes v (each (c1 + c3) + (c2 + c4) of ggml's
// registers) and its leftovers: F32's and F16's reduced as
// GGML_F32x8_REDUCE, BF16's as hsum_float_8 (phase two).
template <int T>
__device__ __forceinline__ float float_lanes_sum(const float* v, const u8* row, int ne0,
                                                 const float* x) {
    auto w = [&](int i) { return deq<T>(row, i); };
    auto xi = [&](int i) { return x[i]; };
    int np = ne0 & ~31;
    if constexpr (T == T_F32) return ggml_dot_f32_tail(reduce_hadd8(v), w, xi, np, ne0);
    else if constexpr (T == T_F16) return ggml_dot_f16_tail(reduce_hadd8(v), w, xi, np, ne0);
    else return ggml_dot_f16_tail(reduce_movehl8(v), w, xi, np, ne0);
}

// The lanes' accumulators a (lane k's) met as ggml's registers meet, for
// each activation row in `live` (every lane gets the sums).
template <int T, int NB>
__device__ __forceinline__ void float_lanes_meet(const u8* row, int ne0, const float* const* xr,
                                                 u32 live, const float* a, float* acc) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
        // lane l < 8: (acc_l + acc_{16+l}) + (acc_{8+l} + acc_{24+l})
        float s16 = __shfl_down_sync(0xffffffffu, a[j], 16);
        float s8 = __shfl_down_sync(0xffffffffu, a[j], 8);
        float s24 = __shfl_down_sync(0xffffffffu, a[j], 24);
        float lane = __fadd_rn(__fadd_rn(a[j], s16), __fadd_rn(s8, s24));
        float v[8];
#pragma unroll
        for (int l = 0; l < 8; ++l) v[l] = __shfl_sync(0xffffffffu, lane, l);
        acc[j] = ((live >> j) & 1) ? float_lanes_sum<T>(v, row, ne0, xr[j]) : 0.0f;
    }
}

// Row r's F32/F16/BF16 products in ggml's lanes, a warp a row (every lane
// gets them).
template <int T, int NB>
__device__ __forceinline__ void float_lanes_row(const u8* row, int ne0, const float* const* xr,
                                                u32 live, float* acc) {
    float a[NB];
    float_lane_chain<T, NB>(row, ne0, xr, live, threadIdx.x & 31, a);
    float_lanes_meet<T, NB>(row, ne0, xr, live, a, acc);
}
// (end of float_lanes_row)

// float_lanes_row for few long rows, a block a row: the block's threads
// load a round of FL_ROUND whole 32s of the weight into shared memory
// (many loads in flight), then the lead warp's lanes extend their chains
// over it, x read where it is. Lane 0 of the lead warp gets the sums;
// every thread of the block must call it.
#define FL_ROUND 128
template <int T, int NB>
__device__ __forceinline__ void float_lanes_block_row(const u8* row, int ne0,
                                                      const float* const* xr, u32 live, int part,
                                                      float* acc) {
    __shared__ float ws[FL_ROUND * 32];
    int k = threadIdx.x & 31;
    bool aligned = float_aligned<T>(row);
    float a[NB];
#pragma unroll
    for (int j = 0; j < NB; ++j) a[j] = 0.0f;
    int chunks = ne0 >> 5;
    for (int c0 = 0; c0 < chunks; c0 += FL_ROUND) {
        int n = min(FL_ROUND, chunks - c0);
        for (int e = threadIdx.x; e < 32 * n; e += blockDim.x) ws[e] = float_at<T>(row, aligned, 32 * c0 + e);
        __syncthreads();
        if (part == 0) {
#pragma unroll 8
            for (int c = 0; c < n; ++c) {
                float w = ws[32 * c + k];
#pragma unroll
                for (int j = 0; j < NB; ++j)
                    if ((live >> j) & 1) a[j] = __fmaf_rn(w, xr[j][32 * (c0 + c) + k], a[j]);
            }
        }
        __syncthreads();
    }
    if (part == 0) float_lanes_meet<T, NB>(row, ne0, xr, live, a, acc);
}
// (end of float_lanes_block_row)

// Row r's products with the activation rows in `live` (xr), reduced into
// acc. One warp a row (parts == 1): every lane gets the sums. A block a
// row (parts == MM_ROWS, few long rows): warp `part` takes the lanes'
// units part * 32 + lane, stepping by the block, and the warps' sums meet
// in shared memory; lane 0 of warp 0 gets them. Every thread of a block a
// row must call it (it synchronizes the block).
template <int T, int NB>
__device__ __forceinline__ void summed_row(const u8* row, int ne0, const float* const* xr, u32 live,
                                           bool xa, int part, int parts, float* acc) {
#pragma unroll
    for (int j = 0; j < NB; ++j) acc[j] = 0.0f;
    row_dot<T, NB>(row, ne0, xr, live, xa, part * 32 + (threadIdx.x & 31), 32 * parts, acc);
    reduce_row<NB>(acc, part, parts);
}
// (end of summed_row)

// Row r's products (lane 0 of the lead warp gets them): F32/F16/BF16 in
// ggml's lanes, the others summed.
template <int T, int NB>
__device__ __forceinline__ void warp_row(const u8* row, int ne0, const float* const* xr, u32 live,
                                         bool xa, int part, int parts, float* acc) {
    if constexpr (ggml_float_lanes<T>()) {
        if (parts > 1) float_lanes_block_row<T, NB>(row, ne0, xr, live, part, acc);
        else float_lanes_row<T, NB>(row, ne0, xr, live, acc);
    } else {
        summed_row<T, NB>(row, ne0, xr, live, xa, part, parts, acc);
    }
}

// The row a thread's warp works on, and its part of it: a block a row
// when the grid has a block for every row (few long rows: the host
// launches it so), else MM_ROWS rows a block, a warp each.
struct RowPart {
    int r, part, parts;
    bool lead;
};

__device__ __forceinline__ RowPart row_part(int rows) {
    RowPart p;
    if (gridDim.x >= (unsigned)rows) {
        p.r = blockIdx.x;
        p.part = threadIdx.x >> 5;
        p.parts = MM_ROWS;
        p.lead = threadIdx.x == 0;
    } else {
        p.r = blockIdx.x * MM_ROWS + (threadIdx.x >> 5);
        p.part = 0;
        p.parts = 1;
        p.lead = (threadIdx.x & 31) == 0;
    }
    return p;
}

// y[b][r] = sum_i W[r][i] * xq[b][i]: warp w of block (g, c) takes row
// 8g + w and activation rows b0 .. b0 + MM_NB for b0 = MM_NB * c,
// MM_NB * (c + gridDim.y), ...
template <int T>
__device__ void matmul_impl(const u8* w, const float* xq, float* y, int ne0, int rows, int n,
                            i64 row_bytes) {
    RowPart rp = row_part(rows);
    int r = rp.r;
    if (r >= rows) return;  // never in a block a row: the whole block stays
    const u8* row = w + (i64)r * row_bytes;
    bool xa = x_aligned(xq, ne0);
    bool lead = rp.lead;
    for (i64 b0 = (i64)blockIdx.y * MM_NB; b0 < n; b0 += (i64)gridDim.y * MM_NB) {
        if (b0 + 1 == n) {
            const float* xr[1] = {xq + b0 * ne0};
            float acc[1];
            warp_row<T, 1>(row, ne0, xr, 1u, xa, rp.part, rp.parts, acc);
            if (lead) y[b0 * rows + r] = acc[0];
        } else {
            int nb = n - b0 < MM_NB ? (int)(n - b0) : MM_NB;
            const float* xr[MM_NB];
            float acc[MM_NB];
#pragma unroll
            for (int j = 0; j < MM_NB; ++j) xr[j] = xq + (b0 + (j < nb ? j : 0)) * ne0;
            warp_row<T, MM_NB>(row, ne0, xr, (1u << nb) - 1u, xa, rp.part, rp.parts, acc);
            if (lead) {
#pragma unroll
                for (int j = 0; j < MM_NB; ++j)
                    if (j < nb) y[(b0 + j) * rows + r] = acc[j];
            }
        }
    }
}

// The picks p0 .. p0 + np (np <= MM_NB) of an expert product's group, by
// expert: bad(p) for a pick whose id is outside [0, n_expert), then
// group(e, i, live) once for each expert e the others name, i the first
// pick naming it (p0 + i) and live the mask of those that do (bit j: pick
// p0 + j), which share one pass over its rows.
template <class Bad, class Group>
__device__ __forceinline__ void for_each_expert(const int* ids, i64 p0, int np, int n_expert,
                                                Bad bad, Group group) {
    int e[MM_NB];
#pragma unroll
    for (int j = 0; j < MM_NB; ++j) e[j] = j < np ? ids[p0 + j] : -1;
    u32 done = 0;
    for (int i = 0; i < np; ++i) {
        if ((done >> i) & 1) continue;
        int ei = e[i];
        if (ei < 0 || ei >= n_expert) {
            bad(p0 + i);
            done |= 1u << i;
            continue;
        }
        u32 live = 0;
#pragma unroll
        for (int j = 0; j < MM_NB; ++j)
            if (j >= i && j < np && !((done >> j) & 1) && e[j] == ei) live |= 1u << j;
        done |= live;
        group(ei, i, live);
    }
}

// Expert products (ggml's mul_mat_id): warp w of block (g, c) takes row
// 8g + w of expert ids[p] for the picks p of groups of MM_NB (groups c,
// c + gridDim.y, ...), by activation row p (per_pick) or p / k; the picks
// of a group with the same expert share one pass over its row
// (for_each_expert). An id outside [0, n_expert) writes NaN (nothing is
// read back).
template <int T>
__device__ void matmul_id_impl(const u8* w, const float* xq, const int* ids, float* y, int ne0,
                               int rows, int n_expert, int picks, int k, int per_pick,
                               i64 row_bytes) {
    RowPart rp = row_part(rows);
    int r = rp.r;
    if (r >= rows) return;  // never in a block a row: the whole block stays
    bool xa = x_aligned(xq, ne0);
    bool lead = rp.lead;
    for (i64 p0 = (i64)blockIdx.y * MM_NB; p0 < picks; p0 += (i64)gridDim.y * MM_NB) {
        int np = picks - p0 < MM_NB ? (int)(picks - p0) : MM_NB;
        const float* xr[MM_NB];
#pragma unroll
        for (int j = 0; j < MM_NB; ++j) {
            i64 p = p0 + (j < np ? j : 0);
            xr[j] = xq + (per_pick ? p : p / k) * ne0;
        }
        for_each_expert(
            ids, p0, np, n_expert,
            [&](i64 p) {
                if (lead) y[p * rows + r] = __int_as_float(0x7fc00000);
            },
            [&](int ei, int i, u32 live) {
                const u8* row = w + ((i64)ei * rows + r) * row_bytes;
                if (live == (1u << i)) {
                    const float* x1[1] = {xr[i]};
                    float acc[1];
                    warp_row<T, 1>(row, ne0, x1, 1u, xa, rp.part, rp.parts, acc);
                    if (lead) y[(p0 + i) * rows + r] = acc[0];
                } else {
                    float acc[MM_NB];
                    warp_row<T, MM_NB>(row, ne0, xr, live, xa, rp.part, rp.parts, acc);
                    if (lead) {
#pragma unroll
                        for (int j = 0; j < MM_NB; ++j)
                            if ((live >> j) & 1) y[(p0 + j) * rows + r] = acc[j];
                    }
                }
            });
    }
}

// --- int8 products ------------------------------------------------------------
// Products against the weight types whose activations ggml's CPU rounds to
// int8 blocks (Q8_0: 32, Q8_K: 256 elements, a float scale each;
// `act_*_i8`): a lane takes 32-element units as the float products do,
// decodes a unit's codes once into 8 words of signed bytes, multiplies
// them by each activation row's int8 codes four at a time (dp4a, exact in
// 32 bits) and scales the integer sums once. A quarter of the float
// products' activation bytes and a fraction of their instructions.

// c + Σ_k (signed byte k of a) * (signed byte k of b).
__device__ __forceinline__ int dp4a(u32 a, u32 b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// 0xff in byte k where bit k of the 4-bit `bits` is set, else 0.
__device__ __forceinline__ u32 sign_bytes(u32 bits) {
    return ((bits * 0x00204081u) & 0x01010101u) * 0xffu;
}

// The grid bytes of g (each 1..127), negated where bit k of the 4-bit
// `bits` is set: complement plus one a byte, which never carries (a
// complemented byte is at most 0xfe).
__device__ __forceinline__ u32 signed_grid(u32 g, u32 bits) {
    u32 m = sign_bytes(bits);
    return (g ^ m) + (m & 0x01010101u);
}

// Σ_t dp4a(v[t], x[t]) for t in [A, B).
template <int A, int B>
__device__ __forceinline__ int dot_words(const u32* v, const u32* x) {
    int s = 0;
#pragma unroll
    for (int t = A; t < B; ++t) s = dp4a(v[t], x[t], s);
    return s;
}

// Σ of the signed bytes of x[0..8).
__device__ __forceinline__ int sum_words(const u32* x) {
    int s = 0;
#pragma unroll
    for (int t = 0; t < 8; ++t) s = dp4a(0x01010101u, x[t], s);
    return s;
}

// A weight unit decoded for the int8 products: its 32 codes as 8 words of
// signed bytes and its scales. Its product with a row's int8 codes x (8
// words) of block scale xd is xd * (c0 * (w[0..4] · x[0..4]) + c1 *
// (w[4..8] · x[4..8]) - m * Σ x), m nonzero only for Q4_K and Q5_K.
struct UnitI8 {
    u32 w[8];
    float c0, c1, m;
};

// A 16-entry table of signed bytes (t0..t3, as lut16's) at the four codes
// (0..15) in the bytes of v, as a word of signed bytes: __byte_perm picks
// each byte from the table's first or second half by the code's low 3
// bits, its bit 3 which.
__device__ __forceinline__ u32 lut16_word(u32 t0, u32 t1, u32 t2, u32 t3, u32 v) {
    u32 s = v & 0x07070707u;
    u32 sel = (s & 0x7u) | ((s >> 4) & 0x70u) | ((s >> 8) & 0x700u) | ((s >> 12) & 0x7000u);
    u32 lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    u32 m = ((v >> 3) & 0x01010101u) * 0xffu;
    return (lo & ~m) | (hi & m);
}

// IQ4_NL's code book at the four codes in the bytes of v.
__device__ __forceinline__ u32 iq4nl_word(u32 v) { return lut16_word(IQ4NL_LUT, v); }

// The 32 codes of IQ4_NL's 16 bytes of nibbles at qs (IQ4_NL's block,
// IQ4_XS's 32s) as 8 words of signed bytes: element j is qs[j % 16]'s low
// nibble for j < 16, its high one past.
__device__ __forceinline__ void iq4nl_codes(const u8* qs, u32* w) {
    u32 q[4];
    ldw<4>(qs, q);
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        w[t] = iq4nl_word(q[t] & 0x0f0f0f0fu);
        w[t + 4] = iq4nl_word((q[t] >> 4) & 0x0f0f0f0fu);
    }
}

// Unit u of a row of T as ggml's lanes take it (T a type of
// ggml_lanes_i8): its 32 codes as 8 words of signed bytes, its integer
// scale (each code's factor within the block: IQ4_XS's 6-bit s - 32,
// Q8_0's and IQ4_NL's 1) and its block's d.
template <int T>
__device__ __forceinline__ void lanes_decode(const u8* row, int u, u32* w, int* ls, float* d) {
    if constexpr (T == T_Q8_0) {
        const u8* b = row + (i64)u * 34;
        ldw<8>(b + 2, w);
        *ls = 1;
        *d = f16_at(b);
    } else if constexpr (T == T_IQ4_NL) {  // { f16 d; u8 qs[16] }
        const u8* b = row + (i64)u * 18;
        *ls = 1;
        *d = f16_at(b);
        iq4nl_codes(b + 2, w);
    } else {  // IQ4_XS { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128] }
        const u8* b = row + (i64)(u >> 3) * 136;
        int g = u & 7;
        int low = (b[4 + g / 2] >> (4 * (g % 2))) & 0xf;
        int high = (ld16(b + 2) >> (2 * g)) & 3;
        *ls = (low | (high << 4)) - 32;
        *d = f16_at(b);
        iq4nl_codes(b + 8 + 16 * g, w);
    }
}

// Unit u of a row of Q4_K or Q5_K (the 32 codes g = u % 8 of block
// u / 8): its unsigned codes as 8 words of bytes, the 32's 6-bit scale and
// min; returns the block.
template <int T>
__device__ __forceinline__ const u8* k45_unit(const u8* row, int u, u32* w, int* sc, int* mn) {
    const u8* b = row + (i64)(u >> 3) * (T == T_Q4_K ? 144 : 176);
    int g = u & 7;
    k4_scale_min(b + 4, g, sc, mn);
    u32 hb[8];
    ldw<8>(b + (T == T_Q4_K ? 16 : 48) + 32 * (g >> 1), w);
    if (T == T_Q5_K) ldw<8>(b + 16, hb);
    int sh = 4 * (g & 1);
#pragma unroll
    for (int t = 0; t < 8; ++t) {
        u32 v = (w[t] >> sh) & 0x0f0f0f0fu;
        if (T == T_Q5_K) v |= ((hb[t] >> g) & 0x01010101u) << 4;
        w[t] = v;
    }
    return b;
}

// Unit u of a Q6_K row (the 32 codes g = u % 8 of block u / 8): its
// unsigned 6-bit codes as 8 words of bytes; returns the block.
__device__ __forceinline__ const u8* q6k_unit(const u8* row, int u, u32* w) {
    const u8* b = row + (i64)(u >> 3) * 210;
    int g = u & 7, n = g >> 2;
    u32 hw[8];
    ldw<8>(b + 64 * n + 32 * (g & 1), w);
    ldw<8>(b + 128 + 32 * n, hw);
    int sl = 4 * ((g >> 1) & 1), sh = 2 * (g & 3);
#pragma unroll
    for (int t = 0; t < 8; ++t) w[t] = ((w[t] >> sl) & 0x0f0f0f0fu) | (((hw[t] >> sh) & 0x03030303u) << 4);
    return b;
}

// Unit u (elements 32u..32u+32) of a row of type T.
template <int T>
__device__ __forceinline__ void decode_i8(const u8* row, int u, UnitI8* o) {
    o->m = 0.0f;
    if constexpr (T == T_Q8_0 || T == T_IQ4_XS || T == T_IQ4_NL) {
        int ls;
        float d;
        lanes_decode<T>(row, u, o->w, &ls, &d);
        o->c0 = o->c1 = d * (float)ls;
    } else if constexpr (T == T_Q4_K || T == T_Q5_K) {
        int sc, mn;
        const u8* b = k45_unit<T>(row, u, o->w, &sc, &mn);
        o->c0 = o->c1 = f16_at(b) * (float)sc;
        o->m = f16_at(b + 2) * (float)mn;
    } else if constexpr (T == T_Q6_K) {
        int g = u & 7;
        const u8* b = q6k_unit(row, u, o->w);
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            // the 6-bit code v less 32, as a signed byte: bit 5 flipped,
            // then sign-extended from it (0x20 * 6 = 0xc0, no carry)
            u32 v = o->w[t] ^ 0x20202020u;
            o->w[t] = v | ((v & 0x20202020u) * 6u);
        }
        float d = f16_at(b + 208);
        o->c0 = d * (float)(i8)b[192 + 2 * g];
        o->c1 = d * (float)(i8)b[193 + 2 * g];
    } else if constexpr (T == T_IQ2_XXS) {
        const u8* b = row + (i64)(u >> 3) * 66;
        int g = u & 7;
        u32 w[2];
        ldw<2>(b + 2 + 8 * g, w);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            unsigned long long e = iq2xxs_grid[byte_of(w[0], l)];
            u32 sg = ksigns(w[1] >> (7 * l));
            o->w[2 * l] = signed_grid((u32)e, sg & 15u);
            o->w[2 * l + 1] = signed_grid((u32)(e >> 32), sg >> 4);
        }
        o->c0 = o->c1 = f16_at(b) * (0.5f + (float)(w[1] >> 28)) * 0.25f;
    } else if constexpr (T == T_IQ3_XXS) {
        const u8* b = row + (i64)(u >> 3) * 98;
        int g = u & 7;
        u32 w[2], aux[1];
        ldw<2>(b + 2 + 8 * g, w);
        ldw<1>(b + 66 + 4 * g, aux);
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            u32 sg = ksigns(aux[0] >> (7 * l));
            o->w[2 * l] = signed_grid(iq3xxs_grid[byte_of(w[l >> 1], 2 * (l & 1))], sg & 15u);
            o->w[2 * l + 1] = signed_grid(iq3xxs_grid[byte_of(w[l >> 1], 2 * (l & 1) + 1)], sg >> 4);
        }
        o->c0 = o->c1 = f16_at(b) * (0.5f + (float)(aux[0] >> 28)) * 0.5f;
    } else {  // IQ2_XS, IQ2_S: a scale a half
        const u8* b = row + (i64)(u >> 3) * (T == T_IQ2_XS ? 74 : 82);
        int g = u & 7;
        u32 sc;
        if constexpr (T == T_IQ2_XS) {
            u32 w[2];
            ldw<2>(b + 2 + 8 * g, w);
            sc = b[66 + g];
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                u32 v = (w[l >> 1] >> (16 * (l & 1))) & 0xffffu;
                unsigned long long e = iq2xs_grid[v & 511];
                u32 sg = ksigns(v >> 9);
                o->w[2 * l] = signed_grid((u32)e, sg & 15u);
                o->w[2 * l + 1] = signed_grid((u32)(e >> 32), sg >> 4);
            }
        } else {
            u32 lo[1], sgn[1];
            ldw<1>(b + 2 + 4 * g, lo);
            ldw<1>(b + 34 + 4 * g, sgn);
            u32 qh = b[66 + g];
            sc = b[74 + g];
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                unsigned long long e = iq2s_grid[byte_of(lo[0], l) | (((qh >> (2 * l)) & 3u) << 8)];
                u32 sg = byte_of(sgn[0], l);
                o->w[2 * l] = signed_grid((u32)e, sg & 15u);
                o->w[2 * l + 1] = signed_grid((u32)(e >> 32), sg >> 4);
            }
        }
        float d = f16_at(b);
        o->c0 = d * (0.5f + (float)(sc & 0xf)) * 0.25f;
        o->c1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
    }
}

// Elements of activations per int8 block scale for weights of T: Q8_0's
// blocks of 32 (Q8_0, IQ4_NL), Q8_K's of 256 for the rest (act_q8_0_i8,
// act_q8_k_i8).
template <int T>
__device__ __forceinline__ constexpr int act_block_i8() {
    return T == T_Q8_0 || T == T_IQ4_NL ? 32 : 256;
}

// Unit u's product with a row's int8 codes xq (the row's start) and block
// scales xd.
template <int T>
__device__ __forceinline__ float unit_row_i8(const UnitI8& un, int u, const u8* xq, const float* xd) {
    u32 x[8];
    ldw<8>(xq + 32 * (i64)u, x);
    float a = un.c0 * (float)dot_words<0, 4>(un.w, x) + un.c1 * (float)dot_words<4, 8>(un.w, x);
    if (T == T_Q4_K || T == T_Q5_K) a -= un.m * (float)sum_words(x);
    return xd[32 * u / act_block_i8<T>()] * a;
}

// acc[j] += one lane's share of row · x_j (units lane, lane + stride, ...)
// for the activation rows j in `live` (xq[j], xd[j] the row's codes and
// scales); two units a pass, so that their loads are in flight together.
template <int T, int NB>
__device__ __forceinline__ void row_dot_i8(const u8* row, int ne0, const u8* const* xq,
                                           const float* const* xd, u32 live, int lane, int stride,
                                           float* acc) {
    int nu = ne0 / 32;
    int u = lane;
    for (; u + stride < nu; u += 2 * stride) {
        UnitI8 a, b;
        decode_i8<T>(row, u, &a);
        decode_i8<T>(row, u + stride, &b);
#pragma unroll
        for (int j = 0; j < NB; ++j)
            if ((live >> j) & 1)
                acc[j] += unit_row_i8<T>(a, u, xq[j], xd[j]) + unit_row_i8<T>(b, u + stride, xq[j], xd[j]);
    }
    if (u < nu) {
        UnitI8 a;
        decode_i8<T>(row, u, &a);
#pragma unroll
        for (int j = 0; j < NB; ++j)
            if ((live >> j) & 1) acc[j] += unit_row_i8<T>(a, u, xq[j], xd[j]);
    }
}

// Row r's int8 products summed in any order, reduced as warp_row reduces
// them (lane 0 of the lead warp gets them). Every thread of a block a row
// must call it.
template <int T, int NB>
__device__ __forceinline__ void summed_row_i8(const u8* row, int ne0, const u8* const* xq,
                                              const float* const* xd, u32 live, int part, int parts,
                                              float* acc) {
#pragma unroll
    for (int j = 0; j < NB; ++j) acc[j] = 0.0f;
    row_dot_i8<T, NB>(row, ne0, xq, xd, live, part * 32 + (threadIdx.x & 31), 32 * parts, acc);
    reduce_row<NB>(acc, part, parts);
}
// (end of summed_row_i8)

// --- int8 products in ggml's lanes ------------------------------------------------
// ggml's CPU sums a Q8_0 or IQ4_XS row (ggml_vec_dot_q8_0_q8_0,
// ggml_vec_dot_iq4_xs_q8_K; family-ops' dot_q8_0_lanes and dot_iq4_xs) in
// 8 lanes: lane l holds the integer products of bytes 4l..4l+4 of each 32
// (summed over a 256-block's 32s, each times its scale), acc_l =
// fma(d_w * d_x, lane, acc_l) block after block, and the row is
// reduce_movehl8 of the lanes. IQ4_NL's rows: in a weight of a multiple
// of 8 rows, which ggml repacks, one chain acc = fma(block's sum, d_w *
// d_x, acc) (gemv_q4_b32_8x8_q8_0_lut_avx; family-ops'
// dot_q8_0_repacked); else ggml_vec_dot_iq4_nl_q8_0 (family-ops'
// dot_iq4_nl): the even blocks' lanes and the odd ones' in two sets of 8,
// summed lane by lane, reduce_movehl8, an odd last block added by fma;
// several tokens of a weight not repacked take llamafile's tinyBLAS_Q0
// (family-ops' dot_q8_0_lanes): Q8_0's one set of 8 lanes.
// Only that chain gives its bits, and a chain
// over a whole row leaves a thread too little to load at once; so the
// warp (or the block, a block a row) takes a round of 32 units a warp:
// each thread computes one unit's integer lanes into shared memory
// (lanes_unit_i8), then 8 threads an activation row extend their chains
// over the round (lanes_chain_i8). A Q4_K weight of a multiple of 8 rows,
// which ggml repacks, is summed as its gemv sums it for one token (and an
// expert's tokens; family-ops' dot_q4_k_repacked without gemm): per
// 256-block the exact integer sums of its codes' products (each 32 times
// its scale) and of its mins' (each times the 32's activation sum), acc =
// fma(dot, d_w * d_x, acc) and acc_m = fma(min, dmin_w * d_x, acc_m) block
// after block, the row acc - acc_m: two chains, whose slots hold the two
// integers and the two scales (lanes_unit_i8). A prefill's Q4_K products
// (ggml's gemm, whose activations round their own way) and Q4_K weights
// ggml does not repack are summed as the others. Q6_K's lanes are
// ggml_vec_dot_q6_K_q8_K's: lane l the products of the unsigned 6-bit codes
// (times their 16's scale) over bytes 4l..4l+4 of each 32, less 32 times
// the scaled activation sums of the block's 32 number l (family-ops'
// dot_q6_k). GGML_ORDER false sums these types as the others.

template <int T>
__device__ __forceinline__ constexpr bool ggml_lanes_i8() {
    return GGML_ORDER &&
           (T == T_Q8_0 || T == T_IQ4_XS || T == T_IQ4_NL || T == T_Q4_K || T == T_Q6_K);
}

// Whether a row of T of a weight (an expert) of `rows` rows, for `many`
// tokens of a ubatch (not an expert's), takes ggml's lanes (lanes_row_i8).
template <int T>
__device__ __forceinline__ bool in_lanes_i8(int rows, bool many) {
    if constexpr (T == T_Q4_K) return ggml_lanes_i8<T>() && rows % 8 == 0 && !many;
    else return ggml_lanes_i8<T>();
}

// IQ4_NL's order of sums (nl_order): ggml_vec_dot_iq4_nl_q8_0's two
// parities of block, the repacked gemv's one chain (a weight of a multiple
// of 8 rows), or tinyBLAS_Q0's one set of lanes (several tokens, `many`,
// of a weight not repacked).
#define NL_PAIRS 0
#define NL_REPACKED 1
#define NL_LANES 2
__device__ __forceinline__ int nl_order(int rows, bool many) {
    return rows % 8 == 0 ? NL_REPACKED : many ? NL_LANES : NL_PAIRS;
}

// Chains an activation row: 8 lanes, and for IQ4_NL 8 for each parity of
// block.
template <int T>
__device__ __forceinline__ constexpr int lanes_chains() {
    return T == T_IQ4_NL ? 16 : 8;
}

// A unit's slot: for activation row j, its 8 integer lanes at 9j..9j+8 and
// the block's scale d_w * d_x (a float's bits) at 9j + 8; an odd length,
// so that the 32 threads writing their slots hit 32 banks.
template <int NB>
__device__ __forceinline__ constexpr int lanes_slot() {
    return (9 * NB) | 1;
}

// Unit u's slot for the activation rows in `live` (phase one). Q4_K's
// (the 32 codes g = u % 8 of block u / 8): its scale times its codes'
// integer product at 9j, its min times the activations' sum at 9j + 1,
// dmin_w * d_x at 9j + 2 and d_w * d_x at 9j + 8 (floats' bits).
template <int T, int NB>
__device__ __forceinline__ void lanes_unit_i8(const u8* row, int u, const u8* const* xq,
                                              const float* const* xd, u32 live, int* slot) {
    if constexpr (T == T_Q4_K) {
        int sc, mn;
        u32 w[8];
        const u8* b = k45_unit<T>(row, u, w, &sc, &mn);
        float d = f16_at(b), dmin = f16_at(b + 2);
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            if ((live >> j) & 1) {
                u32 x[8];
                ldw<8>(xq[j] + 32 * (i64)u, x);
                float dx = xd[j][u >> 3];
                slot[9 * j] = sc * dot_words<0, 8>(w, x);
                slot[9 * j + 1] = mn * sum_words(x);
                slot[9 * j + 2] = __float_as_int(__fmul_rn(dmin, dx));
                slot[9 * j + 8] = __float_as_int(__fmul_rn(d, dx));
            }
        }
    } else if constexpr (T == T_Q6_K) {
        // Unit g = u % 8 of block u / 8: its codes unsigned, its two
        // scales; its 32's offset term goes to lane g.
        int g = u & 7;
        u32 w[8];
        const u8* b = q6k_unit(row, u, w);
        int sc0 = (i8)b[192 + 2 * g], sc1 = (i8)b[193 + 2 * g];
        float d = f16_at(b + 208);
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            if ((live >> j) & 1) {
                u32 x[8];
                ldw<8>(xq[j] + 32 * (i64)u, x);
                int s0 = 0, s1 = 0;
#pragma unroll
                for (int l = 0; l < 8; ++l) {
                    slot[9 * j + l] = (l < 4 ? sc0 : sc1) * dp4a(w[l], x[l], 0);
                    if (l < 4) s0 = dp4a(0x01010101u, x[l], s0);
                    else s1 = dp4a(0x01010101u, x[l], s1);
                }
                slot[9 * j + g] -= 32 * (sc0 * s0 + sc1 * s1);
                slot[9 * j + 8] = __float_as_int(__fmul_rn(d, xd[j][u >> 3]));
            }
        }
    } else {
        u32 w[8];
        int ls;
        float d;
        lanes_decode<T>(row, u, w, &ls, &d);
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            if ((live >> j) & 1) {
                u32 x[8];
                ldw<8>(xq[j] + 32 * (i64)u, x);
#pragma unroll
                for (int l = 0; l < 8; ++l) slot[9 * j + l] = ls * dp4a(w[l], x[l], 0);
                slot[9 * j + 8] = __float_as_int(__fmul_rn(d, xd[j][32 * u / act_block_i8<T>()]));
            }
        }
    }
}

// The sum of a slot's 8 integer lanes (a block's whole product).
__device__ __forceinline__ int lanes_total(const int* lanes) {
    int sum = 0;
#pragma unroll
    for (int t = 0; t < 8; ++t) sum += lanes[t];
    return sum;
}

// Chain c (activation row c / lanes_chains, lane c % 8) over the n units
// u0.. of a round of a row of nu (phase two; slot k at slots + k *
// lanes_slot): a block's lane is its units' lanes summed (exact), then acc
// = fma(d_w * d_x, lane, acc). IQ4_NL (`order`, nl_order): NL_REPACKED,
// chain 0 alone takes each block's sum of lanes; NL_LANES, chains 0..8 take
// lane c % 8 of every block; NL_PAIRS, lane c % 8 of the blocks of parity
// (c % 16) / 8, the odd last block left to lanes_row_sum.
template <int T, int NB>
__device__ __forceinline__ float lanes_chain_i8(const int* slots, int u0, int n, int nu, int c,
                                                int order, float acc) {
    constexpr int UPB = T == T_Q8_0 || T == T_IQ4_NL ? 1 : 8;  // units a block
    constexpr int S = lanes_slot<NB>();
    const int* p = slots + 9 * (c / lanes_chains<T>());
    int l = c & 7;
    if constexpr (T == T_Q4_K) {
        // Chain 0 the codes' (scale at 8), chain 1 the mins' (scale at 2).
        if (l > 1) return acc;
        int at = l == 0 ? 8 : 2;
        for (int k = 0; k < n; k += 8) {
            int sum = 0;
#pragma unroll
            for (int g = 0; g < 8; ++g) sum += p[(k + g) * S + l];
            acc = __fmaf_rn(__int2float_rn(sum), __int_as_float(p[k * S + at]), acc);
        }
        return acc;
    }
    if constexpr (T == T_IQ4_NL) {
        int sub = c & 15;
        if (order == NL_REPACKED) {
            if (sub != 0) return acc;
            for (int k = 0; k < n; ++k)
                acc = __fmaf_rn(__int2float_rn(lanes_total(p + k * S)), __int_as_float(p[k * S + 8]),
                                acc);
        } else if (order == NL_LANES) {
            if (sub >= 8) return acc;
            for (int k = 0; k < n; ++k)
                acc = __fmaf_rn(__int_as_float(p[k * S + 8]), __int2float_rn(p[k * S + l]), acc);
        } else {
            int par = sub >> 3, end = min(n, (nu & ~1) - u0);
            for (int k = (u0 + par) & 1; k < end; k += 2)
                acc = __fmaf_rn(__int_as_float(p[k * S + 8]), __int2float_rn(p[k * S + l]), acc);
        }
        return acc;
    }
#pragma unroll 4
    for (int k = 0; k < n; k += UPB) {
        int lane = 0;
#pragma unroll
        for (int g = 0; g < UPB; ++g) lane += p[(k + g) * S + l];
        acc = __fmaf_rn(__int_as_float(p[k * S + 8]), __int2float_rn(lane), acc);
    }
    return acc;
}

// Activation row j's sum from its chains v (lanes_chains of them) and the
// slot of the row's last unit (`last`, its row j part): reduce_movehl8 of
// the lanes; IQ4_NL's as lanes_chain_i8 describes.
template <int T>
__device__ __forceinline__ float lanes_row_sum(const float* v, const int* last, int nu,
                                               int order) {
    if constexpr (T == T_Q4_K) return __fsub_rn(v[0], v[1]);
    if constexpr (T == T_IQ4_NL) {
        if (order == NL_REPACKED) return v[0];
        if (order == NL_LANES) return reduce_movehl8(v);
        float w[8];
#pragma unroll
        for (int l = 0; l < 8; ++l) w[l] = __fadd_rn(v[l], v[8 + l]);
        float sum = reduce_movehl8(w);
        if (nu & 1) sum = __fmaf_rn(__int_as_float(last[8]), __int2float_rn(lanes_total(last)), sum);
        return sum;
    } else {
        return reduce_movehl8(v);
    }
}

// Row r's int8 products in ggml's lanes (lane 0 of the lead warp gets
// them): rounds of 32 units a warp, phase one on every thread, phase two
// on the lead warp (each warp its own row's, a warp a row). `rows`: the
// weight's (an expert's) rows, which tell a repacked IQ4_NL weight; `many`:
// a token of a ubatch of several (a prefill's product, not an expert's).
// Every thread of a block a row must call it.
template <int T, int NB>
__device__ __forceinline__ void lanes_row_i8(const u8* row, int ne0, const u8* const* xq,
                                             const float* const* xd, u32 live, int part, int parts,
                                             int rows, bool many, float* acc) {
    constexpr int S = lanes_slot<NB>();
    constexpr int CPR = lanes_chains<T>();
    constexpr int CH = (CPR * NB + 31) / 32;  // chains a thread
    static_assert(MM_ROWS * 32 * S * 4 <= 48 * 1024, "a round's slots fit static shared memory");
    __shared__ int slots[MM_ROWS * 32 * S];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int* mine = slots + (warp * 32 + lane) * S;
    const int* round_slots = slots + (parts > 1 ? 0 : warp * 32 * S);
    bool chains = parts == 1 || part == 0;
    int order = nl_order(rows, many);
    float ch[CH];
#pragma unroll
    for (int i = 0; i < CH; ++i) ch[i] = 0.0f;
    int nu = ne0 / 32, round = 32 * parts;
    for (int u0 = 0; u0 < nu; u0 += round) {
        int u = u0 + part * 32 + lane;
        if (u < nu) lanes_unit_i8<T, NB>(row, u, xq, xd, live, mine);
        if (parts > 1) __syncthreads(); else __syncwarp();
        if (chains) {
            int n = min(round, nu - u0);
#pragma unroll
            for (int i = 0; i < CH; ++i) {
                int c = lane + 32 * i;
                if (c < CPR * NB && ((live >> (c / CPR)) & 1))
                    ch[i] = lanes_chain_i8<T, NB>(round_slots, u0, n, nu, c, order, ch[i]);
            }
        }
        // The last round's slots stay for lanes_row_sum.
        if (u0 + round < nu) {
            if (parts > 1) __syncthreads(); else __syncwarp();
        }
    }
    // Chains to rows.
    if (chains) {
        const int* last = round_slots + ((nu - 1) % round) * S;
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            float v[CPR];
#pragma unroll
            for (int i = 0; i < CPR; ++i)
                v[i] = __shfl_sync(0xffffffffu, ch[(CPR * j + i) >> 5], (CPR * j + i) & 31);
            acc[j] = nu > 0 ? lanes_row_sum<T>(v, last + 9 * j, nu, order) : 0.0f;
        }
    }
    // No thread leaves while the lead warp still reads the last round.
    if (parts > 1) __syncthreads(); else __syncwarp();
}
// (end of lanes_row_i8)

// Row r's int8 products (lane 0 of the lead warp gets them): in ggml's
// lanes for the types that have them, else summed. `rows`: the weight's
// (an expert's) rows; `many` as lanes_row_i8 takes it.
template <int T, int NB>
__device__ __forceinline__ void warp_row_i8(const u8* row, int ne0, const u8* const* xq,
                                            const float* const* xd, u32 live, int part, int parts,
                                            int rows, bool many, float* acc) {
    if (in_lanes_i8<T>(rows, many)) {
        lanes_row_i8<T, NB>(row, ne0, xq, xd, live, part, parts, rows, many, acc);
    } else {
        summed_row_i8<T, NB>(row, ne0, xq, xd, live, part, parts, acc);
    }
}

// y = row · one activation row (codes xq, scales xd), written by the lead.
template <int T>
__device__ __forceinline__ void one_row_i8(const u8* row, int ne0, const u8* xq, const float* xd,
                                           const RowPart& rp, int rows, float* y) {
    const u8* q1[1] = {xq};
    const float* d1[1] = {xd};
    float acc[1];
    warp_row_i8<T, 1>(row, ne0, q1, d1, 1u, rp.part, rp.parts, rows, false, acc);
    if (rp.lead) *y = acc[0];
}

// y[b][r] = Σ_i W[r][i] * x[b][i] from int8 activations (xq: n rows of
// ne0 codes; xd: n rows of ne0 / blk scales), one activation row b =
// blockIdx.y, + gridDim.y, ... at a time (decode: a kernel of its own, so
// that the batched one's registers do not cut its occupancy): warps (or a
// block a row) as matmul_impl.
template <int T>
__device__ void matvec_i8_impl(const u8* w, const u8* xq, const float* xd, float* y, int ne0,
                               int rows, int n, i64 row_bytes) {
    RowPart rp = row_part(rows);
    int r = rp.r;
    if (r >= rows) return;  // never in a block a row: the whole block stays
    const u8* row = w + (i64)r * row_bytes;
    int nd = ne0 / act_block_i8<T>();
    for (i64 b = blockIdx.y; b < n; b += gridDim.y)
        one_row_i8<T>(row, ne0, xq + b * ne0, xd + b * nd, rp, rows, &y[b * rows + r]);
}

// matvec_i8_impl for several activation rows (a prefill): warp w of block
// (g, c) takes row 8g + w (or a block a row) and activation rows b0 ..
// b0 + MM_NB for b0 = MM_NB * c, MM_NB * (c + gridDim.y), ..., each unit
// of the weight decoded once for all of them.
template <int T>
__device__ void matmul_i8_impl(const u8* w, const u8* xq, const float* xd, float* y, int ne0,
                               int rows, int n, i64 row_bytes) {
    RowPart rp = row_part(rows);
    int r = rp.r;
    if (r >= rows) return;  // never in a block a row: the whole block stays
    const u8* row = w + (i64)r * row_bytes;
    int nd = ne0 / act_block_i8<T>();
    for (i64 b0 = (i64)blockIdx.y * MM_NB; b0 < n; b0 += (i64)gridDim.y * MM_NB) {
        int nb = n - b0 < MM_NB ? (int)(n - b0) : MM_NB;
        const u8* qr[MM_NB];
        const float* dr[MM_NB];
#pragma unroll
        for (int j = 0; j < MM_NB; ++j) {
            i64 b = b0 + (j < nb ? j : 0);
            qr[j] = xq + b * ne0;
            dr[j] = xd + b * nd;
        }
        float acc[MM_NB];
        warp_row_i8<T, MM_NB>(row, ne0, qr, dr, (1u << nb) - 1u, rp.part, rp.parts, rows, true, acc);
        if (rp.lead) {
#pragma unroll
            for (int j = 0; j < MM_NB; ++j)
                if (j < nb) y[(b0 + j) * rows + r] = acc[j];
        }
    }
}

// matmul_id_impl's products from int8 activations, one pick p =
// blockIdx.y, + gridDim.y, ... at a time (a decode step's picks are
// distinct experts: nothing to share).
template <int T>
__device__ void matvec_id_i8_impl(const u8* w, const u8* xq, const float* xd, const int* ids,
                                  float* y, int ne0, int rows, int n_expert, int picks, int k,
                                  int per_pick, i64 row_bytes) {
    RowPart rp = row_part(rows);
    int r = rp.r;
    if (r >= rows) return;  // never in a block a row: the whole block stays
    int nd = ne0 / act_block_i8<T>();
    for (i64 p = blockIdx.y; p < picks; p += gridDim.y) {
        int e = ids[p];
        if (e < 0 || e >= n_expert) {
            if (rp.lead) y[p * rows + r] = __int_as_float(0x7fc00000);
            continue;
        }
        i64 xb = per_pick ? p : p / k;
        one_row_i8<T>(w + ((i64)e * rows + r) * row_bytes, ne0, xq + xb * ne0, xd + xb * nd, rp,
                      rows, &y[p * rows + r]);
    }
}

// matmul_id_impl from int8 activations (several tokens' picks: a
// prefill's), the picks of a group with the same expert sharing one pass
// over its row.
template <int T>
__device__ void matmul_id_i8_impl(const u8* w, const u8* xq, const float* xd, const int* ids,
                                  float* y, int ne0, int rows, int n_expert, int picks, int k,
                                  int per_pick, i64 row_bytes) {
    RowPart rp = row_part(rows);
    int r = rp.r;
    if (r >= rows) return;  // never in a block a row: the whole block stays
    int nd = ne0 / act_block_i8<T>();
    bool lead = rp.lead;
    for (i64 p0 = (i64)blockIdx.y * MM_NB; p0 < picks; p0 += (i64)gridDim.y * MM_NB) {
        int np = picks - p0 < MM_NB ? (int)(picks - p0) : MM_NB;
        const u8* qr[MM_NB];
        const float* dr[MM_NB];
#pragma unroll
        for (int j = 0; j < MM_NB; ++j) {
            i64 p = p0 + (j < np ? j : 0);
            i64 xb = per_pick ? p : p / k;
            qr[j] = xq + xb * ne0;
            dr[j] = xd + xb * nd;
        }
        for_each_expert(
            ids, p0, np, n_expert,
            [&](i64 p) {
                if (lead) y[p * rows + r] = __int_as_float(0x7fc00000);
            },
            [&](int ei, int i, u32 live) {
                const u8* row = w + ((i64)ei * rows + r) * row_bytes;
                float acc[MM_NB];
                warp_row_i8<T, MM_NB>(row, ne0, qr, dr, live, rp.part, rp.parts, rows, false, acc);
                if (lead) {
#pragma unroll
                    for (int j = 0; j < MM_NB; ++j)
                        if ((live >> j) & 1) y[(p0 + j) * rows + r] = acc[j];
                }
            });
    }
}

#define INT8_KERNELS(NAME, T)                                                                     \
    extern "C" __global__ void matvec_i8_##NAME(const u8* w, const u8* xq, const float* xd,      \
                                                float* y, int ne0, int rows, int n,               \
                                                i64 row_bytes) {                                  \
        matvec_i8_impl<T>(w, xq, xd, y, ne0, rows, n, row_bytes);                                 \
    }                                                                                             \
    extern "C" __global__ void matmul_i8_##NAME(const u8* w, const u8* xq, const float* xd,      \
                                                float* y, int ne0, int rows, int n,               \
                                                i64 row_bytes) {                                  \
        matmul_i8_impl<T>(w, xq, xd, y, ne0, rows, n, row_bytes);                                 \
    }                                                                                             \
    extern "C" __global__ void matvec_id_i8_##NAME(                                               \
        const u8* w, const u8* xq, const float* xd, const int* ids, float* y, int ne0, int rows,  \
        int n_expert, int picks, int k, int per_pick, i64 row_bytes) {                            \
        matvec_id_i8_impl<T>(w, xq, xd, ids, y, ne0, rows, n_expert, picks, k, per_pick,          \
                             row_bytes);                                                          \
    }                                                                                             \
    extern "C" __global__ void matmul_id_i8_##NAME(                                               \
        const u8* w, const u8* xq, const float* xd, const int* ids, float* y, int ne0, int rows,  \
        int n_expert, int picks, int k, int per_pick, i64 row_bytes) {                            \
        matmul_id_i8_impl<T>(w, xq, xd, ids, y, ne0, rows, n_expert, picks, k, per_pick,          \
                             row_bytes);                                                          \
    }

INT8_KERNELS(q8_0, T_Q8_0)
INT8_KERNELS(q4_k, T_Q4_K)
INT8_KERNELS(q5_k, T_Q5_K)
INT8_KERNELS(q6_k, T_Q6_K)
INT8_KERNELS(iq2_xxs, T_IQ2_XXS)
INT8_KERNELS(iq2_xs, T_IQ2_XS)
INT8_KERNELS(iq2_s, T_IQ2_S)
INT8_KERNELS(iq3_xxs, T_IQ3_XXS)
INT8_KERNELS(iq4_xs, T_IQ4_XS)
INT8_KERNELS(iq4_nl, T_IQ4_NL)

// --- gathers ---------------------------------------------------------------------

// out[k] = row ids[k] of the table (row k itself when ids is null); an id
// outside [0, rows) sets bad[0] = 1 and bad[1] = the id.
template <int T>
__device__ void get_rows_impl(const u8* w, const int* ids, float* out, int ne0, int rows, i64 n,
                              i64 row_bytes, int* bad) {
    for (i64 k = blockIdx.x; k < n; k += gridDim.x) {
        int id = ids ? ids[k] : (int)k;
        if (id < 0 || id >= rows) {
            if (threadIdx.x == 0) {
                atomicExch(&bad[1], id);
                atomicExch(&bad[0], 1);
            }
            continue;
        }
        const u8* row = w + (i64)id * row_bytes;
        for (int i = threadIdx.x; i < ne0; i += blockDim.x) out[k * ne0 + i] = deq<T>(row, i);
    }
}

// y[b][r] = Σ_i W[r][i] * xq[b][i] for several activation rows (a
// ubatch; xq rounded to T) of a float weight of a multiple of 4 rows of
// whole 8s, as llamafile's tinyBLAS sums them (ggml's mul_mat with more
// than one column): a warp a weight row, 4 activation rows at a time, 8
// threads each; thread l of a row runs lane l's chain (tinyblas_dot's),
// the row's first thread meets the 8 lanes as hsum_float_8 does. Grid
// strides over the weight rows (x) and the activation rows (y).
template <int T>
__device__ void matmul_tinyblas_impl(const u8* w, const float* xq, float* y, int ne0, int rows,
                                     int n, i64 row_bytes) {
    int t = threadIdx.x & 31, j = t >> 3, l = t & 7;
    for (i64 r = (i64)blockIdx.x * MM_ROWS + (threadIdx.x >> 5); r < rows;
         r += (i64)gridDim.x * MM_ROWS) {
        const u8* row = w + r * row_bytes;
        bool aligned = float_aligned<T>(row);
        // b0 = b - j is the same across the warp, so every lane takes
        // every round's shuffles.
        for (i64 b = (i64)blockIdx.y * 4 + j; b - j < n; b += (i64)gridDim.y * 4) {
            float a = 0.0f;
            if (b < n) {
                const float* x = xq + b * ne0;
                for (int k = l; k < ne0; k += 8) a = __fmaf_rn(float_at<T>(row, aligned, k), x[k], a);
            }
            float v[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) v[q] = __shfl_sync(0xffffffffu, a, (j << 3) + q);
            if (l == 0 && b < n) y[b * rows + r] = reduce_movehl8(v);
        }
    }
}

#define TINYBLAS_KERNEL(NAME, T)                                                                  \
    extern "C" __global__ void matmul_tinyblas_##NAME(const u8* w, const float* xq, float* y,     \
                                                      int ne0, int rows, int n, i64 row_bytes) {  \
        matmul_tinyblas_impl<T>(w, xq, y, ne0, rows, n, row_bytes);                               \
    }
TINYBLAS_KERNEL(f32, T_F32)
TINYBLAS_KERNEL(f16, T_F16)
TINYBLAS_KERNEL(bf16, T_BF16)

// Every type's gather; the float products of the types without int8
// ones (INT8_KERNELS below, ops.rs `INT8_KERNELS`: those take no other).
#define GATHER_KERNEL(NAME, T)                                                                    \
    extern "C" __global__ void get_rows_##NAME(const u8* w, const int* ids, float* out, int ne0,  \
                                               int rows, i64 n, i64 row_bytes, int* bad) {        \
        get_rows_impl<T>(w, ids, out, ne0, rows, n, row_bytes, bad);                              \
    }

#define WEIGHT_KERNELS(NAME, T)                                                                   \
    GATHER_KERNEL(NAME, T)                                                                        \
    extern "C" __global__ void matmul_##NAME(const u8* w, const float* xq, float* y, int ne0,     \
                                             int rows, int n, i64 row_bytes) {                    \
        matmul_impl<T>(w, xq, y, ne0, rows, n, row_bytes);                                        \
    }                                                                                             \
    extern "C" __global__ void matmul_id_##NAME(const u8* w, const float* xq, const int* ids,     \
                                                float* y, int ne0, int rows, int n_expert,        \
                                                int picks, int k, int per_pick, i64 row_bytes) {  \
        matmul_id_impl<T>(w, xq, ids, y, ne0, rows, n_expert, picks, k, per_pick, row_bytes);     \
    }

WEIGHT_KERNELS(f32, T_F32)
WEIGHT_KERNELS(f16, T_F16)
WEIGHT_KERNELS(bf16, T_BF16)
WEIGHT_KERNELS(q4_0, T_Q4_0)
WEIGHT_KERNELS(q4_1, T_Q4_1)
WEIGHT_KERNELS(q5_0, T_Q5_0)
WEIGHT_KERNELS(q5_1, T_Q5_1)
GATHER_KERNEL(q8_0, T_Q8_0)
WEIGHT_KERNELS(q2_k, T_Q2_K)
WEIGHT_KERNELS(q3_k, T_Q3_K)
GATHER_KERNEL(q4_k, T_Q4_K)
GATHER_KERNEL(q5_k, T_Q5_K)
GATHER_KERNEL(q6_k, T_Q6_K)
GATHER_KERNEL(iq4_nl, T_IQ4_NL)
GATHER_KERNEL(iq4_xs, T_IQ4_XS)
WEIGHT_KERNELS(tq2_0, T_TQ2_0)
WEIGHT_KERNELS(mxfp4, T_MXFP4)
WEIGHT_KERNELS(tq1_0, T_TQ1_0)
WEIGHT_KERNELS(nvfp4, T_NVFP4)
GATHER_KERNEL(iq2_xxs, T_IQ2_XXS)
GATHER_KERNEL(iq2_xs, T_IQ2_XS)
GATHER_KERNEL(iq2_s, T_IQ2_S)
GATHER_KERNEL(iq3_xxs, T_IQ3_XXS)
WEIGHT_KERNELS(iq3_s, T_IQ3_S)
WEIGHT_KERNELS(iq1_s, T_IQ1_S)
WEIGHT_KERNELS(iq1_m, T_IQ1_M)

// --- activations as ggml's CPU matmul multiplies them ------------------------
// (family-ops' `as_ggml_multiplies`)

// Rounded to F16 and back.
extern "C" __global__ void act_f16(const float* x, float* out, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = h2f(f2h(x[i]));
}

// Rounded to BF16 and back.
extern "C" __global__ void act_bf16(const float* x, float* out, i64 n) {
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
        out[i] = round_bf16(x[i]);
}

// Q8_0 blocks of 32 (one warp each): d = f16(max|x| / 127),
// q = round_even(x * 127 / max|x|), for the lane's element v.
__device__ __forceinline__ void q8_0_lane(float v, float* q, float* d) {
    float amax = warp_max(fabsf(v));
    *d = h2f(f2h(amax / 127.0f));
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    *q = rintf(v * id);
}

// Q8_0 blocks, dequantized: out = q * d.
extern "C" __global__ void act_q8_0(const float* x, float* out, i64 nblocks) {
    int lane = threadIdx.x & 31;
    i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 blk = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); blk < nblocks; blk += warps) {
        float q, d;
        q8_0_lane(x[blk * 32 + lane], &q, &d);
        out[blk * 32 + lane] = q * d;
    }
}

// Q8_0 blocks as the int8 products read them: q[i] and a float d a block.
extern "C" __global__ void act_q8_0_i8(const float* x, i8* qs, float* ds, i64 nblocks) {
    int lane = threadIdx.x & 31;
    i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 blk = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); blk < nblocks; blk += warps) {
        float q, d;
        q8_0_lane(x[blk * 32 + lane], &q, &d);
        qs[blk * 32 + lane] = (i8)(int)q;
        if (lane == 0) ds[blk] = d;
    }
}

// Q8_K blocks of 256 (one block of 256 threads each, every thread calls
// it): the first element of largest magnitude `max`, iscale = -127 / max,
// q = min(127, round_even(iscale * x)), d = 1 / iscale (q = d = 0 for a
// block of zeros), for the thread's element v of block x.
__device__ __forceinline__ void q8_k_thread(const float* x, float v, float* q, float* d) {
    __shared__ float sa[8];
    __shared__ int si[8];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    float a = fabsf(v);
    if (!(a == a)) a = -1.0f;  // NaN is never the maximum
    int idx = threadIdx.x;
    for (int o = 16; o > 0; o >>= 1) {
        float a2 = __shfl_xor_sync(0xffffffffu, a, o);
        int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
        if (a2 > a || (a2 == a && i2 < idx)) {
            a = a2;
            idx = i2;
        }
    }
    __syncthreads();
    if (lane == 0) {
        sa[wid] = a;
        si[wid] = idx;
    }
    __syncthreads();
    a = sa[0];
    idx = si[0];
    for (int k = 1; k < 8; ++k) {
        if (sa[k] > a || (sa[k] == a && si[k] < idx)) {
            a = sa[k];
            idx = si[k];
        }
    }
    if (!(a > 0.0f)) {
        *q = 0.0f;
        *d = 0.0f;
    } else {
        float iscale = -127.0f / x[idx];
        *d = 1.0f / iscale;
        *q = fminf(rintf(iscale * v), 127.0f);
    }
}

// Q8_K blocks, dequantized: out = q * d.
extern "C" __global__ void act_q8_k(const float* x, float* out, i64 nblocks) {
    for (i64 blk = blockIdx.x; blk < nblocks; blk += gridDim.x) {
        float q, d;
        q8_k_thread(x + blk * 256, x[blk * 256 + threadIdx.x], &q, &d);
        out[blk * 256 + threadIdx.x] = q * d;
    }
}

// Q8_K blocks as the int8 products read them: q[i] and a float d a block.
extern "C" __global__ void act_q8_k_i8(const float* x, i8* qs, float* ds, i64 nblocks) {
    for (i64 blk = blockIdx.x; blk < nblocks; blk += gridDim.x) {
        float q, d;
        q8_k_thread(x + blk * 256, x[blk * 256 + threadIdx.x], &q, &d);
        qs[blk * 256 + threadIdx.x] = (i8)(int)q;
        if (threadIdx.x == 0) ds[blk] = d;
    }
}

// --- norms, rotary embedding, softmax ----------------------------------------

// RMSNorm of row blockIdx.x (family-ops' `rms_norm`): squares in f32 summed
// in f64, the mean rounded to f32, scale = 1 / sqrtf(mean + eps), then
// (x * scale) * w, or * (1 + w). mode: 0 none, 1 w, 2 1 + w.
// A weight of `wrows` rows gives row r its row r % wrows.
extern "C" __global__ void rms_norm_f32(const float* x, const float* w0, float* out, int cols,
                                        i64 rows, float eps, int mode, int wrows) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        const float* w = w0 + (r % wrows) * cols;
        double s = 0.0;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) s += (double)(xr[i] * xr[i]);
        s = block_sum_d(s);
        float mean = (float)(s / (double)cols);
        float scale = 1.0f / sqrtf(mean + eps);
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            float v = xr[i] * scale;
            if (mode == 1) v = v * w[i];
            if (mode == 2) v = v * (1.0f + w[i]);
            out[r * cols + i] = v;
        }
    }
}

// RoPE (family-ops' `rope`): one thread per element; pair i turns by
// pos * base^(-2i / n_rot), angle, sine, cosine and rotation in f64.
extern "C" __global__ void rope_f32(const float* x, const int* pos, float* out, i64 rows, int cols,
                                    int head_dim, int n_rot, float base, int neox) {
    i64 n = rows * cols;
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (i64)gridDim.x * blockDim.x) {
        i64 r = k / cols;
        int c = (int)(k % cols);
        int d = c % head_dim;
        if (d >= n_rot) {
            out[k] = x[k];
            continue;
        }
        int half = n_rot / 2;
        int i, partner;
        bool first;
        if (neox) {
            i = d % half;
            first = d < half;
            partner = first ? d + half : d - half;
        } else {
            i = d / 2;
            first = (d % 2) == 0;
            partner = first ? d + 1 : d - 1;
        }
        double inv = pow((double)base, -2.0 * (double)i / (double)n_rot);
        double s, co;
        sincos((double)pos[r] * inv, &s, &co);
        i64 head = k - d;
        double a = (double)x[head + (first ? d : partner)];
        double b = (double)x[head + (first ? partner : d)];
        out[k] = first ? (float)(a * co - b * s) : (float)(a * s + b * co);
    }
}

// IMROPE (family-ops' `ggml_cpu::rope_multi`, interleaved sections): one
// thread per element, NEOX pairs on the first n_rot dims; pair i takes
// position pos[r][which] with which from the sections (s0..s3) as
// `imrope_section`. In ggml's f32 steps: theta_scale = powf(base, -2 /
// n_rot), the angle pos * theta_scale^i as i rounded products, its cosine
// and sine (libm_cosf/libm_sinf), the rotation fma(x0, cos, -(x1 sin)) and
// fma(x0, sin, x1 cos). The angle in f64 instead (as before) moved a K
// cache's f16 roundings on qwen4_exp's goldens.
extern "C" __global__ void imrope_f32(const float* x, const int* pos, float* out, i64 rows,
                                      int cols, int head_dim, int n_rot, float base, int s0,
                                      int s1, int s2, int s3) {
    i64 n = rows * cols;
    int sect = s0 + s1 + s2 + s3;
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (i64)gridDim.x * blockDim.x) {
        i64 r = k / cols;
        int c = (int)(k % cols);
        int d = c % head_dim;
        if (d >= n_rot) {
            out[k] = x[k];
            continue;
        }
        int half = n_rot / 2;
        int i = d % half;
        bool first = d < half;
        int partner = first ? d + half : d - half;
        int sector = sect == 0 ? 0 : i % sect;
        int which;
        if (sector % 3 == 1 && sector < 3 * s1) which = 1;
        else if (sector % 3 == 2 && sector < 3 * s2) which = 2;
        else if (sector % 3 == 0 && sector < 3 * s0) which = 0;
        else which = 3;
        float theta_scale = libm_powf(base, __fdiv_rn(-2.0f, (float)n_rot));
        float theta = (float)pos[r * 4 + which];
        for (int j = 0; j < i; ++j) theta = __fmul_rn(theta, theta_scale);
        float co = libm_cosf(theta), s = libm_sinf(theta);
        i64 head = k - d;
        float x0 = x[head + (first ? d : partner)];
        float x1 = x[head + (first ? partner : d)];
        out[k] = first ? __fmaf_rn(x0, co, -__fmul_rn(x1, s)) : __fmaf_rn(x0, s, __fmul_rn(x1, co));
    }
}

// ggml's soft_max_ext of row blockIdx.x (grid-stride), bit for bit
// family-ops' `ggml_cpu::soft_max`: w = x * scale + mask[r % mask_rows],
// then ggml_exp_sum's exp and sum, times the reciprocal of the sum
// rounded to f32.
extern "C" __global__ void softmax_f32(const float* x, const float* mask, float* out, int cols,
                                       i64 rows, int mask_rows, float scale) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        const float* mr = mask ? mask + (r % mask_rows) * cols : 0;
        float* o = out + r * cols;
        float mx = NEG_INF;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            float v = __fmul_rn(xr[i], scale);
            if (mr) v = __fadd_rn(v, mr[i]);
            o[i] = v;
            mx = fmaxf(mx, v);
        }
        ggml_soft_max_rest(o, cols, block_max(mx));
    }
}

// --- element-wise --------------------------------------------------------------

#define FOR_EACH(n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// ggml's SiLU of element i of a row of `cols` (family-ops'
// `ggml_cpu::silu_row`, bit for bit): x / (1 + exp(0 - x)), the exp
// ggml_expf's on the row's whole 8s, libm's past them.
__device__ __forceinline__ float silu_at(float v, i64 i, int cols) {
    bool whole = (int)(i % cols) < (cols & ~7);
    float e = whole ? ggml_expf(__fsub_rn(0.0f, v)) : libm_expf(-v);
    return __fdiv_rn(v, __fadd_rn(1.0f, e));
}

extern "C" __global__ void silu_f32(const float* x, float* out, i64 n, int cols) {
    FOR_EACH(n) out[i] = silu_at(x[i], i, cols);
}

// silu_f32 of scale_f32's product.
extern "C" __global__ void silu_scaled_f32(const float* x, float* out, i64 n, float s, int cols) {
    FOR_EACH(n) out[i] = silu_at(__fmul_rn(x[i], s), i, cols);
}

// The tanh form (device-ops' `reference::gelu_one`).
extern "C" __global__ void gelu_f32(const float* x, float* out, i64 n) {
    FOR_EACH(n) {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanhf(0.7978846f * v * (1.0f + 0.044715f * v * v)));
    }
}

// silu_at(gate) * up, row by row (family-ops' `ggml_cpu::swiglu`).
extern "C" __global__ void swiglu_f32(const float* g, const float* u, float* out, i64 n, int cols) {
    FOR_EACH(n) out[i] = __fmul_rn(silu_at(g[i], i, cols), u[i]);
}

extern "C" __global__ void add_f32(const float* a, const float* b, float* out, i64 n, i64 nb) {
    FOR_EACH(n) out[i] = a[i] + b[i % nb];
}

extern "C" __global__ void mul_f32(const float* a, const float* b, float* out, i64 n, i64 nb) {
    FOR_EACH(n) out[i] = a[i] * b[i % nb];
}

// mul_f32 by sigmoid_f32 of b.
extern "C" __global__ void mul_sigmoid_f32(const float* a, const float* b, float* out, i64 n,
                                           i64 nb) {
    FOR_EACH(n) out[i] = __fmul_rn(a[i], ggml_sigmoid(b[i % nb]));
}

extern "C" __global__ void scale_f32(const float* a, float* out, i64 n, float s) {
    FOR_EACH(n) out[i] = a[i] * s;
}

// --- copies, attention over a KV cache -----------------------------------------

// dst[i] = src[i] (a KV cache's append: dst points at the first row written).
extern "C" __global__ void copy_f32(const float* src, float* dst, i64 n) {
    FOR_EACH(n) dst[i] = src[i];
}

// dst[i] = f16(src[i]), rounded to nearest even (an F16 KV cache's append,
// as half's `f16::from_f32`).
extern "C" __global__ void copy_f32_f16(const float* src, u16* dst, i64 n) {
    FOR_EACH(n) dst[i] = f2h(src[i]);
}

// dst[i] = src[i] of halves (an F16 KV cache grown: rows copied as stored).
extern "C" __global__ void copy_f16(const u16* src, u16* dst, i64 n) {
    FOR_EACH(n) dst[i] = src[i];
}

// A KV cache's element widened to f32 (exactly, for F16).
__device__ __forceinline__ float kv_at(const float* c, i64 i) { return c[i]; }
__device__ __forceinline__ float kv_at(const u16* c, i64 i) { return h2f(c[i]); }

// A value as the cache's element type rounds it: ggml's non-flash attention
// converts q to the K cache's type and the probabilities to the V cache's
// type before their products (F16: nearest even; F32: as is).
__device__ __forceinline__ float as_kv(float x, const float*) { return x; }
__device__ __forceinline__ float as_kv(float x, const u16*) { return h2f(f2h(x)); }

__device__ double warp_max_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ double block_max_d(double v) {
    __shared__ double s[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max_d(v);
    __syncthreads();
    if (lane == 0) s[wid] = v;
    __syncthreads();
    v = (lane < nw) ? s[lane] : -__longlong_as_double(0x7ff0000000000000ll);
    return warp_max_d(v);
}

#define NEG_INF_D (-__longlong_as_double(0x7ff0000000000000ll))

// q . k_j as ggml's non-flash attention forms it: q rounded to the
// cache's type, then ggml_vec_dot_f32 (F32 cache) or _f16 (F16 cache), or
// tinyBLAS's sum (`tiled`: a query of a ubatch of several, as ggml's
// mul_mat takes it).
__device__ __forceinline__ float kq_dot(const float* q, const float* k, int dk, bool tiled) {
    auto ki = [&](int i) { return k[i]; };
    auto qi = [&](int i) { return q[i]; };
    return tiled ? tinyblas_dot(ki, qi, dk) : ggml_dot_f32(ki, qi, dk);
}
__device__ __forceinline__ float kq_dot(const float* q, const u16* k, int dk, bool tiled) {
    auto ki = [&](int i) { return h2f(k[i]); };
    auto qi = [&](int i) { return h2f(f2h(q[i])); };
    return tiled ? tinyblas_dot(ki, qi, dk) : ggml_dot_f16(ki, qi, dk);
}

// Attention of query row r, head h (pair p = r * n_head + h, one block per
// pair, grid-stride) over the first n_kv slots of the K/V cache; mode: 0
// all, 1 causal, 2 sliding window, 3 additive mask (a slot outside the
// causal window, modes 1 and 2, or at -inf is dropped). A pair that sees
// nothing gets zeros. KV is the cache's element type (float, or u16
// holding F16 bits: attention_f32 and attention_f16). `scratch` holds
// span doubles a block, span = n_kv rounded up to 32.
//
// Without a softcap, bit for bit the reference (family-ops'
// `ggml_cpu::attention_cached` of one token): the slots padded to whole
// 32s (padding and dropped slots -inf), score_j = kq_dot * scale + mask,
// ggml's softmax (ggml_exp_sum), the probabilities rounded to the V
// cache's type (as_kv), each output channel their ggml_fma_steps with
// the channel's values (0 past n_kv), reduce_hadd8. The queries of a
// ubatch of several (n_q > 1) take tinyBLAS's sums (tinyblas_dot) where
// ggml's mul_mat does (family-ops' `attention_cached` with `Ubatch::of`):
// kq_tiled for the scores, kqv_tiled for the output channels.
//
// With a softcap (the reference: family-ops' `attention_scored`): score_j
// = c * tanh(scale * (q_h . k_j) / c) in f64 plus the mask's entry; the
// softmax and the weighted sum of v in f64, rounded once.
template <typename KV>
__device__ void attention(const float* q, const KV* kc, const KV* vc, const float* mask,
                          float* out, double* scratch, int n_head, int n_head_kv, int dk, int dv,
                          int n_kv, i64 n_q, int mask_rows, int mode, i64 pos0, i64 window,
                          float scale, float softcap, int kq_tiled, int kqv_tiled) {
    int span = (n_kv + 31) & ~31;
    double* sc = scratch + (i64)blockIdx.x * span;
    float* pr = (float*)sc;
    int group = n_head / n_head_kv;
    for (i64 p = blockIdx.x; p < n_q * n_head; p += gridDim.x) {
        i64 r = p / n_head;
        int h = (int)(p % n_head);
        int g = h / group;
        const float* qh = q + r * n_head * dk + (i64)h * dk;
        const float* mr = mode == 3 ? mask + (r % mask_rows) * n_kv : 0;
        i64 qpos = pos0 + r;
        float* o = out + r * n_head * dv + (i64)h * dv;
        if (softcap <= 0.0f) {
            float mx = NEG_INF;
            for (int j = threadIdx.x; j < span; j += blockDim.x) {
                float s = NEG_INF;
                bool vis = j < n_kv &&
                           (mode == 0 || mode == 3 || (j <= qpos && (mode == 1 || qpos - j < window)));
                float add = mr && j < n_kv ? mr[j] : 0.0f;
                if (vis && add != NEG_INF)
                    s = __fadd_rn(
                        __fmul_rn(kq_dot(qh, kc + ((i64)j * n_head_kv + g) * dk, dk, kq_tiled), scale),
                        add);
                pr[j] = s;
                mx = fmaxf(mx, s);
            }
            mx = block_max(mx);
            if (mx == NEG_INF) {
                for (int c = threadIdx.x; c < dv; c += blockDim.x) o[c] = 0.0f;
                __syncthreads();
                continue;
            }
            ggml_soft_max_rest(pr, span, mx);
            for (int j = threadIdx.x; j < span; j += blockDim.x) pr[j] = as_kv(pr[j], vc);
            __syncthreads();
            for (int c = threadIdx.x; c < dv; c += blockDim.x) {
                auto vj = [&](int j) { return j < n_kv ? kv_at(vc, ((i64)j * n_head_kv + g) * dv + c) : 0.0f; };
                auto pj = [&](int j) { return pr[j]; };
                if (kqv_tiled) {
                    o[c] = tinyblas_dot(vj, pj, span);
                } else {
                    float v[8];
                    ggml_fma_steps(vj, pj, span, v);
                    o[c] = reduce_hadd8(v);
                }
            }
            __syncthreads();
            continue;
        }
        double mx = NEG_INF_D;
        for (int j = threadIdx.x; j < n_kv; j += blockDim.x) {
            bool vis = mode == 0 || mode == 3 || (j <= qpos && (mode == 1 || qpos - j < window));
            double s = NEG_INF_D;
            if (vis && !(mr && mr[j] == NEG_INF)) {
                const KV* kj = kc + ((i64)j * n_head_kv + g) * dk;
                double d = 0.0;
                for (int i = 0; i < dk; ++i) d += (double)qh[i] * (double)kv_at(kj, i);
                s = (double)softcap * tanh((double)scale * d / (double)softcap);
                if (mr) s = s + (double)mr[j];
            }
            sc[j] = s;
            mx = fmax(mx, s);
        }
        mx = block_max_d(mx);
        if (mx == NEG_INF_D) {
            for (int c = threadIdx.x; c < dv; c += blockDim.x) o[c] = 0.0f;
            __syncthreads();
            continue;
        }
        double sum = 0.0;
        for (int j = threadIdx.x; j < n_kv; j += blockDim.x) {
            double e = sc[j] == NEG_INF_D ? 0.0 : exp(sc[j] - mx);
            sc[j] = e;
            sum += e;
        }
        sum = block_sum_d(sum);
        __syncthreads();
        for (int c = threadIdx.x; c < dv; c += blockDim.x) {
            double acc = 0.0;
            for (int j = 0; j < n_kv; ++j) {
                if (sc[j] == 0.0) continue;
                acc += sc[j] / sum * (double)kv_at(vc, ((i64)j * n_head_kv + g) * dv + c);
            }
            o[c] = (float)acc;
        }
        __syncthreads();
    }
}

#define ATTENTION_KERNEL(NAME, KV)                                                          \
    extern "C" __global__ void NAME(const float* q, const KV* kc, const KV* vc,             \
                                    const float* mask, float* out, double* scratch,         \
                                    int n_head, int n_head_kv, int dk, int dv, int n_kv,    \
                                    i64 n_q, int mask_rows, int mode, i64 pos0, i64 window, \
                                    float scale, float softcap, int kq_tiled,               \
                                    int kqv_tiled) {                                        \
        attention<KV>(q, kc, vc, mask, out, scratch, n_head, n_head_kv, dk, dv, n_kv, n_q,  \
                      mask_rows, mode, pos0, window, scale, softcap, kq_tiled, kqv_tiled);  \
    }
ATTENTION_KERNEL(attention_f32, float)
ATTENTION_KERNEL(attention_f16, u16)

// --- routing and greedy choice -----------------------------------------------

// f32::total_cmp's key: a larger key is a larger value in the total order.
__device__ __forceinline__ int total_key(float f) {
    int b = __float_as_int(f);
    return b ^ (int)(((unsigned)(b >> 31)) >> 1);
}

// Whether expert a's selection score beats expert b's (`comp(a, b) =
// s[a] > s[b]` of llama.cpp's `top_k`; by total_key, the same order for the
// scores a route makes, which hold no NaN and no -0.0).
__device__ __forceinline__ bool sel_greater(const float* s, int a, int b) {
    return total_key(s[a]) > total_key(s[b]);
}

// libstdc++'s `__adjust_heap` on the heap h[0..len) of expert ids under
// sel_greater (its top the weakest member): the hole at `hole` sifted down
// to a leaf, then `value` pushed up from there (`__push_heap`). Each
// `(x - 1) / 2` and `(len - 2) / 2` below is only used where x >= 1 or
// len is even and >= 2, so C's truncation is libstdc++'s floor.
__device__ void heap_adjust(int* h, const float* s, int hole, int len, int value) {
    int top = hole, child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (sel_greater(s, h[child], h[child - 1])) child--;
        h[hole] = h[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        h[hole] = h[child - 1];
        hole = child - 1;
    }
    while (hole > top) {
        int parent = (hole - 1) / 2;
        if (!sel_greater(s, h[parent], value)) break;
        h[hole] = h[parent];
        hole = parent;
    }
    h[hole] = value;
}

// The k experts llama.cpp's CPU `top_k` keeps (std::partial_sort's
// `__heap_select` in libstdc++: make_heap on experts 0..k, then each later
// expert that beats the heap's top replaces it; family-ops'
// `libstdcxx_top_k`), written to h[0..k) highest score first, equal scores
// by index. One thread.
__device__ void libstdcxx_top_k(int* h, const float* s, int n, int k) {
    for (int i = 0; i < k; ++i) h[i] = i;
    if (k >= 2)
        for (int parent = (k - 2) / 2; parent >= 0; --parent) heap_adjust(h, s, parent, k, h[parent]);
    for (int i = k; i < n; ++i)
        if (sel_greater(s, i, h[0])) heap_adjust(h, s, 0, k, i);
    for (int i = 1; i < k; ++i) {
        int e = h[i], j = i;
        while (j > 0 && (sel_greater(s, e, h[j - 1]) ||
                         (total_key(s[e]) == total_key(s[h[j - 1]]) && e < h[j - 1]))) {
            h[j] = h[j - 1];
            --j;
        }
        h[j] = e;
    }
}

// family-ops' `route` of row blockIdx.x (grid-stride): p = ggml's softmax
// (softmax_f32's steps) or sigmoid (ggml_sigmoid) of the logits; selection scores
// p + bias in f32; the k experts llama.cpp's CPU `top_k` keeps
// (libstdcxx_top_k: where scores tie across the k-th place, libstdc++'s
// heap-select members), highest first, equal scores by index; weights p,
// normalized by their f64 sum rounded to f32 (when normalize and the sum
// is not 0), times scale. `p` and `sel` are
// scratch rows of n_expert floats.
extern "C" __global__ void route_f32(const float* logits, const float* bias, int* ids, float* wout,
                                     float* p, float* sel, int n_expert, i64 rows, int k,
                                     int sigmoid, int normalize, float scale) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* l = logits + r * n_expert;
        float* pr = p + r * n_expert;
        float* sr = sel + r * n_expert;
        int* ir = ids + r * k;
        float* wr = wout + r * k;
        if (sigmoid) {
            for (int e = threadIdx.x; e < n_expert; e += blockDim.x) pr[e] = ggml_sigmoid(l[e]);
        } else {
            // softmax_f32's steps (ggml's soft_max, scale 1, no mask)
            float mx = NEG_INF;
            for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
                pr[e] = l[e];
                mx = fmaxf(mx, l[e]);
            }
            ggml_soft_max_rest(pr, n_expert, block_max(mx));
        }
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x)
            sr[e] = bias ? pr[e] + bias[e] : pr[e];
        __syncthreads();
        // In parallel: each expert's place in the order "higher score
        // first, equal scores by index"; the first k places are the picks,
        // in the order libstdcxx_top_k writes them, unless scores tie
        // across the k-th place (the places k-1 and k hold equal scores):
        // then libstdc++'s heap decides which tied experts stay, and one
        // thread runs it.
        __shared__ int key_at[2];
        __shared__ int has_next;
        if (threadIdx.x == 0) has_next = 0;
        __syncthreads();
        for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
            int ke = total_key(sr[e]);
            int place = 0;
            for (int f = 0; f < n_expert; ++f) {
                int kf = total_key(sr[f]);
                place += (kf > ke) || (kf == ke && f < e);
            }
            if (place < k) ir[place] = e;
            if (place == k - 1) key_at[0] = ke;
            if (place == k) {
                key_at[1] = ke;
                has_next = 1;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0 && has_next && key_at[0] == key_at[1])
            libstdcxx_top_k(ir, sr, n_expert, k);
        __syncthreads();
        if (threadIdx.x == 0) {
            float s = 1.0f;
            if (normalize) {
                double acc = 0.0;
                for (int t = 0; t < k; ++t) acc += (double)pr[ir[t]];
                s = (float)acc;
            }
            for (int t = 0; t < k; ++t) {
                float w = pr[ir[t]];
                if (normalize && s != 0.0f) w = w / s;
                wr[t] = w * scale;
            }
        }
        __syncthreads();
    }
}

// family-ops' `argmax` of row blockIdx.x (grid-stride): the first largest
// value, a NaN never chosen unless it is the row's first element (then the
// answer is 0, as the sequential `v > x[best]` scan gives); 0 for an empty
// row or a row of NaN.
extern "C" __global__ void argmax_f32(const float* x, int* out, int cols, i64 rows) {
    __shared__ float sv[32];
    __shared__ int si[32];
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        float bv = NEG_INF;
        int bi = -1;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            float v = xr[i];
            if (v != v) continue;
            if (bi < 0 || v > bv || (v == bv && i < bi)) {
                bv = v;
                bi = i;
            }
        }
        int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
            int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            if (i2 >= 0 && (bi < 0 || v2 > bv || (v2 == bv && i2 < bi))) {
                bv = v2;
                bi = i2;
            }
        }
        __syncthreads();
        if (lane == 0) {
            sv[wid] = bv;
            si[wid] = bi;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            bv = sv[0];
            bi = si[0];
            for (int w = 1; w < nw; ++w) {
                if (si[w] >= 0 && (bi < 0 || sv[w] > bv || (sv[w] == bv && si[w] < bi))) {
                    bv = sv[w];
                    bi = si[w];
                }
            }
            if (cols == 0 || bi < 0 || xr[0] != xr[0]) bi = 0;
            out[r] = bi;
        }
    }
}

// --- gated delta-net -------------------------------------------------------------

// ggml's ssm_conv then its SiLU over the row (family-ops'
// `ggml_cpu::ssm_conv`, `silu_row`) over n tokens, one thread per channel:
// the window is the state's d_conv - 1 rows then x's n rows; out[t] =
// silu(the sum over k ascending of window[t + k] * w[ch][k], each product
// rounded, then added), the SiLU silu_f32's over a row of `channels`; then
// the state keeps the window's last d_conv - 1 rows.
extern "C" __global__ void ssm_conv_f32(float* state, const float* x, const float* w, float* out,
                                        int channels, int d_conv, i64 n) {
    int ds = d_conv - 1;
    for (i64 ch = (i64)blockIdx.x * blockDim.x + threadIdx.x; ch < channels;
         ch += (i64)gridDim.x * blockDim.x) {
        const float* wc = w + ch * d_conv;
        for (i64 t = 0; t < n; ++t) {
            float acc = 0.0f;
            for (int k = 0; k <= ds; ++k) {
                i64 wi = t + k;
                float v = wi < ds ? state[wi * channels + ch] : x[(wi - ds) * channels + ch];
                acc = __fadd_rn(acc, __fmul_rn(v, wc[k]));
            }
            out[t * channels + ch] = silu_at(acc, ch, channels);
        }
        for (int rr = 0; rr < ds; ++rr) {
            i64 wi = n + rr;
            state[rr * channels + ch] = wi < ds ? state[wi * channels + ch] : x[(wi - ds) * channels + ch];
        }
    }
}

// ggml's gated_delta_net (family-ops' `ggml_cpu::gated_delta_net`, and
// `gated_delta_net_kda` with per_key) over n tokens, one thread per (V head
// j, value c), in ggml's f32 steps: the state's value row M[., c] (key i at
// M[i * s + c]) decays by expf(g) (per_key: key i's by expf(g_i)); delta =
// (v_c - M_c . k) * beta; M_c += k * delta (fma); out = (M_c . q) / sqrtf(s);
// the dots ggml_dot_f32's. q/k head j % n_k_heads; g one a head ([n, hv])
// or, with per_key, one a key channel ([n, hv * s]).
extern "C" __global__ void delta_net_f32(float* state, const float* q, const float* k,
                                         const float* v, const float* g, const float* beta,
                                         float* out, int s, int hk, int hv, i64 n, int per_key) {
    i64 items = (i64)hv * s;
    float scale = __fdiv_rn(1.0f, __fsqrt_rn((float)s));
    for (i64 it = (i64)blockIdx.x * blockDim.x + threadIdx.x; it < items;
         it += (i64)gridDim.x * blockDim.x) {
        int j = (int)(it / s), c = (int)(it % s);
        float* m = state + (i64)j * s * s + c;
        auto mi = [&](int i) { return m[(i64)i * s]; };
        for (i64 t = 0; t < n; ++t) {
            const float* kt = k + (t * hk + j % hk) * s;
            const float* qt = q + (t * hk + j % hk) * s;
            const float* gt = per_key ? g + (t * hv + j) * s : g + t * hv + j;
            float decay = libm_expf(gt[0]);
            for (int i = 0; i < s; ++i)
                m[(i64)i * s] = __fmul_rn(m[(i64)i * s], per_key ? libm_expf(gt[i]) : decay);
            float dot = ggml_dot_f32(mi, [&](int i) { return kt[i]; }, s);
            float delta = __fmul_rn(__fsub_rn(v[(t * hv + j) * s + c], dot), beta[t * hv + j]);
            for (int i = 0; i < s; ++i) m[(i64)i * s] = __fmaf_rn(kt[i], delta, m[(i64)i * s]);
            out[(t * hv + j) * s + c] = __fmul_rn(ggml_dot_f32(mi, [&](int i) { return qt[i]; }, s), scale);
        }
    }
}

// --- gates, the L2 norm, column slices ---------------------------------------------

// ggml's sigmoid, each step rounded.
extern "C" __global__ void sigmoid_f32(const float* x, float* out, i64 n) {
    FOR_EACH(n) out[i] = ggml_sigmoid(x[i]);
}

// Gated DeltaNet's gates: g = softplus(alpha + dt) * a (add_f32,
// softplus_f32, mul_f32) and sigmoid_f32(beta), dt and a per v head.
extern "C" __global__ void delta_gates_f32(const float* alpha, const float* beta, const float* dt,
                                           const float* a, float* g, float* b, int hv, i64 n) {
    FOR_EACH(n) {
        g[i] = __fmul_rn(ggml_softplus(__fadd_rn(alpha[i], dt[i % hv])), a[i % hv]);
        b[i] = ggml_sigmoid(beta[i]);
    }
}

// ggml's softplus, each step rounded.
extern "C" __global__ void softplus_f32(const float* x, float* out, i64 n) {
    FOR_EACH(n) out[i] = ggml_softplus(x[i]);
}

// llama.cpp's build_gdn_l2_norm (family-ops' `ggml_cpu::l2_norm`) of row
// blockIdx.x (grid-stride): rms_norm_f32's steps with eps / cols, then
// each value times 1 / sqrtf(cols).
extern "C" __global__ void l2_norm_f32(const float* x, float* out, int cols, i64 rows, float eps) {
    float n = (float)cols;
    float e = __fdiv_rn(eps, n), s_n = __fdiv_rn(1.0f, __fsqrt_rn(n));
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        double s = 0.0;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) s += (double)__fmul_rn(xr[i], xr[i]);
        s = block_sum_d(s);
        float mean = (float)(s / (double)cols);
        float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, e)));
        for (int i = threadIdx.x; i < cols; i += blockDim.x)
            out[r * cols + i] = __fmul_rn(__fmul_rn(xr[i], scale), s_n);
    }
}

// out[r][c] = x[r][start + c] for c < len.
extern "C" __global__ void slice_cols_f32(const float* x, float* out, int cols, int start, int len,
                                          i64 n) {
    FOR_EACH(n) {
        i64 r = i / len;
        out[i] = x[r * cols + start + i % len];
    }
}

// ggml's mix of token r's picks (family-ops' `ggml_cpu::moe::mix`), column
// c (one thread each): y[r][t][c] * w[r][t] summed over the picks t
// (ascending), each step rounded to f32.
extern "C" __global__ void mix_experts_f32(const float* y, const float* w, float* out, int k,
                                           int cols, i64 n) {
    FOR_EACH(n * cols) {
        i64 r = i / cols;
        int c = (int)(i % cols);
        // ggml's sum of the picks' rows in order (family-ops' `moe::mix`).
        float acc = 0.0f;
        for (int t = 0; t < k; ++t) {
            float p = __fmul_rn(y[(r * k + t) * cols + c], w[r * k + t]);
            acc = t == 0 ? p : __fadd_rn(acc, p);
        }
        out[i] = acc;
    }
}

// Rows ids[k] of a [rows, cols] table; an id outside [0, rows) writes NaN
// (nothing is read back).
extern "C" __global__ void gather_rows_f32(const float* table, const int* ids, float* out,
                                           int cols, int rows, i64 n) {
    FOR_EACH(n * cols) {
        i64 k = i / cols;
        int id = ids[k];
        out[i] = (id < 0 || id >= rows) ? __int_as_float(0x7fc00000)
                                        : table[(i64)id * cols + i % cols];
    }
}

// out = r + f(s) (x) y over r's rows of n, each step rounded to f32; f(s) =
// s, or with `gated` post * sigmoid(pre * s) (ggml_sigmoid).
extern "C" __global__ void add_outer_f32(const float* r, const float* s, const float* y, float* out,
                                         int n, i64 total, int gated, float pre, float post) {
    FOR_EACH(total) {
        float f = s[i / n];
        if (gated) f = __fmul_rn(ggml_sigmoid(__fmul_rn(f, pre)), post);
        out[i] = __fadd_rn(r[i], __fmul_rn(f, y[i % n]));
    }
}

// out[j] = w * the sum over the m rows c (ascending, f32) of x[c][j] *
// sigmoid(g[c][j]), w = 1/m in f32 (family-ops' `ggml_cpu::hc_pre_gated`,
// each step rounded).
extern "C" __global__ void gated_mean_rows_f32(const float* x, const float* g, float* out, int m,
                                               i64 n, float w) {
    FOR_EACH(n) {
        float acc = 0.0f;
        for (int c = 0; c < m; ++c) {
            i64 k = (i64)c * n + i;
            acc = __fadd_rn(acc, __fmul_rn(x[k], ggml_sigmoid(g[k])));
        }
        out[i] = __fmul_rn(w, acc);
    }
}

// glm_moe_dsa's ops

// ggml's rope_ext in f32 (family-ops' `ggml_cpu::rope_ext`): one thread per
// element; pair i (normal: (2i, 2i+1), neox: (i, i + n_rot/2)) turns by the
// f32 running product theta = pos * theta_scale^i (i multiplications, as
// ggml_rope_cache_init), YaRN's ramp between corr0 and corr1 where
// ext_factor is not 0, cosf/sinf times mscale, and the rotation as fmaf(x0,
// cos, -(x1 * sin)), fmaf(x0, sin, x1 * cos). theta_scale and mscale come
// from the host, computed as the reference computes them.
extern "C" __global__ void rope_ggml_f32(const float* x, const int* pos, float* out, i64 rows,
                                         int cols, int head_dim, int n_rot, float theta_scale,
                                         float freq_scale, float ext_factor, float mscale,
                                         float corr0, float corr1, int neox) {
    i64 n = rows * cols;
    for (i64 k = (i64)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (i64)gridDim.x * blockDim.x) {
        i64 r = k / cols;
        int c = (int)(k % cols);
        int d = c % head_dim;
        if (d >= n_rot) {
            out[k] = x[k];
            continue;
        }
        int half = n_rot / 2;
        int i, partner;
        bool first;
        if (neox) {
            i = d % half;
            first = d < half;
            partner = first ? d + half : d - half;
        } else {
            i = d / 2;
            first = (d % 2) == 0;
            partner = first ? d + 1 : d - 1;
        }
        float theta_extrap = (float)pos[r];
        for (int j = 0; j < i; ++j) {
            theta_extrap = theta_extrap * theta_scale;
        }
        float theta_interp = freq_scale * theta_extrap;
        float theta = theta_interp;
        if (ext_factor != 0.0f) {
            float y = ((float)i - corr0) / fmaxf(0.001f, corr1 - corr0);
            float ramp_mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * ext_factor;
            theta = theta_interp * (1.0f - ramp_mix) + theta_extrap * ramp_mix;
        }
        float co = __fmul_rn(libm_cosf(theta), mscale);
        float s = __fmul_rn(libm_sinf(theta), mscale);
        i64 head = k - d;
        float a = x[head + (first ? d : partner)];
        float b = x[head + (first ? partner : d)];
        out[k] = first ? fmaf(a, co, -(b * s)) : fmaf(a, s, b * co);
    }
}

// Row r of a (ca values) then row r of b (cb values): one thread an output.
extern "C" __global__ void concat_cols_f32(const float* a, const float* b, float* out, int ca,
                                           int cb, i64 n) {
    FOR_EACH(n) {
        i64 w = (i64)ca + cb;
        i64 r = i / w;
        i64 c = i % w;
        out[i] = c < ca ? a[r * ca + c] : b[r * cb + (c - ca)];
    }
}

// ggml's norm of row blockIdx.x (family-ops' `ggml_cpu::norm`): the mean of
// an f64 sum rounded to f32, divided in f32; v = x - mean; the variance an
// f64 sum of the f32 squares (each whole 8 summed in f32 first, as ggml's
// vectorised loop does) over cols, rounded; times 1 / sqrtf(var + eps).
// Exact where the f64 sums are (their terms within 2^29 of each other).
extern "C" __global__ void layer_norm_f32(const float* x, float* out, int cols, i64 rows,
                                          float eps) {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + r * cols;
        double s = 0.0;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) s += (double)xr[i];
        s = block_sum_d(s);
        float mean = __fdiv_rn((float)s, (float)cols);
        // The squares as ggml sums them: each whole 8 in f32
        // (reduce_movehl8), the rest one by one, all of it in f64.
        int whole = cols & ~7;
        double a = 0.0;
        for (int c = threadIdx.x; c < whole / 8; c += blockDim.x) {
            float sq[8];
            for (int l = 0; l < 8; ++l) {
                float v = __fsub_rn(xr[8 * c + l], mean);
                sq[l] = __fmul_rn(v, v);
            }
            a += (double)reduce_movehl8(sq);
        }
        for (int i = whole + threadIdx.x; i < cols; i += blockDim.x) {
            float v = __fsub_rn(xr[i], mean);
            a += (double)__fmul_rn(v, v);
        }
        a = block_sum_d(a);
        float variance = (float)(a / (double)cols);
        float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(variance, eps)));
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            out[r * cols + i] = __fmul_rn(__fsub_rn(xr[i], mean), scale);
        }
    }
}

// The orthonormal fast Walsh-Hadamard transform (family-ops'
// `ggml_cpu::fwht`) of run i of n values, one thread a run: each value
// times scale first, then the butterflies (u + v, u - v) at strides 1, 2,
// 4, ... in place in out: the reference's f32 operations in its order.
extern "C" __global__ void hadamard_f32(const float* x, float* out, int n, float scale, i64 runs) {
    FOR_EACH(runs) {
        float* o = out + i * n;
        const float* xi = x + i * n;
        for (int j = 0; j < n; ++j) o[j] = xi[j] * scale;
        for (int len = 1; len < n; len *= 2) {
            for (int b = 0; b < n; b += 2 * len) {
                for (int j = b; j < b + len; ++j) {
                    float u = o[j], v = o[j + len];
                    o[j] = u + v;
                    o[j + len] = u - v;
                }
            }
        }
    }
}

// The lightning indexer's score of key j, bit for bit family-ops'
// `ggml_cpu::lightning_score`, one thread a key: over the heads h in
// order, ggml_dot_f32(q_h, k), max(., 0) * w[h] rounded, added in f32.
// Keys F32, or F16 (f16 = 1) widened.
extern "C" __global__ void lightning_scores_f32(const float* q, const u8* keys, const float* w,
                                                float* out, int d, int n_head, int f16,
                                                i64 n_keys) {
    FOR_EACH(n_keys) {
        const u8* key = keys + i * d * (f16 ? 2 : 4);
        float score = 0.0f;
        for (int h = 0; h < n_head; ++h) {
            const float* qh = q + h * d;
            float dot = ggml_dot_f32(
                [&](int c) { return qh[c]; },
                [&](int c) { return f16 ? f16_at(key + 2 * c) : ((const float*)key)[c]; }, d);
            score = __fadd_rn(score, __fmul_rn(fmaxf(dot, 0.0f), w[h]));
        }
        out[i] = score;
    }
}

// muse_glimmer's ops

// A final logit softcap c (family-ops' ggml_cpu::softcap): x * (1/c) in f32,
// tanh (in f64, rounded: within an ulp of libm's tanhf), times c in f32.
extern "C" __global__ void softcap_f32(const float* x, float* out, i64 n, float c) {
    FOR_EACH(n) {
        float s = x[i] * (1.0f / c);
        out[i] = (float)tanh((double)s) * c;
    }
}

// family-ops' projector::dot_rows_f64: out[i][j] = row i of a dotted with row
// j of b (k values each), the products summed in f64 in index order, rounded
// once. One thread per output.
extern "C" __global__ void dot_rows_f64_f32(const float* a, const float* b, float* out, int m,
                                            int k, i64 total) {
    FOR_EACH(total) {
        const float* ar = a + (i / m) * (i64)k;
        const float* br = b + (i % m) * (i64)k;
        double acc = 0.0;
        for (int p = 0; p < k; ++p) {
            acc += (double)ar[p] * (double)br[p];
        }
        out[i] = (float)acc;
    }
}

// The last two dims swapped: x [batch, rows, cols] to out [batch, cols, rows].
extern "C" __global__ void transpose_f32(const float* x, float* out, int rows, int cols, i64 n) {
    FOR_EACH(n) {
        i64 plane = (i64)rows * cols;
        i64 base = (i / plane) * plane;
        i64 rem = i % plane;
        i64 c = rem / rows;
        i64 r = rem % rows;
        out[i] = x[base + r * cols + c];
    }
}

// family-ops' projector::layer_norm of each row (one thread a row): the mean
// and the variance in f64 in index order, (x - mean) / sqrt(var + eps), times
// w and plus b where given, rounded once.
extern "C" __global__ void layer_norm_f64_f32(const float* x, const float* w, const float* b,
                                          float* out, int cols, i64 rows, float eps, int has_w,
                                          int has_b) {
    FOR_EACH(rows) {
        const float* xr = x + i * cols;
        float* o = out + i * cols;
        double sum = 0.0;
        for (int c = 0; c < cols; ++c) sum += (double)xr[c];
        double mean = sum / (double)cols;
        double var = 0.0;
        for (int c = 0; c < cols; ++c) {
            double d = (double)xr[c] - mean;
            var += d * d;
        }
        var = var / (double)cols;
        double inv = 1.0 / sqrt(var + (double)eps);
        for (int c = 0; c < cols; ++c) {
            double y = ((double)xr[c] - mean) * inv;
            if (has_w) y *= (double)w[c];
            if (has_b) y += (double)b[c];
            o[c] = (float)y;
        }
    }
}

// family-ops' projector::gelu_erf: 0.5 x (1 + erf(x / sqrt 2)) in f64, rounded.
extern "C" __global__ void gelu_erf_f32(const float* x, float* out, i64 n) {
    FOR_EACH(n) {
        double v = (double)x[i];
        out[i] = (float)(0.5 * v * (1.0 + erf(v / 1.4142135623730951)));
    }
}

// --- glm5_next's ops -----------------------------------------------------------------

// KDA's log decay of channel i % c (family-ops' reference `kda_gate`):
// g1 = alpha + dt, a per head of per_head channels; softplus(g1) * a, or
// with has_bound sigmoid(-(g1 * a)) * bound (each step rounded to f32).
extern "C" __global__ void kda_gate_f32(const float* alpha, const float* dt, const float* a,
                                        float* out, int c, int per_head, int has_bound,
                                        float bound, i64 n) {
    FOR_EACH(n) {
        int ch = (int)(i % c);
        float g1 = __fadd_rn(alpha[i], dt[ch]);
        float av = a[ch / per_head];
        if (has_bound) {
            out[i] = __fmul_rn(ggml_sigmoid(-__fmul_rn(g1, av)), bound);
        } else {
            out[i] = __fmul_rn(ggml_softplus(g1), av);
        }
    }
}

// mHC's weights of one token (family-ops' `ggml_cpu::hc_comb` and the
// sigmoids of build_hc_pre), one thread: pre and post from the first 2*hc
// mixes, the Sinkhorn combination comb[dst + hc * src] from the rest.
extern "C" __global__ void hc_weights_f32(const float* mix, const float* scale, const float* base,
                                          float* pre, float* post, float* comb, int hc, float eps,
                                          int iters) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (int c = 0; c < hc; ++c) {
        float v = __fadd_rn(__fmul_rn(mix[c], scale[0]), base[c]);
        pre[c] = __fadd_rn(ggml_sigmoid(v), eps);
        float u = __fadd_rn(__fmul_rn(mix[hc + c], scale[1]), base[hc + c]);
        post[c] = __fmul_rn(ggml_sigmoid(u), 2.0f);
    }
    const float* lg = mix + 2 * hc;
    const float* bs = base + 2 * hc;
    for (int src = 0; src < hc; ++src) {
        float mx = NEG_INF;
        for (int dst = 0; dst < hc; ++dst) {
            int i = src * hc + dst;
            comb[i] = __fmaf_rn(lg[i], scale[2], bs[i]);
            mx = fmaxf(mx, comb[i]);
        }
        float sum = 0.0f;
        for (int dst = 0; dst < hc; ++dst) {
            int i = src * hc + dst;
            comb[i] = libm_expf(__fsub_rn(comb[i], mx));
            sum = __fadd_rn(sum, comb[i]);
        }
        float inv = __fdiv_rn(1.0f, sum);
        for (int dst = 0; dst < hc; ++dst) {
            int i = src * hc + dst;
            comb[i] = __fmaf_rn(comb[i], inv, eps);
        }
    }
    for (int it = 0; it < iters; ++it) {
        if (it > 0) {
            for (int src = 0; src < hc; ++src) {
                float sum = eps;
                for (int dst = 0; dst < hc; ++dst) sum = __fadd_rn(sum, comb[dst + hc * src]);
                float inv = __fdiv_rn(1.0f, sum);
                for (int dst = 0; dst < hc; ++dst)
                    comb[dst + hc * src] = __fmul_rn(comb[dst + hc * src], inv);
            }
        }
        for (int dst = 0; dst < hc; ++dst) {
            float sum = eps;
            for (int src = 0; src < hc; ++src) sum = __fadd_rn(sum, comb[dst + hc * src]);
            float inv = __fdiv_rn(1.0f, sum);
            for (int src = 0; src < hc; ++src)
                comb[dst + hc * src] = __fmul_rn(comb[dst + hc * src], inv);
        }
    }
}

// scale * sum_c x[c][i] * w[c] (family-ops' `ggml_cpu::hc_pre_weighted`):
// the products rounded, added over the rows in order, not contracted.
extern "C" __global__ void hc_pre_weighted_f32(const float* x, const float* w, float* out, int hc,
                                               float scale, i64 n) {
    FOR_EACH(n) {
        float sum = 0.0f;
        for (int c = 0; c < hc; ++c) sum = __fadd_rn(sum, __fmul_rn(x[(i64)c * n + i], w[c]));
        out[i] = __fmul_rn(scale, sum);
    }
}

// Stream dst of mHC's post (family-ops' `ggml_cpu::hc_post_mixed`):
// y * post[dst] + sum_src residual[src] * comb[dst + hc * src], each product
// rounded, added in src order.
extern "C" __global__ void hc_post_mixed_f32(const float* y, const float* residual,
                                             const float* post, const float* comb, float* out,
                                             int hc, i64 n) {
    FOR_EACH((i64)hc * n) {
        int dst = (int)(i / n);
        i64 e = i % n;
        float sum = __fmul_rn(y[e], post[dst]);
        for (int src = 0; src < hc; ++src)
            sum = __fadd_rn(sum, __fmul_rn(residual[(i64)src * n + e], comb[dst + hc * src]));
        out[i] = sum;
    }
}

// The k-pool's pooled key, one thread a dim, bit for bit the reference
// (device-ops' reference `pool_keys`): ggml's softmax over the kp members
// of gate + ape (ggml_expf on the whole 8s, libm's on the rest; each 8
// summed by reduce_movehl8, those and the rest in order in f64; the
// reciprocal rounded and multiplied in), the keys weighed and summed in
// f64 in order (`ggml_cpu::sum`). Keys and gates F32, or F16 (f16 = 1)
// widened.
__device__ __forceinline__ float pool_logit(const u8* gates, const float* ape, i64 first, int m,
                                            int f16, i64 d, i64 i) {
    i64 at = (first + m) * d + i;
    float g = f16 ? f16_at(gates + 2 * at) : ((const float*)gates)[at];
    return __fadd_rn(g, ape[m * d + i]);
}

extern "C" __global__ void pool_keys_f32(const u8* keys, const u8* gates, const float* ape,
                                         float* out, i64 first, int kp, int f16, i64 d) {
    FOR_EACH(d) {
        int whole = kp & ~7;
        float mx = NEG_INF;
        for (int m = 0; m < kp; ++m) mx = fmaxf(mx, pool_logit(gates, ape, first, m, f16, d, i));
        double sum = 0.0;
        for (int m0 = 0; m0 < whole; m0 += 8) {
            float e[8];
            for (int l = 0; l < 8; ++l)
                e[l] = ggml_expf(__fsub_rn(pool_logit(gates, ape, first, m0 + l, f16, d, i), mx));
            sum += (double)reduce_movehl8(e);
        }
        for (int m = whole; m < kp; ++m)
            sum += (double)libm_expf(__fsub_rn(pool_logit(gates, ape, first, m, f16, d, i), mx));
        float inv = (float)(1.0 / sum);
        double total = 0.0;
        for (int m = 0; m < kp; ++m) {
            float w = __fsub_rn(pool_logit(gates, ape, first, m, f16, d, i), mx);
            float p = __fmul_rn(m < whole ? ggml_expf(w) : libm_expf(w), inv);
            i64 at = (first + m) * d + i;
            float k = f16 ? f16_at(keys + 2 * at) : ((const float*)keys)[at];
            total += (double)__fmul_rn(p, k);
        }
        out[i] = (float)total;
    }
}

__device__ __forceinline__ float kv_at(const u8* kv, i64 at, int f16) {
    return f16 ? f16_at(kv + 2 * at) : ((const float*)kv)[at];
}

// The gathered k-pool attention of head blockIdx.x (grid-stride) over
// its n_slots slots, bit for bit the reference (device-ops' reference
// `attention_slots`): a live slot's score ggml_dot_f32 of its row with the
// head's query (neither rounded), a dead one (-1) 0 masked to -inf, a
// slot past the rows NaN; ggml's softmax with `scale` over the slots
// (ggml_exp_sum); each output channel the ggml_dot_f32 of the slots'
// values (0 where dead) with the probabilities. `scratch` holds n_slots
// floats a block.
extern "C" __global__ void attention_slots_f32(const float* q, const u8* kv, const int* slots,
                                               float* out, float* scratch, int n_slots, int d,
                                               i64 rows, int f16, float scale, i64 n_head) {
    float* pr = scratch + (i64)blockIdx.x * n_slots;
    for (i64 h = blockIdx.x; h < n_head; h += gridDim.x) {
        const float* qh = q + h * d;
        float mx = NEG_INF;
        for (int s = threadIdx.x; s < n_slots; s += blockDim.x) {
            int cell = slots[s];
            float v;
            if (cell == -1) {
                v = NEG_INF;
            } else if (cell < 0 || (i64)cell >= rows) {
                v = __int_as_float(0x7fc00000);
            } else {
                const u8* row = kv + (i64)cell * d * (f16 ? 2 : 4);
                float dot = ggml_dot_f32([&](int c) { return kv_at(row, c, f16); },
                                         [&](int c) { return qh[c]; }, d);
                v = __fmul_rn(dot, scale);
            }
            pr[s] = v;
            mx = fmaxf(mx, v);
        }
        ggml_soft_max_rest(pr, n_slots, block_max(mx));
        for (int c = threadIdx.x; c < d; c += blockDim.x) {
            out[h * d + c] = ggml_dot_f32(
                [&](int s) {
                    int cell = slots[s];
                    return cell < 0 || (i64)cell >= rows ? 0.0f : kv_at(kv, (i64)cell * d + c, f16);
                },
                [&](int s) { return pr[s]; }, n_slots);
        }
        __syncthreads();
    }
}

// The clamped SwiGLU (family-ops' `ggml_cpu::swiglu_clamp`): g = min(gate,
// limit), u = clamp(up, -limit, limit), g / (1 + expf(-g)) * u, each step
// rounded, expf libm's.
extern "C" __global__ void swiglu_clamp_f32(const float* gate, const float* up, float* out,
                                            float limit, i64 n) {
    FOR_EACH(n) {
        float g = fminf(gate[i], limit);
        float u = fminf(fmaxf(up[i], -limit), limit);
        out[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, libm_expf(-g))), u);
    }
}
