//! CPU reference operations shared by the model families.
//!
//! Plain, single-threaded, allocation-light Rust meant to be *right* rather
//! than fast: the numbers the families' accelerated paths are checked
//! against, and the ops a family's tiny fixtures run end to end on the host.
//!
//! - [`dequantize`] / [`dequantize_row`]: ggml block formats to `f32`,
//!   bit-exact against gguf-py's `gguf.quants.dequantize` (see
//!   [`dequant`] for the types and `tests/dequant.rs` for the vectors).
//! - [`matvec`](fn@matvec): a quantized weight (GGUF dims `[ne0, rows]`) times an `f32`
//!   vector, one dequantized row at a time.
//! - [`as_ggml_multiplies`]: the activations ggml's CPU matmul multiplies
//!   a weight of a given type by (rounded to F16/BF16 or quantized to
//!   Q8_0/Q8_K first).
//! - [`ggml_cpu`]: ggml's x86 CPU kernels (AVX2, FMA, F16C) bit for bit,
//!   for a pass that must match llama.cpp past f32 noise.
//! - [`rms_norm`], [`rope`](fn@rope), [`softmax`](fn@softmax), [`attention`](fn@attention) (one query over a
//!   K/V cache, with a mask and GQA), [`route`] (top-k expert routing),
//!   [`libstdcxx_top_k`] (ggml's CPU `top_k`, ties in libstdc++'s order).
//! - [`causal_conv_silu`] and [`delta_rule`]: Gated DeltaNet's short
//!   causal convolution and its delta-rule recurrence ([`gdn`]).
//!
//! Reductions (dot products, softmax sums, the weighted sum of values)
//! accumulate in `f64` and round once to `f32`; where an op follows ggml's
//! own rounding instead, its documentation says so.

pub mod activation;
pub mod attention;
pub mod cache;
pub mod dequant;
pub mod gdn;
pub mod ggml_cpu;
pub mod grids;
pub mod matvec;
pub mod norm;
pub mod projector;
pub mod rope;
pub mod routing;
pub mod softmax;
pub mod top_k;

pub use activation::{as_ggml_multiplies, as_ggml_multiplies_f64};
pub use attention::{AttentionShape, Mask, Scores, attention, attention_scored};
pub use cache::CacheType;
pub use dequant::{SUPPORTED, dequantize, dequantize_row, is_supported, row_bytes};
pub use gdn::{causal_conv_silu, delta_rule};
pub use matvec::{matvec, matvec_f64};
pub use norm::{NormWeight, rms_norm, rms_norm_in_place};
pub use rope::{Rope, RopeMode, rope};
pub use routing::{
    ExpertChoice, Gating, Routing, TieOrder, mix_experts, route, route_probs, route_with,
};
pub use softmax::{sigmoid, softmax, softplus};
pub use top_k::{argmax, libstdcxx_top_k};

use seam::gguf::GgmlType;

/// What can go wrong in an op: an unsupported type or a shape that does not
/// fit the buffers. Ops check every length before they write anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// The type has no dequantizer here.
    #[error("dequantization of {0} is not supported")]
    Unsupported(GgmlType),
    /// The bytes are not a whole number of the type's blocks.
    #[error("{ty}: {len} bytes are not a whole number of {type_size}-byte blocks")]
    PartialBlock {
        /// The type.
        ty: GgmlType,
        /// The length given.
        len: usize,
        /// The type's bytes per block.
        type_size: usize,
    },
    /// A row length that is not a whole number of the type's blocks.
    #[error("{ty}: a row of {ne0} elements is not a whole number of {block_size}-element blocks")]
    RowNotWholeBlocks {
        /// The type.
        ty: GgmlType,
        /// The row length in elements.
        ne0: usize,
        /// The type's elements per block.
        block_size: usize,
    },
    /// A buffer of the wrong length.
    #[error("{what}: expected {expected} elements, got {got}")]
    Length {
        /// Which buffer.
        what: &'static str,
        /// The length the other arguments imply.
        expected: usize,
        /// The length given.
        got: usize,
    },
    /// A row index past the end of the matrix.
    #[error("row {row} is out of range ({rows} rows)")]
    RowOutOfRange {
        /// The row asked for.
        row: usize,
        /// The rows the bytes hold.
        rows: usize,
    },
    /// An argument outside its domain (a zero head count, an odd rotation
    /// width, k larger than the expert count, ...).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// Checks that a buffer has the length the other arguments imply.
pub(crate) fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), OpsError> {
    if expected == got {
        Ok(())
    } else {
        Err(OpsError::Length {
            what,
            expected,
            got,
        })
    }
}

/// `a · b` accumulated in `f64` (one rounding at the end is the caller's).
pub(crate) fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum()
}
