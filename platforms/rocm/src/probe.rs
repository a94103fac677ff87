//! What an AMD GPU reports, and the seam policy that follows from it.
//!
//! The derivation is a pure function of the probe, so it is tested without
//! a GPU; the probe itself reads HIP's device attributes
//! (`hipDeviceAttributePageableMemoryAccess`, `hipDeviceAttributeIntegrated`),
//! never the device's name.
//!
//! # The rule, and the integrated case
//!
//! - `needs_weight_staging`: always. Kernels take device pointers.
//! - `host_memory_is_device_addressable` = pageable memory access, and
//!   nothing else. An integrated GPU (an APU such as gfx1151, Strix Halo)
//!   reports no pageable access: its kernels read the `hipMalloc` copy the
//!   seam staged, not the file's pages, so it is NOT host-addressable by
//!   this rule (unlike the CUDA platform, which also counts integrated).
//!   This also keeps the prefault default OFF there: staging reads each page
//!   once.
//! - `device_memory_is_host_addressable` = integrated: an APU's device
//!   memory is the host's memory.
//!
//! The seam's release rule keeps a staged borrow's host pages when EITHER
//! flag is true, so an integrated GPU keeps them (through the second flag).

pub use seam::platform::{DevicePolicy, DeviceProbe};

/// Derives the seam policy from a probe (see the module doc for the rule).
pub fn policy_from_probe(probe: &DeviceProbe) -> DevicePolicy {
    DevicePolicy {
        needs_weight_staging: true,
        host_memory_is_device_addressable: probe.pageable_memory_access,
        device_memory_is_host_addressable: probe.integrated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(name: &str, pageable_memory_access: bool, integrated: bool) -> DeviceProbe {
        DeviceProbe {
            ordinal: 0,
            name: name.into(),
            total_bytes: 1 << 30,
            free_bytes: 1 << 29,
            pageable_memory_access,
            integrated,
        }
    }

    #[track_caller]
    fn check(probe: DeviceProbe, host_addressable: bool, device_addressable: bool) {
        assert_eq!(
            policy_from_probe(&probe),
            DevicePolicy {
                needs_weight_staging: true,
                host_memory_is_device_addressable: host_addressable,
                device_memory_is_host_addressable: device_addressable,
            },
            "{probe:?}"
        );
    }

    #[test]
    fn policy_follows_the_attributes() {
        // A discrete GPU without pageable access (the common case): stage,
        // and the host pages of a staged borrow can be given back.
        check(probe("AMD Radeon RX 7900 XTX", false, false), false, false);
        // A discrete GPU with pageable access (HMM, XNACK on): the device
        // may read host pages, so they are kept.
        check(probe("AMD Instinct MI210", true, false), true, false);
        // An APU without pageable access (gfx1151): not host-addressable by
        // the attribute rule; its device memory is the host's.
        check(probe("AMD Radeon 8060S Graphics", false, true), false, true);
        // An APU with pageable access (an MI300A): both.
        check(probe("AMD Instinct MI300A", true, true), true, true);
    }

    #[test]
    fn staging_is_always_needed() {
        for pageable in [false, true] {
            for integrated in [false, true] {
                assert!(policy_from_probe(&probe("x", pageable, integrated)).needs_weight_staging);
            }
        }
    }

    /// The name never decides: an "APU-looking" name on a discrete probe
    /// gets the discrete policy, and the reverse.
    #[test]
    fn the_name_is_never_consulted() {
        check(
            probe(
                "AMD Ryzen AI Max+ 395 w/ Radeon 8060S (gfx1151)",
                false,
                false,
            ),
            false,
            false,
        );
        check(probe("discrete", false, true), false, true);
        assert_eq!(
            policy_from_probe(&probe("a", true, false)),
            policy_from_probe(&probe("b", true, false))
        );
    }
}
