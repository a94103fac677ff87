# Writes host.cpp's include (argv[2]) from ops.cu (argv[1]): the code up to
# the gathers, less the PTX half conversions (host.cpp has its own), with a
# warp_row and warp_row_i8 that sum the lanes one after another.
import re, sys
src = open(sys.argv[1]).read()
start = src.index('typedef unsigned char u8;')
end = src.index('// --- gathers')  # the int8 products come before it
s = src[start:end]
# PTX half conversions -> host.
s = re.sub(r'__device__ __forceinline__ float h2f\(u16 h\) \{.*?\n\}\n', '', s, flags=re.S)
s = re.sub(r'__device__ __forceinline__ u16 f2h\(float f\) \{.*?\n\}\n', '', s, flags=re.S)


def lanes_row(name, x_params, dot, x_args):
    """A host `name` for the device row function: the row over its
    emulated lanes, 32 of one warp or the 32 * parts of a block a row,
    summed by the part-0 warp (the lead that writes); the other parts get
    zeros."""
    return f'''template <int T, int NB>
void {name}(const u8* row, int ne0, {x_params}, int part, int parts, float* acc) {{
    float tot[NB];
    for (int j = 0; j < NB; ++j) tot[j] = 0.0f;
    for (int lane = 0; part == 0 && lane < 32 * parts; ++lane) {{
        float a[NB];
        for (int j = 0; j < NB; ++j) a[j] = 0.0f;
        {dot}<T, NB>(row, ne0, {x_args}, lane, 32 * parts, a);
        for (int j = 0; j < NB; ++j) tot[j] += a[j];
    }}
    for (int j = 0; j < NB; ++j) acc[j] = tot[j];
}}

'''


def replace_between(s, start, end, text):
    a = s.index(start)
    return s[:a] + text + s[s.index(end, a):]


# summed_row and summed_row_i8 -> their host versions.
s = replace_between(s, "// Row r's products with the activation rows", "// (end of summed_row)",
                    lanes_row("summed_row", "const float* const* xr, u32 live, bool xa", "row_dot",
                              "xr, live, xa"))
# float_lanes_block_row -> the lead part's lanes as float_lanes_row's
# (the round's staging in shared memory is the GPU check's), zeros for the
# others.
s = replace_between(s, "// float_lanes_row for few long rows, a block a row", "// (end of float_lanes_block_row)", '''template <int T, int NB>
void float_lanes_block_row(const u8* row, int ne0, const float* const* xr, u32 live, int part,
                           float* acc) {
    if (part == 0) float_lanes_row<T, NB>(row, ne0, xr, live, acc);
    else for (int j = 0; j < NB; ++j) acc[j] = 0.0f;
}

''')
# float_lanes_row -> each of the 32 lanes' chains one after another, then
# the lanes met as the shuffles meet them.
s = replace_between(s, "// Row r's F32/F16/BF16 products in ggml's lanes", "// (end of float_lanes_row)", '''template <int T, int NB>
void float_lanes_row(const u8* row, int ne0, const float* const* xr, u32 live, float* acc) {
    float a[32][NB];
    for (int k = 0; k < 32; ++k) float_lane_chain<T, NB>(row, ne0, xr, live, k, a[k]);
    for (int j = 0; j < NB; ++j) {
        float v[8];
        for (int l = 0; l < 8; ++l) v[l] = (a[l][j] + a[16 + l][j]) + (a[8 + l][j] + a[24 + l][j]);
        acc[j] = ((live >> j) & 1) ? float_lanes_sum<T>(v, row, ne0, xr[j]) : 0.0f;
    }
}

''')
s = replace_between(s, "// Row r's int8 products summed", "// (end of summed_row_i8)",
                    lanes_row("summed_row_i8", "const u8* const* xq, const float* const* xd, u32 live",
                              "row_dot_i8", "xq, xd, live"))
# lanes_row_i8 -> the part-0 warp runs each round's units, then each chain,
# one after another (the other parts get zeros).
s = replace_between(s, "// Row r's int8 products in ggml's lanes", "// (end of lanes_row_i8)", '''template <int T, int NB>
void lanes_row_i8(const u8* row, int ne0, const u8* const* xq, const float* const* xd, u32 live,
                  int part, int parts, int rows, bool many, float* acc) {
    constexpr int S = lanes_slot<NB>();
    constexpr int CPR = lanes_chains<T>();
    int order = nl_order(rows, many);
    std::vector<int> slots(32 * parts * S, 0x7fbfffff);
    float ch[CPR * NB] = {};
    int nu = ne0 / 32, round = 32 * parts;
    for (int u0 = 0; part == 0 && u0 < nu; u0 += round) {
        int n = min(round, nu - u0);
        for (int k = 0; k < n; ++k) lanes_unit_i8<T, NB>(row, u0 + k, xq, xd, live, &slots[k * S]);
        for (int c = 0; c < CPR * NB; ++c)
            if ((live >> (c / CPR)) & 1)
                ch[c] = lanes_chain_i8<T, NB>(slots.data(), u0, n, nu, c, order, ch[c]);
    }
    const int* last = slots.data() + (nu > 0 ? ((nu - 1) % round) * S : 0);
    for (int j = 0; j < NB; ++j)
        acc[j] = part == 0 && nu > 0 ? lanes_row_sum<T>(ch + CPR * j, last + 9 * j, nu, order) : 0.0f;
}

''')
# dp4a's PTX -> host.cpp's.
s = re.sub(r'__device__ __forceinline__ int dp4a\(u32 a, u32 b, int c\) \{.*?\n\}\n', '', s, flags=re.S)
# The int8 kernels' extern "C" wrappers need the device runtime's types.
s = s[:s.index('#define INT8_KERNELS')]
open(sys.argv[2], 'w').write(s)

# argv[3], argv[4] (ggml_steps.cpp's includes): imrope_f32 as it is
# (without its extern "C"), and ops.cu's ggml arithmetic (its section: the
# vectorised exp, libm's stand-ins, the dots, the block softmax) as it is.
if len(sys.argv) > 4:
    full = open(sys.argv[1]).read()
    k = full.index('extern "C" __global__ void imrope_f32(')
    open(sys.argv[3], 'w').write(full[k:full.index('\n}\n', k) + 3].replace('extern "C" ', '', 1))
    a = full.index("// --- ggml's CPU arithmetic")
    open(sys.argv[4], 'w').write(full[a:full.index('// --- products: one warp', a)])
# argv[5] (ggml_steps.cpp's third include): the block reductions and the
# attention template with its helpers, as they are.
if len(sys.argv) > 5:
    a = full.index('// --- block reductions')
    b = full.index('// A KV cache\'s element widened')
    open(sys.argv[5], 'w').write(full[a:full.index('// --- dequantization', a)] + '\n' +
                                 full[b:full.index('#define ATTENTION_KERNEL', b)])
