//! dflash (DFlash block-diffusion draft head), GGUF arch `dflash`.
//!
//! - [`Hparams`] and [`Dflash::load`]: the `dflash.*` keys
//!   (`target_layers` stored +1, norms raw) and the tensor table: `fc`,
//!   `enc.output_norm`, `output_norm`, Qwen3-style `blk.N.*`. The file has
//!   NO `token_embd` and NO `output`: both are the target's, borrowed
//!   through [`TargetTables`] as the target's own [`seam::weight::Weight`]s
//!   (shared by reference, never copied, so their device memo is shared:
//!   staged once and released once, whichever model asks first).
//! - [`forward::DraftRunner`]: the draft forward pass, every weight asked
//!   of [`seam::resident_weight`] on every use.
//! - [`device::DeviceDraft`]: the same pass composed from the device op
//!   layer (`device_ops::Ops`), its weights read where they are staged and
//!   its context K/V on the device; [`spec::DeviceTarget`] steps the
//!   target's device decoder with its taps.
//! - [`spec`]: greedy speculative decoding; the tokens equal the target's
//!   own greedy tokens.
//! - [`family`]: the family contract ([`family_kit::Family`]: the target
//!   as its companion, the target's greedy pass as its decoder); `binary`
//!   (feature `cli`): what the binary adds to the kit's driver.
//! - [`fixture`]: a built-in tiny draft, written in code, matching the
//!   qwen4_exp built-in target fixture.
//!
//! **Architecture Invariant:** this crate reaches weights only through
//! `seam::resident_weight`; its library knows no platform.

#[cfg(feature = "cli")]
pub mod binary;
pub mod device;
pub mod family;
pub mod fixture;
pub mod forward;
mod model;
pub mod spec;

pub use family::DflashFamily;
pub use model::{ARCH, Dflash, DraftCensus, Error, Hparams, TargetTables};
