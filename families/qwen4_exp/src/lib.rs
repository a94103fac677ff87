//! qwen4exp (Qwen3.8-Flash-Next), GGUF arch `qwen4exp`: the load side.
//!
//! - [`Hparams`]: the `qwen4exp.*` metadata with the family's defaults;
//!   which layers are gated DeltaNet and which full attention, the PLE
//!   layer, the hyper-connections. Errors name the key.
//! - [`Manifest`]: every tensor named once with its role, allowed types,
//!   dims and [`Route`]; tensors dropped by name (MTP blocks, unused
//!   attention biases). [`Manifest::check`] checks the file both ways.
//! - [`Census`]: count, bytes and route per role.
//! - [`Qwen4Exp`]: the loaded model. Dense weights go through
//!   [`seam::resident_weight`]; experts are sub-span borrows of their stack,
//!   made once and staged per pick; the PLE table is read by row gathers.
//!   Stacks and the table are `expert_streamed`: never staged whole.
//! - [`fixture`]: the built-in tiny model, written in code.
//! - [`sim`]: decode steps of weight access (no arithmetic), to show the
//!   residency contract.
//! - [`forward`]: the CPU forward pass (docs/families/qwen4_exp.md), over a
//!   [`forward::Weights`] source; [`engine::SeamWeights`] is that source
//!   through `seam::resident_weight`, and [`engine::greedy`] decodes with it.
//!
//! - [`family::Qwen4ExpDecoder`]: the family contract's decoder
//!   ([`family_kit::Family`]); `binary` (feature `cli`): what the binary
//!   adds to the kit's driver.
//!
//! Names and dims follow docs/families/qwen4_exp.md, sections 1 and 2.
//!
//! **Architecture Invariant:** this crate reaches weights only through
//! `seam::resident_weight` and borrows; its library knows no platform (the
//! binary picks one for `--device`).

#[cfg(feature = "cli")]
pub mod binary;
pub mod device;
pub mod engine;
pub mod error;
pub mod family;
pub mod fixture;
pub mod forward;
pub mod hparams;
pub mod manifest;
pub mod model;
pub mod sim;

pub use error::Error;
pub use family::Qwen4ExpFamily;
pub use hparams::{ARCH, Hparams, Indexer, LayerKind, Ple, Ssm};
pub use manifest::{
    Census, Dims, DroppedTensor, ExpertStacks, Layout, Manifest, RoleCensus, Route, RouteCensus,
    TensorSpec, TypeClass,
};
pub use model::{ExpertKind, Qwen4Exp};
pub use sim::{DecodeReport, simulate_decode};
