//! glm_moe_dsa (GLM-5.x), GGUF arch `glm-dsa`. The forward pass as
//! llama.cpp computes it is docs/families/glm_moe_dsa.md.
//!
//! - [`Hparams`]: the `glm-dsa.*` keys with llama.cpp's defaults; without
//!   an `attention.indexer.types` key the layer types come from the
//!   context length (the GLM-5.2 default table from 2^20 tokens).
//! - [`GlmMoeDsa::load`]: the manifest, claimed or dropped by name both
//!   ways, census and routes. The MTP block and the shared layers' surplus
//!   indexer tensors are dropped by name; the routed expert stacks take the
//!   expert route (never resident whole, one expert a sub-span borrow
//!   staged when the router picks it).
//! - [`forward`]: the CPU forward pass (MLA with absorbed `k_b`/`v_b`, the
//!   lightning indexer on full layers and its pick reused by shared ones,
//!   sigmoid-routed experts plus the shared expert), every weight asked of
//!   `seam::resident_weight` on every use.
//! - [`fixture`]: the built-in tiny fixture (mixed ggml types).
//! - [`family`]: the family contract ([`family_kit::Family`], its decoder
//!   the forward pass's [`forward::State`]); `binary` (feature `cli`):
//!   what the binary adds to the kit's driver.
//!
//! **Architecture Invariant:** this crate reaches weights only through
//! `seam::resident_weight` (the kit's reader); its library knows no platform.

#[cfg(feature = "cli")]
pub mod binary;
pub mod device;
pub mod family;
pub mod fixture;
pub mod forward;
pub mod hparams;
pub mod model;

pub use family::GlmMoeDsaFamily;
pub use hparams::{ARCH, Hparams};
pub use model::GlmMoeDsa;
