//! What a CUDA device offers, and the seam policy that follows from it.
//!
//! The derivation is a pure function of the probe so it is tested without a
//! GPU; the probe itself reads the driver's attributes.

pub use seam::platform::{DevicePolicy, DeviceProbe};

/// Derives the seam policy from a probe.
pub fn policy_from_probe(probe: &DeviceProbe) -> DevicePolicy {
    DevicePolicy {
        needs_weight_staging: true,
        host_memory_is_device_addressable: probe.pageable_memory_access || probe.integrated,
        device_memory_is_host_addressable: probe.integrated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(pageable: bool, integrated: bool) -> DeviceProbe {
        DeviceProbe {
            ordinal: 0,
            name: "test".into(),
            total_bytes: 1,
            free_bytes: 1,
            pageable_memory_access: pageable,
            integrated,
        }
    }

    #[test]
    fn discrete_gpu_without_pageable_access_releases_host_pages() {
        let p = policy_from_probe(&probe(false, false));
        assert_eq!(
            p,
            DevicePolicy {
                needs_weight_staging: true,
                host_memory_is_device_addressable: false,
                device_memory_is_host_addressable: false,
            }
        );
    }

    #[test]
    fn pageable_access_or_integrated_keeps_host_pages() {
        assert!(policy_from_probe(&probe(true, false)).host_memory_is_device_addressable);
        let integrated = policy_from_probe(&probe(false, true));
        assert!(integrated.host_memory_is_device_addressable);
        assert!(integrated.device_memory_is_host_addressable);
        assert!(!policy_from_probe(&probe(true, false)).device_memory_is_host_addressable);
    }
}
