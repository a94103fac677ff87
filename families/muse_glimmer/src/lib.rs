//! muse-glimmer (GGUF arch `muse-glimmer`): the dense family with
//! sliding-window attention (a full, un-roped layer every few), sandwich
//! norms, an attention output gate and a final logit softcap, and its
//! multimodal projector (general.architecture `clip`,
//! `clip.projector_type = "muse-glimmer"`). Spec:
//! `docs/families/muse_glimmer.md`.
//!
//! - [`hparams`]: the keys, absent ones taking the architecture's own
//!   values (softcap 30, every 4th layer full, post-norm eps 1e-8).
//! - [`model`]: the manifest, checked both ways, census, weights by handle.
//! - [`forward`]: the CPU forward pass, every weight asked of
//!   `seam::resident_weight` on every use.
//! - [`device`]: the forward pass on the device op layer
//!   ([`device::DeviceDecoder`]: the kit's shared attention block, state
//!   on the device, nothing of a weight read back).
//! - [`mmproj`]: the projector's manifest from llama.cpp's clip loader,
//!   `v.patch_embd.weight` checked exactly, staged through the seam.
//! - [`fixture`]: the built-in tiny fixture (mixed ggml types).
//! - [`family`]: the family contract ([`family_kit::Family`]: the
//!   projector as its companion, [`family::MuseGlimmerDecoder`]);
//!   `binary` (feature `cli`): what the binary adds to the kit's driver.
//!
//! **Architecture Invariant:** this crate reaches weights only through
//! `seam::resident_weight`; its library knows no platform.

#[cfg(feature = "cli")]
pub mod binary;
pub mod device;
pub mod family;
pub mod fixture;
pub mod forward;
pub mod hparams;
pub mod mmproj;
pub mod model;

pub use family::MuseGlimmerFamily;
pub use hparams::{ARCH, Hparams};
pub use model::MuseGlimmer;
