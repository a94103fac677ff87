//! What an AMD GPU reports, and the seam policy that follows from it.
//!
//! The probe reads HIP's device attributes
//! (`hipDeviceAttributePageableMemoryAccess`, `hipDeviceAttributeIntegrated`),
//! never the device's name; the policy is [`DevicePolicy::from_probe`], one
//! rule for every vendor: pageable access (HMM with XNACK) decides,
//! "integrated" does not. An APU such as gfx1151 (Strix Halo) reports no
//! pageable access, and its kernels read the `hipMalloc` copy the seam
//! staged, not the file's pages: it stages, keeps the prefault off and gives
//! a staged borrow's pages back, like a discrete GPU. The table of real
//! parts, with where each attribute value comes from, is
//! `seam/tests/parts.rs`.

pub use seam::platform::{DevicePolicy, DeviceProbe};
