//! What a CUDA device offers, and the seam policy that follows from it.
//!
//! The derivation is a pure function of the probe so it is tested without a
//! GPU; the probe itself reads the driver's attributes.

/// The facts a CUDA device reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProbe {
    /// The ordinal.
    pub ordinal: i32,
    /// The device name.
    pub name: String,
    /// Total device memory in bytes.
    pub total_bytes: u64,
    /// Free device memory in bytes.
    pub free_bytes: u64,
    /// `CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS`: kernels can read
    /// pageable host memory (HMM, Grace Hopper's coherent link).
    pub pageable_memory_access: bool,
    /// `CU_DEVICE_ATTRIBUTE_INTEGRATED`: the GPU shares the host's memory.
    pub integrated: bool,
}

/// The seam policy of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevicePolicy {
    /// Kernels read device copies (always, on CUDA: they take device
    /// pointers).
    pub needs_weight_staging: bool,
    /// The device can read host memory, so a staged weight's host pages may
    /// still be read and are never released.
    pub host_memory_is_device_addressable: bool,
    /// The host can address the device's memory (an integrated GPU).
    pub device_memory_is_host_addressable: bool,
}

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
