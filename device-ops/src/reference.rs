//! The CPU reference of every op, over host slices: `family-ops` as it is,
//! row by row. [`crate::CpuOps`] and the fake device run these on their
//! own buffers; the conformance check compares every device with them.
//!
//! Layouts are row-major, the last dimension contiguous: a matrix of `n`
//! rows of `cols` values is `n · cols` values.

use seam::gguf::GgmlType;

use crate::OpError;

/// `y[i][r] = Σ_k W[r][k] · x̃[i][k]` for `n = x.len() / ne0` rows of
/// activations, where `x̃` is each row rounded as ggml's CPU rounds it for
/// `ty` (`family_ops::as_ggml_multiplies`) and each dot is
/// `family_ops::matvec`'s (the row dequantized, summed in `f64`, rounded
/// once). `weight` holds `rows` rows of `ne0` elements of `ty`.
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
    let mut y = vec![0f32; n * rows];
    for (xi, yi) in x.chunks_exact(ne0).zip(y.chunks_exact_mut(rows.max(1))) {
        let xq = family_ops::as_ggml_multiplies(ty, xi).map_err(OpError::reference(OP))?;
        family_ops::matvec(ty, weight, ne0, rows, &xq, &mut yi[..rows])
            .map_err(OpError::reference(OP))?;
    }
    Ok(y)
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
        let row = usize::try_from(id)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| OpError::RowOutOfRange {
                op: OP,
                weight: weight.to_owned(),
                row: i64::from(id),
                rows: rows as u64,
            })?;
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

/// `family_ops::rms_norm` of each row of `cols` values.
///
/// # Errors
///
/// The weight is not `cols` long.
pub fn rms_norm(x: &[f32], cols: usize, eps: f32, w: HostNorm<'_>) -> Result<Vec<f32>, OpError> {
    let weight = match w {
        HostNorm::None => family_ops::NormWeight::None,
        HostNorm::Scale(w) => family_ops::NormWeight::Scale(w),
        HostNorm::OnePlus(w) => family_ops::NormWeight::OnePlus(w),
    };
    let mut out = x.to_vec();
    if cols > 0 {
        for row in out.chunks_exact_mut(cols) {
            family_ops::rms_norm_in_place(row, eps, weight)
                .map_err(OpError::reference("rms_norm"))?;
        }
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

/// ggml's SiLU (`family_ops::ggml_cpu::silu`), element-wise.
pub fn silu(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| family_ops::ggml_cpu::silu(v)).collect()
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
