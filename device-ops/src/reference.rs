//! The CPU reference of every op, over host slices: `family-ops` as it is,
//! row by row, and where ggml's CPU backend has the op, its arithmetic
//! (`family_ops::ggml_cpu`: the products of one token, SiLU by rows,
//! sigmoid and softplus, the L2 norm, `ssm_conv`, `gated_delta_net`,
//! IMROPE, the hyper-connections' gated mean, the experts' mix, softmax
//! routing, the attention over a cache of its type), so a host path that
//! repeats llama.cpp's CPU graph and a device path over these ops agree
//! to the last bits op for op. [`crate::CpuOps`] and the fake device run
//! these on their own buffers; the conformance check compares every
//! device with them.
//!
//! Layouts are row-major, the last dimension contiguous: a matrix of `n`
//! rows of `cols` values is `n · cols` values.

use seam::gguf::GgmlType;

use crate::OpError;

/// `y[i][r] = Σ_k W[r][k] · x[i][k]` for `n = x.len() / ne0` rows of
/// activations, the rows one ubatch, as ggml's x86 CPU `mul_mat` computes
/// it with `n` columns (`family_ops::ggml_cpu::matvec` with
/// `Ubatch::of(i, n)`: the activations rounded to the type's
/// `vec_dot_type`, the kernel's order of sums; one row is one token's
/// `vec_dot`, several take llamafile's tinyBLAS for a float weight of a
/// multiple of 4 rows of whole 8s and for IQ4_NL, the repacked `gemm` for
/// rows in whole 4s of a Q4_0/Q4_K/IQ4_NL weight of a multiple of 8 rows,
/// the tiled K-quant kernel from 8 rows), the host paths' arithmetic: a
/// prompt fed as one ubatch on the host and as one matrix on a device
/// sums alike, so a near tie of a router resolves alike. A type it does
/// not reproduce: the activations rounded as ggml rounds them
/// (`family_ops::as_ggml_multiplies`), each dot
/// `family_ops::matvec`'s (summed in `f64`, rounded once). `weight` holds
/// `rows` rows of `ne0` elements of `ty`.
///
/// # Errors
///
/// `ty` has no dequantizer or no activation format, or a length does not
/// fit.
pub fn matmul(
    ty: GgmlType,
    weight: &[u8],
    ne0: usize,
    rows: usize,
    x: &[f32],
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "matmul";
    if ne0 == 0 {
        return Err(OpError::Invalid {
            op: OP,
            why: "rows of 0 elements".into(),
        });
    }
    let n = x.len() / ne0;
    products(ty, weight, ne0, rows, x, |i| {
        family_ops::ggml_cpu::Ubatch::of(i, n)
    })
}

/// Whether [`matmul`] sums `n` activation rows by a float weight (F32,
/// F16, BF16) of `rows` rows of `ne0` as llamafile's tinyBLAS does
/// (`family_ops::ggml_cpu::dot_tinyblas`: several rows, a multiple of 4
/// weight rows of whole 8s), not as one token's `vec_dot`: what a device
/// that follows the reference's order of sums asks.
pub fn float_products_tiled(n: usize, rows: usize, ne0: usize) -> bool {
    family_ops::ggml_cpu::tinyblas_takes(family_ops::ggml_cpu::Ubatch::of(0, n), rows, ne0)
}

/// Whether [`attention`] of `n_q` query rows of `shape` over `n_kv` slots
/// of a cache of `dtype` sums the scores (`q · k`) and the output
/// (`p · v`) as llamafile's tinyBLAS does (`family_ops::ggml_cpu::
/// attention_tiles`), not as one token's `vec_dot`: what a device that
/// follows the reference's order of sums asks.
pub fn attention_tiled(
    n_q: usize,
    n_kv: usize,
    shape: &family_ops::AttentionShape,
    dtype: crate::DType,
) -> (bool, bool) {
    let k_type = match dtype {
        crate::DType::F16 => family_ops::CacheType::F16,
        _ => family_ops::CacheType::F32,
    };
    family_ops::ggml_cpu::attention_tiles(
        family_ops::ggml_cpu::Ubatch::of(0, n_q),
        n_kv.next_multiple_of(32),
        shape.head_dim_k,
        shape.head_dim_v,
        k_type,
        shape.n_head == 1,
    )
}

/// [`matmul`]'s rows, row `i` summed as ggml sums it at `ubatch(i)`.
fn products(
    ty: GgmlType,
    weight: &[u8],
    ne0: usize,
    rows: usize,
    x: &[f32],
    ubatch: impl Fn(usize) -> family_ops::ggml_cpu::Ubatch,
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "matmul";
    let n = x.len() / ne0;
    let mut y = vec![0f32; n * rows];
    let ggml = family_ops::ggml_cpu::is_emulated(ty);
    for (i, (xi, yi)) in x
        .chunks_exact(ne0)
        .zip(y.chunks_exact_mut(rows.max(1)))
        .enumerate()
    {
        if ggml {
            family_ops::ggml_cpu::matvec(
                ty,
                weight,
                ne0,
                rows,
                rows,
                ubatch(i),
                xi,
                &mut yi[..rows],
            )
            .map_err(OpError::reference(OP))?;
            continue;
        }
        f64_products(OP, ty, weight, ne0, rows, xi, &mut yi[..rows])?;
    }
    Ok(y)
}

/// One row `x` of activations times a weight as a float64 reference
/// multiplies it: `x` rounded as ggml rounds the activations of `ty`
/// (`family_ops::as_ggml_multiplies`), each dot `family_ops::matvec`'s
/// (the products summed in `f64`, rounded once).
fn f64_products(
    op: &'static str,
    ty: GgmlType,
    weight: &[u8],
    ne0: usize,
    rows: usize,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), OpError> {
    let xq = family_ops::as_ggml_multiplies(ty, x).map_err(OpError::reference(op))?;
    family_ops::matvec(ty, weight, ne0, rows, &xq, y).map_err(OpError::reference(op))
}

/// The activations ggml's CPU multiplies a weight of `ty` by
/// (`family_ops::as_ggml_multiplies`), for one row or several of whole
/// blocks.
///
/// # Errors
///
/// `x` is not whole blocks of `ty`'s activation format, or `ty` has none.
pub fn rounded_activations(ty: GgmlType, x: &[f32]) -> Result<Vec<f32>, OpError> {
    family_ops::as_ggml_multiplies(ty, x).map_err(OpError::reference("matmul"))
}

/// Rows `ids` of a table of `ne0`-element rows of `ty`, dequantized
/// (`family_ops::dequantize_row`).
///
/// # Errors
///
/// An id outside the table (named with `weight`), or a type without a
/// dequantizer.
pub fn get_rows(
    ty: GgmlType,
    table: &[u8],
    ne0: usize,
    rows: usize,
    ids: &[i32],
    weight: &str,
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "get_rows";
    let mut out = vec![0f32; ids.len() * ne0];
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(ne0.max(1))) {
        let row = row_in(OP, weight, id, rows)?;
        family_ops::dequantize_row(ty, table, ne0, row, &mut o[..ne0])
            .map_err(OpError::reference(OP))?;
    }
    Ok(out)
}

/// The RMSNorm weight on the host.
#[derive(Clone, Copy, Debug)]
pub enum HostNorm<'a> {
    /// No weight.
    None,
    /// Times `w`.
    Scale(&'a [f32]),
    /// Times `1 + w`.
    OnePlus(&'a [f32]),
}

/// `family_ops::rms_norm` of each row of `cols` values; a weight of `m`
/// rows gives row `i` its row `i % m`.
///
/// # Errors
///
/// The weight is not whole rows of `cols`.
pub fn rms_norm<'w>(
    x: &[f32],
    cols: usize,
    eps: f32,
    w: HostNorm<'w>,
) -> Result<Vec<f32>, OpError> {
    let mut out = x.to_vec();
    if cols == 0 {
        return Ok(out);
    }
    let m = match w {
        HostNorm::None => 1,
        HostNorm::Scale(w) | HostNorm::OnePlus(w) => (w.len() / cols).max(1),
    };
    for (i, row) in out.chunks_exact_mut(cols).enumerate() {
        // Row `i % m` of a weight of whole rows; any other length goes to
        // family_ops whole, which refuses it.
        let part = |w: &'w [f32]| -> &'w [f32] {
            if w.len() == m * cols {
                &w[(i % m) * cols..][..cols]
            } else {
                w
            }
        };
        let weight = match w {
            HostNorm::None => family_ops::NormWeight::None,
            HostNorm::Scale(w) => family_ops::NormWeight::Scale(part(w)),
            HostNorm::OnePlus(w) => family_ops::NormWeight::OnePlus(part(w)),
        };
        family_ops::rms_norm_in_place(row, eps, weight).map_err(OpError::reference("rms_norm"))?;
    }
    Ok(out)
}

/// `family_ops::rope` of each row of `cols` values at its position.
///
/// # Errors
///
/// A negative position, or family-ops refuses the shape.
pub fn rope(
    x: &[f32],
    cols: usize,
    positions: &[i32],
    head_dim: usize,
    rope: &family_ops::Rope,
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "rope";
    let mut out = x.to_vec();
    if cols == 0 {
        return Ok(out);
    }
    for (row, &p) in out.chunks_exact_mut(cols).zip(positions) {
        let p = usize::try_from(p).map_err(|_| OpError::Invalid {
            op: OP,
            why: format!("position {p} is negative"),
        })?;
        family_ops::rope(row, head_dim, p, rope).map_err(OpError::reference(OP))?;
    }
    Ok(out)
}

/// `family_ops::ggml_cpu::soft_max` of each row of `cols` values, mask row
/// `r % mask_rows` for row `r`.
///
/// # Errors
///
/// family-ops refuses the mask.
pub fn softmax(
    x: &[f32],
    cols: usize,
    scale: f32,
    mask: Option<&[f32]>,
) -> Result<Vec<f32>, OpError> {
    let mut out = x.to_vec();
    if cols == 0 {
        return Ok(out);
    }
    let mask_rows = mask.map(|m| (m.len() / cols).max(1));
    for (r, row) in out.chunks_exact_mut(cols).enumerate() {
        let m = mask.zip(mask_rows).map(|(m, mr)| {
            let i = r % mr;
            &m[i * cols..(i + 1) * cols]
        });
        family_ops::ggml_cpu::soft_max(row, scale, m).map_err(OpError::reference("softmax"))?;
    }
    Ok(out)
}

/// ggml's unary SiLU over each row of `cols` values
/// (`family_ops::ggml_cpu::silu_row`: whole 8s through `ggml_v_silu`, the
/// rest with libm's `expf`).
pub fn silu(x: &[f32], cols: usize) -> Vec<f32> {
    let mut out = x.to_vec();
    if cols > 0 {
        out.chunks_mut(cols)
            .for_each(family_ops::ggml_cpu::silu_row);
    }
    out
}

/// GELU, tanh form, in `f32` as ggml's `ggml_gelu_f32` writes it: `0.5 ·
/// x · (1 + tanh(√(2/π) · x · (1 + 0.044715 · x²)))`. (ggml's CPU backend
/// reads it from an F16 table by default; this is the formula, not the
/// table.)
pub fn gelu_one(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const GELU_COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// [`gelu_one`], element-wise.
pub fn gelu(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| gelu_one(v)).collect()
}

/// `family_ops::ggml_cpu::swiglu` of each row of `cols` values.
///
/// # Errors
///
/// The lengths differ.
pub fn swiglu(gate: &[f32], up: &[f32], cols: usize) -> Result<Vec<f32>, OpError> {
    const OP: &str = "swiglu";
    let mut out = vec![0f32; gate.len()];
    if cols == 0 {
        return Ok(out);
    }
    for ((g, u), o) in gate
        .chunks_exact(cols)
        .zip(up.chunks_exact(cols))
        .zip(out.chunks_exact_mut(cols))
    {
        family_ops::ggml_cpu::swiglu(g, u, o).map_err(OpError::reference(OP))?;
    }
    Ok(out)
}

/// `a ∘ b` with `b` repeated over `a` (`b[i % b.len()]`).
pub fn binary(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> Vec<f32> {
    if b.is_empty() {
        return Vec::new();
    }
    a.iter()
        .enumerate()
        .map(|(i, &x)| f(x, b[i % b.len()]))
        .collect()
}

/// [`crate::AttnMask`] on the host: an additive mask's values and rows.
#[derive(Clone, Copy, Debug)]
pub enum HostAttnMask<'a> {
    /// Every slot.
    All,
    /// Query row `i` at position `pos0 + i`, causal.
    Causal {
        /// The first row's position.
        pos0: usize,
    },
    /// Causal within `window`.
    SlidingWindow {
        /// The first row's position.
        pos0: usize,
        /// The window.
        window: usize,
    },
    /// `[rows, n_kv]` values added to the scores, row `i % rows` for query
    /// row `i`.
    Additive {
        /// The values.
        mask: &'a [f32],
        /// Its rows.
        rows: usize,
    },
}

/// llama.cpp's attention of each query row of `q` (`n_head · head_dim_k`
/// wide) over the first `n_kv` slots of the caches `k` and `v` (rows of
/// `n_head_kv` heads, their values as a cache of `dtype` stores them),
/// with the row's mask, the rows one ubatch, as ggml's CPU backend
/// computes it (`family_ops::ggml_cpu::attention_cached` with
/// `Ubatch::of(i, n)`: `q` converted to the cache's type, then the
/// probabilities too; one row is one token's `vec_dot`s, several take
/// tinyBLAS where ggml's `mul_mat` does; the host paths' arithmetic). A row
/// that sees no slot gets zeros. A softcap (ggml's `tanh` of the scaled
/// scores) goes through `family_ops::attention_scored` (in `f64`).
///
/// # Errors
///
/// family-ops refuses the shapes or the softcap.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_kv: usize,
    shape: &family_ops::AttentionShape,
    scores: &family_ops::Scores,
    mask: HostAttnMask<'_>,
    dtype: crate::DType,
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "attention";
    let (qw, kw, vw) = (
        shape.n_head * shape.head_dim_k,
        shape.n_head_kv * shape.head_dim_k,
        shape.n_head_kv * shape.head_dim_v,
    );
    let ow = shape.n_head * shape.head_dim_v;
    if qw == 0 || ow == 0 || k.len() < n_kv * kw || v.len() < n_kv * vw {
        return Err(OpError::Invalid {
            op: OP,
            why: format!("{shape:?} over {n_kv} slots"),
        });
    }
    let (k, v) = (&k[..n_kv * kw], &v[..n_kv * vw]);
    let n_q = q.len() / qw;
    if let HostAttnMask::Additive { mask, rows } = mask
        && (rows == 0 || mask.len() < rows * n_kv)
    {
        return Err(OpError::Invalid {
            op: OP,
            why: format!("a mask of {} values for {rows} rows of {n_kv}", mask.len()),
        });
    }
    let cache_type = match dtype {
        crate::DType::F16 => family_ops::CacheType::F16,
        _ => family_ops::CacheType::F32,
    };
    let mut out = vec![0f32; n_q * ow];
    let mut add = vec![0f32; n_kv];
    for (i, (qi, oi)) in q.chunks_exact(qw).zip(out.chunks_exact_mut(ow)).enumerate() {
        let m = match mask {
            HostAttnMask::All => family_ops::Mask::All,
            HostAttnMask::Causal { pos0 } => family_ops::Mask::Causal {
                query_pos: pos0 + i,
            },
            HostAttnMask::SlidingWindow { pos0, window } => family_ops::Mask::SlidingWindow {
                query_pos: pos0 + i,
                window,
            },
            HostAttnMask::Additive { mask, rows } => {
                let r = i % rows.max(1);
                family_ops::Mask::Additive(&mask[r * n_kv..(r + 1) * n_kv])
            }
        };
        if scores.softcap.is_some() {
            family_ops::attention_scored(qi, k, v, shape, scores, m, oi)
                .map_err(OpError::reference(OP))?;
            continue;
        }
        for (j, a) in add.iter_mut().enumerate() {
            *a = match m {
                family_ops::Mask::All => 0.0,
                family_ops::Mask::Causal { query_pos } if j <= query_pos => 0.0,
                family_ops::Mask::SlidingWindow { query_pos, window }
                    if j <= query_pos && query_pos - j < window =>
                {
                    0.0
                }
                family_ops::Mask::Additive(row) => row[j],
                _ => f32::NEG_INFINITY,
            };
        }
        if add.iter().all(|&a| a == f32::NEG_INFINITY) {
            oi.fill(0.0);
            continue;
        }
        let cells = family_ops::ggml_cpu::KvCells {
            k,
            k_stride: kw,
            v,
            v_stride: vw,
            first_cell: 0,
            mask: Some(&add),
            k_type: cache_type,
            v_type: cache_type,
        };
        family_ops::ggml_cpu::attention_cached(
            qi,
            &cells,
            shape,
            scores.scale,
            family_ops::ggml_cpu::Ubatch::of(i, n_q),
            oi,
        )
        .map_err(OpError::reference(OP))?;
    }
    Ok(out)
}

/// `values` as a [`KvCache`](crate::KvCache) of element type `dtype` holds
/// them, read back as f32: F16 rounds each to nearest even f16 (llama.cpp's
/// F16 KV cache; `half::f16::from_f32`, PTX `cvt.rn.f16.f32`), F32 keeps
/// them. Attention over a cache is `family_ops::attention_scored` over
/// these.
pub fn kv_stored(dtype: crate::DType, values: &[f32]) -> Vec<f32> {
    match dtype {
        crate::DType::F16 => values
            .iter()
            .map(|&v| half::f16::from_f32(v).to_f32())
            .collect(),
        crate::DType::F32 | crate::DType::I32 => values.to_vec(),
    }
}

/// [`Ops::route`](crate::Ops::route)'s reference: the probabilities as
/// ggml's `f32` ops form them (`soft_max` or the unary `sigmoid`), then
/// `family_ops::route_probs` of each row of `n_expert` with llama.cpp's
/// tie order
/// (`TieOrder::Libstdcxx`, the experts its CPU `top_k` picks where scores
/// tie across the `k`-th place): the ids and the weights, `k` a row.
///
/// # Errors
///
/// family-ops refuses the routing or a NaN.
pub fn route(
    logits: &[f32],
    n_expert: usize,
    routing: &family_ops::Routing<'_>,
) -> Result<(Vec<i32>, Vec<f32>), OpError> {
    route_with(logits, n_expert, routing, family_ops::TieOrder::Libstdcxx)
}

/// [`route`] with the picks at a tie as `ties` says (`LowerIndex` is the
/// families' host rule, and the device op's before it took llama.cpp's).
///
/// # Errors
///
/// As [`route`].
pub fn route_with(
    logits: &[f32],
    n_expert: usize,
    routing: &family_ops::Routing<'_>,
    ties: family_ops::TieOrder,
) -> Result<(Vec<i32>, Vec<f32>), OpError> {
    const OP: &str = "route";
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    if n_expert == 0 {
        return Ok((ids, weights));
    }
    for row in logits.chunks_exact(n_expert) {
        if row.iter().any(|v| v.is_nan()) {
            return Err(OpError::Invalid {
                op: OP,
                why: "NaN in the logits".into(),
            });
        }
        // The probabilities as ggml's f32 ops form them.
        let p: Vec<f32> = match routing.gating {
            family_ops::Gating::Softmax => {
                let mut p = row.to_vec();
                family_ops::ggml_cpu::soft_max(&mut p, 1.0, None)
                    .map_err(OpError::reference(OP))?;
                p
            }
            family_ops::Gating::Sigmoid => row
                .iter()
                .map(|&v| family_ops::ggml_cpu::sigmoid(v))
                .collect(),
        };
        for c in family_ops::route_probs(p, routing, ties).map_err(OpError::reference(OP))? {
            ids.push(i32::try_from(c.expert).map_err(|_| OpError::Invalid {
                op: OP,
                why: format!("expert {} is past i32", c.expert),
            })?);
            weights.push(c.weight);
        }
    }
    Ok((ids, weights))
}

/// `family_ops::argmax` of each of `rows` rows of `cols` values (0 for a
/// row of none).
pub fn argmax(x: &[f32], rows: usize, cols: usize) -> Vec<i32> {
    if cols == 0 {
        return vec![0; rows];
    }
    x.chunks_exact(cols)
        .map(|r| i32::try_from(family_ops::argmax(r)).unwrap_or(i32::MAX))
        .collect()
}

/// ggml's `ssm_conv` then its SiLU over the row
/// (`family_ops::ggml_cpu::ssm_conv`, `silu_row`) for each row of `x`
/// (`channels` wide), carrying `state` (`[d_conv − 1, channels]`: the last
/// inputs, oldest row first), the kernel `w` `[channels, d_conv]`.
///
/// # Errors
///
/// family-ops refuses the lengths.
pub fn ssm_conv(
    state: &mut [f32],
    x: &[f32],
    channels: usize,
    w: &[f32],
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "ssm_conv";
    let mut out = vec![0f32; x.len()];
    if channels == 0 {
        return Ok(out);
    }
    let hist = state.len() / channels;
    // ggml_cpu::ssm_conv keeps each channel's history contiguous.
    let mut st: Vec<f32> = (0..channels)
        .flat_map(|c| (0..hist).map(move |t| (c, t)))
        .map(|(c, t)| state[t * channels + c])
        .collect();
    for (xr, outr) in x.chunks_exact(channels).zip(out.chunks_exact_mut(channels)) {
        family_ops::ggml_cpu::ssm_conv(&mut st, xr, w, outr).map_err(OpError::reference(OP))?;
        family_ops::ggml_cpu::silu_row(outr);
    }
    for c in 0..channels {
        for t in 0..hist {
            state[t * channels + c] = st[c * hist + t];
        }
    }
    Ok(out)
}

/// ggml's fused `gated_delta_net` (`family_ops::ggml_cpu::gated_delta_net`,
/// or with a gate a key channel `gated_delta_net_kda`) for each token and
/// V head, the state `[hv, S, S]` (`M[i·S + c]`: key `i`, value `c`) in
/// `f32` throughout; V head `j` reads q/k head `j mod hk`.
///
/// # Errors
///
/// family-ops refuses the lengths.
pub fn delta_net(
    state: &mut [f32],
    qkv: [&[f32]; 3],
    g: &[f32],
    beta: &[f32],
    dims: &crate::DeltaNetDims,
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "delta_net";
    let [q, k, v] = qkv;
    let crate::DeltaNetDims {
        n,
        s,
        n_k_heads: hk,
        n_v_heads: hv,
        gate,
    } = *dims;
    let per_key = gate == crate::DeltaGate::PerKey;
    let g_cols = if per_key { hv * s } else { hv };
    let lens = [
        (state.len(), hv * s * s),
        (q.len(), n * hk * s),
        (k.len(), n * hk * s),
        (v.len(), n * hv * s),
        (g.len(), n * g_cols),
        (beta.len(), n * hv),
    ];
    if hk == 0 || !hv.is_multiple_of(hk) || lens.iter().any(|&(got, want)| got != want) {
        return Err(OpError::Invalid {
            op: OP,
            why: format!("lengths (got, want) {lens:?} for {dims:?}"),
        });
    }
    // ggml's layout is the transpose: row c (value) holds the keys.
    let transpose =
        |m: &[f32]| -> Vec<f32> { (0..s * s).map(|x| m[(x % s) * s + x / s]).collect() };
    let mut heads: Vec<Vec<f32>> = state.chunks_exact(s * s).map(transpose).collect();
    let mut out = vec![0f32; n * hv * s];
    for t in 0..n {
        for (j, m) in heads.iter_mut().enumerate() {
            let qk = (t * hk + j % hk) * s;
            let vj = (t * hv + j) * s;
            let (q, k, v) = (&q[qk..qk + s], &k[qk..qk + s], &v[vj..vj + s]);
            let b = beta[t * hv + j];
            let o = &mut out[vj..vj + s];
            if per_key {
                family_ops::ggml_cpu::gated_delta_net_kda(m, q, k, v, &g[vj..vj + s], b, o)
            } else {
                family_ops::ggml_cpu::gated_delta_net(m, q, k, v, g[t * hv + j], b, o)
            }
            .map_err(OpError::reference(OP))?;
        }
    }
    for (dst, m) in state.chunks_exact_mut(s * s).zip(&heads) {
        dst.copy_from_slice(&transpose(m));
    }
    Ok(out)
}

/// Gated DeltaNet's L2 norm of each row of `cols` values, as llama.cpp's
/// `build_gdn_l2_norm` computes it (`family_ops::ggml_cpu::l2_norm`: an
/// RMSNorm with `eps / cols`, then a scale by `1 / sqrtf(cols)`).
pub fn l2_norm(x: &[f32], cols: usize, eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    if cols > 0 {
        for r in out.chunks_exact_mut(cols) {
            // A row of `cols` has no weight to mismatch.
            let _ = family_ops::ggml_cpu::l2_norm(r, eps);
        }
    }
    out
}

/// Columns `start..start + len` of each row of `cols` values (within the
/// rows: the caller's check).
pub fn slice_cols(x: &[f32], cols: usize, start: usize, len: usize) -> Vec<f32> {
    if cols == 0 {
        return Vec::new();
    }
    x.chunks_exact(cols)
        .flat_map(|r| r[start..start + len].iter().copied())
        .collect()
}

/// Gated DeltaNet's gates (`Ops::delta_gates`): `g = softplus(alpha +
/// dt_bias) · a` and `sigmoid(beta)`, `dt_bias` and `a` repeated over the
/// rows of their width, in `f32` as ggml's unary ops compute them.
pub fn delta_gates(
    alpha: &[f32],
    beta: &[f32],
    dt_bias: &[f32],
    a: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let hv = dt_bias.len().max(1);
    let g = alpha
        .iter()
        .enumerate()
        .map(|(i, &x)| family_ops::ggml_cpu::softplus(x + dt_bias[i % hv]) * a[i % hv])
        .collect();
    (
        g,
        beta.iter()
            .map(|&b| family_ops::ggml_cpu::sigmoid(b))
            .collect(),
    )
}

/// `r[c][j] + f(s[c]) · y[j]` over the `s.len()` rows of `y.len()` of
/// `r`, `f` as `factor` says: the product in `f64`, rounded once (exact
/// for two f32), then the f32 sum.
pub fn add_outer(r: &[f32], s: &[f32], y: &[f32], factor: crate::OuterFactor) -> Vec<f32> {
    let n = y.len();
    let f: Vec<f32> = s.iter().map(|&v| factor.of(v)).collect();
    r.iter()
        .enumerate()
        .map(|(i, &v)| v + (f64::from(f[i / n]) * f64::from(y[i % n])) as f32)
        .collect()
}

/// `w · Σ_c x[c][j] · sigmoid(g[c][j])` over the `m` rows of `n` of `x`,
/// `w = 1/m` in f32: the hyper-connections' fused `hc_pre` as ggml computes
/// it (`family_ops::ggml_cpu::hc_pre_gated`).
///
/// # Errors
///
/// The lengths do not fit.
pub fn gated_mean_rows(x: &[f32], g: &[f32], m: usize, n: usize) -> Result<Vec<f32>, OpError> {
    let mut out = vec![0f32; n];
    family_ops::ggml_cpu::hc_pre_gated(x, g, m, 1.0 / m as f32, &mut out)
        .map_err(OpError::reference("gated_mean_rows"))?;
    Ok(out)
}

/// Rows `ids` of `table` (`rows` rows of `cols`), in order.
///
/// # Errors
///
/// An id outside `0..rows`.
pub fn gather_rows(
    table: &[f32],
    rows: usize,
    cols: usize,
    ids: &[i32],
) -> Result<Vec<f32>, OpError> {
    let mut out = Vec::with_capacity(ids.len().saturating_mul(cols));
    for &id in ids {
        let row = usize::try_from(id)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| OpError::Invalid {
                op: "gather_rows",
                why: format!("id {id} is outside a table of {rows} rows"),
            })?;
        out.extend_from_slice(&table[row * cols..(row + 1) * cols]);
    }
    Ok(out)
}

/// `id` as a row of `weight`'s `rows`, or the error that names them.
fn row_in(op: &'static str, weight: &str, id: i32, rows: usize) -> Result<usize, OpError> {
    usize::try_from(id)
        .ok()
        .filter(|&r| r < rows)
        .ok_or_else(|| OpError::RowOutOfRange {
            op,
            weight: weight.to_owned(),
            row: i64::from(id),
            rows: rows as u64,
        })
}

/// ggml's `mul_mat_id`: for each token `i` and pick `t`, the product of
/// expert `ids[i · k + t]` of a stack (`n_expert` experts of `rows` rows of
/// `row_bytes`) by `x`'s row `i` (or `i · k + t` when `per_pick`), summed
/// as ggml sums an expert's rows: one token's `vec_dot`, or the tiled
/// K-quant kernel where 8 or more of the `n` tokens picked that expert
/// (`Ubatch::expert`).
///
/// # Errors
///
/// An id outside the stack (named with `weight`), or as [`matmul`].
#[allow(clippy::too_many_arguments)] // a stack's geometry, as `matmul` takes it, and the picks
pub fn matmul_id(
    ty: GgmlType,
    stack: &[u8],
    ne0: usize,
    row_bytes: usize,
    dims: &crate::ExpertDims,
    x: &[f32],
    ids: &[i32],
    weight: &str,
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "matmul_id";
    let crate::ExpertDims {
        n,
        k,
        rows,
        n_expert,
        per_pick,
    } = *dims;
    let expert_bytes = rows * row_bytes;
    if ids.len() != n * k
        || stack.len() < n_expert * expert_bytes
        || x.len() < (if per_pick { n * k } else { n }) * ne0
    {
        return Err(OpError::Invalid {
            op: OP,
            why: format!("lengths do not fit {dims:?}"),
        });
    }
    let experts = ids
        .iter()
        .map(|&id| row_in(OP, weight, id, n_expert))
        .collect::<Result<Vec<usize>, OpError>>()?;
    // How many of the tokens picked each expert (a token picks one at most once).
    let mut picked_by = std::collections::HashMap::<usize, usize>::new();
    for &e in &experts {
        *picked_by.entry(e).or_default() += 1;
    }
    let mut y = Vec::with_capacity(n * k * rows);
    for (p, &e) in experts.iter().enumerate() {
        let xr = if per_pick { p } else { p / k.max(1) };
        let ubatch = family_ops::ggml_cpu::Ubatch::expert(picked_by[&e]);
        y.extend(products(
            ty,
            &stack[e * expert_bytes..(e + 1) * expert_bytes],
            ne0,
            rows,
            &x[xr * ne0..(xr + 1) * ne0],
            |_| ubatch,
        )?);
    }
    Ok(y)
}

/// ggml's IMROPE (`family_ops::ggml_cpu::rope_multi`, interleaved
/// sections, `f32` angles) of each row of `cols` values at its positions
/// (`t, h, w, e`, four a row).
///
/// # Errors
///
/// family-ops refuses the shape.
pub fn imrope(
    x: &[f32],
    cols: usize,
    positions: &[i32],
    head_dim: usize,
    rope: &crate::MultiRope,
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "imrope";
    let mut out = x.to_vec();
    if cols == 0 {
        return Ok(out);
    }
    for (row, p) in out.chunks_exact_mut(cols).zip(positions.chunks_exact(4)) {
        family_ops::ggml_cpu::rope_multi(
            row,
            head_dim,
            rope.n_rot,
            [p[0], p[1], p[2], p[3]],
            rope.freq_base,
            rope.sections,
            family_ops::ggml_cpu::MultiRope::Interleaved,
        )
        .map_err(OpError::reference(OP))?;
    }
    Ok(out)
}

/// `build_moe_ffn`'s aggregate of each of `n` tokens
/// (`family_ops::ggml_cpu::moe::mix`: each output times its weight, the
/// rounded products added in order): `y` `[n, k, cols]`, `w` `[n, k]` (no
/// pick: zeros).
///
/// # Errors
///
/// The lengths do not fit.
pub fn mix_experts(
    y: &[f32],
    w: &[f32],
    n: usize,
    k: usize,
    cols: usize,
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "mix_experts";
    if y.len() != n * k * cols || w.len() != n * k {
        return Err(OpError::Invalid {
            op: OP,
            why: format!("{} and {} values for [{n}, {k}, {cols}]", y.len(), w.len()),
        });
    }
    let mut out = vec![0f32; n * cols];
    if k == 0 || cols == 0 {
        return Ok(out);
    }
    for ((yr, wr), o) in y
        .chunks_exact(k * cols)
        .zip(w.chunks_exact(k))
        .zip(out.chunks_exact_mut(cols))
    {
        let rows: Vec<Vec<f32>> = yr.chunks_exact(cols).map(<[f32]>::to_vec).collect();
        family_ops::ggml_cpu::moe::mix(&rows, wr, o);
    }
    Ok(out)
}

// glm_moe_dsa's ops

/// ggml's `rope_ext` in `f32` (`family_ops::ggml_cpu::rope_ext`) of each
/// row of `cols` values at its position.
///
/// # Errors
///
/// family-ops refuses the shape or the parameters.
pub fn rope_ggml(
    x: &[f32],
    cols: usize,
    positions: &[i32],
    head_dim: usize,
    rope: &crate::GgmlRope,
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "rope_ggml";
    let mut out = x.to_vec();
    if cols == 0 {
        return Ok(out);
    }
    for (row, &p) in out.chunks_exact_mut(cols).zip(positions) {
        family_ops::ggml_cpu::rope_ext(row, head_dim, p, rope).map_err(OpError::reference(OP))?;
    }
    Ok(out)
}

/// Each row of `a` (`ca` values) followed by the same row of `b` (`cb`).
pub fn concat_cols(a: &[f32], ca: usize, b: &[f32], cb: usize) -> Vec<f32> {
    if ca == 0 {
        return b.to_vec();
    }
    if cb == 0 {
        return a.to_vec();
    }
    a.chunks_exact(ca)
        .zip(b.chunks_exact(cb))
        .flat_map(|(x, y)| x.iter().chain(y).copied())
        .collect()
}

/// ggml's `norm` (`family_ops::ggml_cpu::norm`) of each row of `cols`.
pub fn layer_norm(x: &[f32], cols: usize, eps: f32) -> Vec<f32> {
    let mut out = x.to_vec();
    if cols > 0 {
        out.chunks_exact_mut(cols)
            .for_each(|row| family_ops::ggml_cpu::norm(row, eps));
    }
    out
}

/// `family_ops::ggml_cpu::fwht` of each run of `n` values.
///
/// # Errors
///
/// family-ops refuses `n`.
pub fn hadamard(x: &[f32], n: usize) -> Result<Vec<f32>, OpError> {
    let mut out = x.to_vec();
    family_ops::ggml_cpu::fwht(&mut out, n).map_err(OpError::reference("hadamard"))?;
    Ok(out)
}

/// `family_ops::ggml_cpu::lightning_score` of each key (`d` values, as
/// stored, widened) for the query `q` and head weights `w`.
pub fn lightning_scores(q: &[f32], keys: &[f32], d: usize, w: &[f32]) -> Vec<f32> {
    keys.chunks_exact(d)
        .map(|k| family_ops::ggml_cpu::lightning_score(q, k, w, 0.0))
        .collect()
}

// muse_glimmer's ops

/// `x · Wᵀ` as a float64 reference computes it (`Ops::matmul_f64`): each
/// row of `x` rounded as ggml rounds the activations of `ty`
/// (`family_ops::as_ggml_multiplies`), each dot `family_ops::matvec`'s
/// (the products summed in `f64`, rounded once).
///
/// # Errors
///
/// As [`matmul`].
pub fn matmul_f64(
    ty: GgmlType,
    weight: &[u8],
    ne0: usize,
    rows: usize,
    x: &[f32],
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "matmul_f64";
    let mut y = vec![0f32; x.len().checked_div(ne0).unwrap_or(0) * rows];
    if ne0 == 0 || rows == 0 {
        return Ok(y);
    }
    for (xi, yi) in x.chunks_exact(ne0).zip(y.chunks_exact_mut(rows)) {
        f64_products(OP, ty, weight, ne0, rows, xi, yi)?;
    }
    Ok(y)
}

/// `family_ops::projector::layer_norm` of each row of `cols` values.
pub fn layer_norm_f64(
    x: &[f32],
    cols: usize,
    eps: f32,
    w: Option<&[f32]>,
    b: Option<&[f32]>,
) -> Vec<f32> {
    let mut out = x.to_vec();
    if cols > 0 {
        for row in out.chunks_exact_mut(cols) {
            family_ops::projector::layer_norm(row, eps, w, b);
        }
    }
    out
}

/// The last two dims of `x` (`[batch, rows, cols]` flattened) swapped:
/// `[batch, cols, rows]`.
pub fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    if rows == 0 || cols == 0 {
        return out;
    }
    for (src, dst) in x
        .chunks_exact(rows * cols)
        .zip(out.chunks_exact_mut(rows * cols))
    {
        for r in 0..rows {
            for c in 0..cols {
                dst[c * rows + r] = src[r * cols + c];
            }
        }
    }
    out
}

/// Each value rounded to the nearest even IEEE half and widened back
/// (`half::f16`, PTX `cvt.rn.f16.f32`).
pub fn round_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
}

// glm5_next's ops

/// KDA's log decay of each channel ([`crate::Ops::kda_gate`]): `g1 =
/// alpha + dt_bias`, then `softplus(g1) · a` or `sigmoid(-(g1 · a)) ·
/// lower_bound`, `a` one a head of `per_head` channels, each step an
/// `f32` op.
pub fn kda_gate(
    alpha: &[f32],
    dt_bias: &[f32],
    a: &[f32],
    per_head: usize,
    lower_bound: Option<f32>,
) -> Vec<f32> {
    let c = dt_bias.len().max(1);
    let per_head = per_head.max(1);
    alpha
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let ch = i % c;
            let g1 = x + dt_bias[ch];
            let a = a[ch / per_head];
            match lower_bound {
                Some(lb) => family_ops::ggml_cpu::sigmoid(-(g1 * a)) * lb,
                None => family_ops::ggml_cpu::softplus(g1) * a,
            }
        })
        .collect()
}

/// mHC's `(pre, post, comb)` of one token.
pub type HcWeights = (Vec<f32>, Vec<f32>, Vec<f32>);

/// mHC's weights of one token ([`crate::Ops::hc_weights`]).
///
/// # Errors
///
/// family-ops refuses the lengths.
pub fn hc_weights(
    mix: &[f32],
    scale: &[f32],
    base: &[f32],
    sinkhorn: &crate::HcSinkhorn,
) -> Result<HcWeights, OpError> {
    const OP: &str = "hc_weights";
    let crate::HcSinkhorn { hc, eps, iters } = *sinkhorn;
    let n = 2 * hc + hc * hc;
    if mix.len() != n || base.len() != n || scale.len() != 3 {
        return Err(OpError::Invalid {
            op: OP,
            why: format!(
                "mix {}, base {}, scale {} values for {hc} streams",
                mix.len(),
                base.len(),
                scale.len()
            ),
        });
    }
    let sig = family_ops::ggml_cpu::sigmoid;
    let pre = (0..hc)
        .map(|c| sig(mix[c] * scale[0] + base[c]) * 1.0 + eps)
        .collect();
    let post = (0..hc)
        .map(|c| sig(mix[hc + c] * scale[1] + base[hc + c]) * 2.0)
        .collect();
    let comb =
        family_ops::ggml_cpu::hc_comb(&mix[2 * hc..], scale[2], &base[2 * hc..], hc, eps, iters)
            .map_err(OpError::reference(OP))?;
    Ok((pre, post, comb))
}

/// `scale · Σ_c x[c] · w[c]` over the `w.len()` rows of `x`
/// (`family_ops::ggml_cpu::hc_pre_weighted`).
///
/// # Errors
///
/// family-ops refuses the lengths.
pub fn hc_pre_weighted(x: &[f32], w: &[f32], scale: f32) -> Result<Vec<f32>, OpError> {
    let mut out = vec![0f32; x.len() / w.len().max(1)];
    family_ops::ggml_cpu::hc_pre_weighted(x, w, scale, &mut out)
        .map_err(OpError::reference("hc_pre_weighted"))?;
    Ok(out)
}

/// mHC's streams after a layer (`family_ops::ggml_cpu::hc_post_mixed`).
///
/// # Errors
///
/// family-ops refuses the lengths.
pub fn hc_post_mixed(
    y: &[f32],
    residual: &[f32],
    post: &[f32],
    comb: &[f32],
) -> Result<Vec<f32>, OpError> {
    family_ops::ggml_cpu::hc_post_mixed(y, residual, post, comb)
        .map_err(OpError::reference("hc_post_mixed"))
}

/// The k-pool indexer's pooled key of the `kp` rows of `keys` and `gates`
/// (`d` values each, as stored, widened): for each dim, the softmax of
/// `gate + ape` over the members (`family_ops::ggml_cpu::soft_max`) weighs
/// the keys, summed (`family_ops::ggml_cpu::sum`).
///
/// # Errors
///
/// The lengths do not fit `kp` rows of `d`.
pub fn pool_keys(keys: &[f32], gates: &[f32], ape: &[f32], d: usize) -> Result<Vec<f32>, OpError> {
    const OP: &str = "pool_keys";
    let kp = ape.len() / d.max(1);
    if d == 0 || keys.len() != kp * d || gates.len() != kp * d || ape.len() != kp * d {
        return Err(OpError::Invalid {
            op: OP,
            why: format!(
                "keys {}, gates {}, ape {} values for rows of {d}",
                keys.len(),
                gates.len(),
                ape.len()
            ),
        });
    }
    let mut pool = vec![0f32; d];
    let mut logits = vec![0f32; kp];
    let mut terms = vec![0f32; kp];
    for (dim, out) in pool.iter_mut().enumerate() {
        for (m, l) in logits.iter_mut().enumerate() {
            *l = gates[m * d + dim] + ape[m * d + dim];
        }
        family_ops::ggml_cpu::soft_max(&mut logits, 1.0, None).map_err(OpError::reference(OP))?;
        for (m, t) in terms.iter_mut().enumerate() {
            *t = logits[m] * keys[m * d + dim];
        }
        *out = family_ops::ggml_cpu::sum(&terms);
    }
    Ok(pool)
}

/// llama.cpp's gathered k-pool attention ([`crate::Ops::attention_slots`])
/// of the heads of `q` (rows of `d`) over `slots` of the rows of `kv`
/// (`d` values each, as stored, widened; keys and values alike): scores by
/// `dot_f32`, `soft_max` with `scale` and the dead slots' `-inf`, each
/// channel the `dot_f32` of the slots' values with the weights.
///
/// # Errors
///
/// A slot past `kv`'s rows (below -1 or at least `rows`).
pub fn attention_slots(
    q: &[f32],
    kv: &[f32],
    d: usize,
    slots: &[i32],
    scale: f32,
) -> Result<Vec<f32>, OpError> {
    const OP: &str = "attention_slots";
    use family_ops::ggml_cpu::{dot_f32, soft_max};
    let rows = kv.len() / d.max(1);
    let cells: Vec<Option<usize>> = slots
        .iter()
        .map(|&s| match s {
            -1 => Ok(None),
            s => usize::try_from(s)
                .ok()
                .filter(|&j| j < rows)
                .map(Some)
                .ok_or_else(|| OpError::Invalid {
                    op: OP,
                    why: format!("slot {s} of a cache of {rows} rows"),
                }),
        })
        .collect::<Result<_, _>>()?;
    let mask: Vec<f32> = cells
        .iter()
        .map(|c| if c.is_some() { 0.0 } else { f32::NEG_INFINITY })
        .collect();
    let cell = |j: usize| &kv[j * d..(j + 1) * d];
    let mut out = vec![0f32; q.len()];
    let mut col = vec![0f32; cells.len()];
    for (qh, oh) in q.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mut s: Vec<f32> = cells
            .iter()
            .map(|c| c.map_or(0.0, |j| dot_f32(cell(j), qh)))
            .collect();
        soft_max(&mut s, scale, Some(&mask)).map_err(OpError::reference(OP))?;
        for (i, o) in oh.iter_mut().enumerate() {
            for (v, c) in col.iter_mut().zip(&cells) {
                *v = c.map_or(0.0, |j| kv[j * d + i]);
            }
            *o = dot_f32(&col, &s);
        }
    }
    Ok(out)
}

/// `family_ops::ggml_cpu::swiglu_clamp` of `gate` and `up`.
///
/// # Errors
///
/// family-ops refuses the lengths.
pub fn swiglu_clamp(gate: &[f32], up: &[f32], limit: f32) -> Result<Vec<f32>, OpError> {
    let mut out = vec![0f32; gate.len()];
    family_ops::ggml_cpu::swiglu_clamp(gate, up, limit, &mut out)
        .map_err(OpError::reference("swiglu_clamp"))?;
    Ok(out)
}
