//! Blocks of a decoder on the device op layer ([`device_ops::Ops`]),
//! written once and used by every family that has them. Each takes the
//! weights it reads and its shape, never a family's name.
//!
//! - [`attention`]: full and sliding-window attention over a device KV
//!   cache (head norms, partial RoPE, a score softcap, an output gate,
//!   sandwich norms), the final logits, and [`attention::DeviceWeights`]:
//!   the op layer, where the seam stages, small tensors kept on the device.
//! - [`context`]: [`BlockContext`], what the blocks below compute with:
//!   the loaded weights by [`crate::Handle`] over those device weights,
//!   the F32 vectors the host reads, the read-backs counted.
//! - [`moe`]: the SwiGLU FFN (dense or a shared expert) and the routed
//!   MoE FFN (softmax or sigmoid routing, the selection bias, norm and
//!   scale, per-expert scales, the shared expert), its experts staged on
//!   first pick or every stack staged whole ([`crate::ExpertStaging`]).
//! - [`mla`]: multi-head latent attention with absorbed `k_b`/`v_b` and
//!   its latent cache (F32 or F16, as [`crate::Numerics`] says).
//! - [`indexer`]: the lightning indexer (its query and key, the scores of
//!   every cached key, the top-k cells), the selection a shared layer
//!   reuses; its cell picking is the host path's own.
//! - [`kpool`]: the k-pool indexer (keys pooled every `kpool` positions,
//!   the best pools' slots and the tail as a slot list), the host path's
//!   slot list too.

pub mod attention;
pub mod context;
pub mod indexer;
pub mod kpool;
pub mod mla;
pub mod moe;

pub use context::BlockContext;
