//! What a CUDA device reports, and the seam policy that follows from it.
//!
//! The probe reads the driver's attributes (`PAGEABLE_MEMORY_ACCESS`,
//! `INTEGRATED`); the policy is [`DevicePolicy::from_probe`], one rule for
//! every vendor: pageable access decides, "integrated" does not (a
//! `cuMemAlloc` allocation is a separate copy on Jetson Orin and Thor too).
//! The table of real parts, with where each attribute value comes from, is
//! `seam/tests/parts.rs`.

pub use seam::platform::{DevicePolicy, DeviceProbe};
