//! Blocks of a decoder on the device op layer ([`device_ops::Ops`]),
//! written once for every family that has them. Each takes the weights
//! it reads by [`crate::Handle`] (resolved through the family's
//! [`crate::LoadedWeights`]) and its shape, never a family's name.
//!
//! - [`context`]: [`BlockContext`], what every block computes with: the
//!   ops, the platform and queue weights are staged on, the loaded
//!   weights, small tensors kept dequantized on the device, the
//!   read-backs counted.
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

pub mod context;
pub mod indexer;
pub mod kpool;
pub mod mla;
pub mod moe;

pub use context::BlockContext;
