# Writes host.cpp's include (argv[2]) from ops.cu (argv[1]): the code up to
# the gathers, less the PTX half conversions (host.cpp has its own), with a
# warp_row that sums the 32 lanes one after another.
import re, sys
src = open(sys.argv[1]).read()
start = src.index('typedef unsigned char u8;')
end = src.index('// --- gathers')  # the int8 products come before it
s = src[start:end]
# PTX half conversions -> host.
s = re.sub(r'__device__ __forceinline__ float h2f\(u16 h\) \{.*?\n\}\n', '', s, flags=re.S)
s = re.sub(r'__device__ __forceinline__ u16 f2h\(float f\) \{.*?\n\}\n', '', s, flags=re.S)
# warp_row -> the whole row over its emulated lanes: 32 of one warp, or
# the 32 * parts of a block a row, summed by the part-0 warp (the lead that
# writes); the other parts get zeros.
a = s.index("// Row r's products")
b = s.index("// The row a thread's warp works on")
s = s[:a] + '''template <int T, int NB>
void warp_row(const u8* row, int ne0, const float* const* xr, u32 live, bool xa, int part,
              int parts, float* acc) {
    float tot[NB];
    for (int j = 0; j < NB; ++j) tot[j] = 0.0f;
    for (int lane = 0; part == 0 && lane < 32 * parts; ++lane) {
        float a[NB];
        for (int j = 0; j < NB; ++j) a[j] = 0.0f;
        row_dot<T, NB>(row, ne0, xr, live, xa, lane, 32 * parts, a);
        for (int j = 0; j < NB; ++j) tot[j] += a[j];
    }
    for (int j = 0; j < NB; ++j) acc[j] = tot[j];
}

''' + s[b:]
# dp4a's PTX -> host.cpp's.
s = re.sub(r'__device__ __forceinline__ int dp4a\(u32 a, u32 b, int c\) \{.*?\n\}\n', '', s, flags=re.S)
# warp_row_i8 -> the row over its emulated lanes, as warp_row.
a = s.index("// Row r's int8 products")
b = s.index("// (end of warp_row_i8)")
s = s[:a] + '''template <int T, int NB>
void warp_row_i8(const u8* row, int ne0, const u8* const* xq, const float* const* xd, u32 live,
                 int part, int parts, float* acc) {
    float tot[NB];
    for (int j = 0; j < NB; ++j) tot[j] = 0.0f;
    for (int lane = 0; part == 0 && lane < 32 * parts; ++lane) {
        float a[NB];
        for (int j = 0; j < NB; ++j) a[j] = 0.0f;
        row_dot_i8<T, NB>(row, ne0, xq, xd, live, lane, 32 * parts, a);
        for (int j = 0; j < NB; ++j) tot[j] += a[j];
    }
    for (int j = 0; j < NB; ++j) acc[j] = tot[j];
}
''' + s[b:]
# The int8 kernels' extern "C" wrappers need the device runtime's types.
s = s[:s.index('#define INT8_KERNELS')]
open(sys.argv[2], 'w').write(s)
