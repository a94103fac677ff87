//! glm5_next (GLM-5.3-Flash), GGUF arch `glm5-next` (also accepted:
//! `glm5next`). The forward pass as llama.cpp computes it is
//! docs/families/glm5_next.md.
//!
//! - [`Hparams`]: the `glm5-next.*` keys with llama.cpp's defaults; layer
//!   kinds from the per-layer `head_count_kv` (0 marks KDA);
//!   `kpool_select_tail` false is refused by name (llama.cpp computes NaN).
//! - [`Glm5Next::load`]: the manifest, claimed or dropped by name both
//!   ways, census and routes. The three routed expert banks of each MoE
//!   layer are expert stacks: never resident whole, each expert a sub-span
//!   borrow staged when the router picks it (the rule: [`model`]).
//! - [`forward`]: the CPU forward pass (mHC with Sinkhorn, KDA, NoPE MLA
//!   with the pooled-key indexer, sigmoid-routed clamped-SwiGLU experts),
//!   every weight asked of `seam::resident_weight` on every use.
//! - [`device`]: the same forward pass on a device's op layer
//!   ([`device::DeviceDecoder`]: the kit's blocks and glm5_next's ops, its
//!   state on the device, no weight read back).
//! - [`fixture`]: the built-in tiny fixture (mixed ggml types).
//! - [`family`]: the family contract ([`family_kit::Family`], its decoder
//!   the forward pass's [`forward::State`] or the device's); `binary` (feature `cli`):
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

pub use family::Glm5NextFamily;
pub use hparams::{ARCH, ARCH_NAMES, Hparams, LayerKind};
pub use model::{Banks, Glm5Next, LoadOptions};
