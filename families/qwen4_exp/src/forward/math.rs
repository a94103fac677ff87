//! Scalar and vector primitives in `f64`, as `tools/oracle/qwen4exp_ref.py`
//! computes them (numpy float64). Weights arrive as `f32` and widen exactly.

/// `Σ_i w[i] · x[i]` with `f32` weights.
pub(crate) fn dot_w(w: &[f32], x: &[f64]) -> f64 {
    w.iter().zip(x).map(|(&a, &b)| f64::from(a) * b).sum()
}

/// `Σ_i a[i] · b[i]`.
pub(crate) fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x * y).sum()
}

/// `rms(x) · gamma`: `x / sqrt(mean(x²) + eps)`, times `gamma` when given
/// (as many elements as `x`).
pub(crate) fn rms(x: &[f64], eps: f64, gamma: Option<&[f32]>) -> Vec<f64> {
    let mean = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (mean + eps).sqrt();
    match gamma {
        Some(g) => x
            .iter()
            .zip(g)
            .map(|(&v, &w)| v * inv * f64::from(w))
            .collect(),
        None => x.iter().map(|&v| v * inv).collect(),
    }
}

/// `x / sqrt(Σ x² + eps)` (the GDN L2 norm).
pub(crate) fn l2(x: &[f64], eps: f64) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() + eps).sqrt();
    x.iter().map(|&v| v * inv).collect()
}

/// `1 / (1 + exp(−x))`.
pub(crate) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `x · sigmoid(x)`.
pub(crate) fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// ggml's softplus: `x` above 20, else `log(1 + exp(x))`.
pub(crate) fn softplus(x: f64) -> f64 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// numpy's `sign`: −1, 0 or 1.
pub(crate) fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// Max-subtracted softmax in place.
pub(crate) fn softmax(x: &mut [f64]) {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

pub(crate) use family_ops::argmax;
