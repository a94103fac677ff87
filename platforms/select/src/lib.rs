//! Devices by name (`--device host|fake|sink|cuda[:N]|rocm[:N]`), the
//! automatic choice, and what `seam doctor` reports: the one place the
//! binaries (`seam`, the family binaries) pick a platform at run time.
//!
//! **Architecture Invariant:** only binaries depend on this crate; the seam
//! and the family libraries stay platform-free.

use seam::collective::Collective;
use seam::platform::{DeviceError, DevicePolicy, DeviceProbe, Platform};

/// A device named on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    /// The CPU.
    Host,
    /// The simulated staging device.
    Fake,
    /// The verifying sink.
    Sink,
    /// An NVIDIA GPU.
    Cuda(i32),
    /// An AMD GPU.
    Rocm(i32),
}

/// Parses `host`, `fake`, `sink`, `cuda[:N]`, `rocm[:N]`.
pub fn parse(text: &str) -> Result<DeviceSpec, String> {
    let (kind, ordinal) = match text.split_once(':') {
        Some((k, n)) => {
            let n: i32 =
                n.parse().ok().filter(|n| *n >= 0).ok_or_else(|| {
                    format!("--device {text:?}: the ordinal must be a number >= 0")
                })?;
            (k, Some(n))
        }
        None => (text, None),
    };
    match (kind, ordinal) {
        ("host", None) => Ok(DeviceSpec::Host),
        ("fake", None) => Ok(DeviceSpec::Fake),
        ("sink", None) => Ok(DeviceSpec::Sink),
        ("cuda", n) => Ok(DeviceSpec::Cuda(n.unwrap_or(0))),
        ("rocm", n) => Ok(DeviceSpec::Rocm(n.unwrap_or(0))),
        _ => Err(format!(
            "--device {text:?}: unknown device (known: host, fake, sink, cuda[:N], rocm[:N])"
        )),
    }
}

/// The best device present: the first CUDA GPU, else the first ROCm GPU,
/// else the CPU.
pub fn best_present() -> DeviceSpec {
    if matches!(platform_cuda::device_count(), Ok(n) if n > 0) {
        DeviceSpec::Cuda(0)
    } else if matches!(platform_rocm::device_count(), Ok(n) if n > 0) {
        DeviceSpec::Rocm(0)
    } else {
        DeviceSpec::Host
    }
}

/// Whether large copies on this device must go through the staging ring
/// (ROCm: direct pageable copies of large tensors hung the driver).
pub fn requires_staging_ring(spec: DeviceSpec) -> bool {
    matches!(spec, DeviceSpec::Rocm(_)) && platform_rocm::REQUIRES_STAGING_RING
}

/// An opened device; the fake is kept concrete so a report can show its
/// counters.
pub enum Device {
    /// The simulated staging device.
    Fake(platform_fake::FakePlatform),
    /// An NVIDIA GPU (its op layer: [`Device::ops`]).
    Cuda(platform_cuda::CudaPlatform),
    /// Any other platform.
    Other(Box<dyn Platform>),
}

impl Device {
    /// The platform.
    pub fn platform(&self) -> &dyn Platform {
        match self {
            Device::Fake(p) => p,
            Device::Cuda(p) => p,
            Device::Other(p) => &**p,
        }
    }

    /// The fake device, when that is what was opened.
    pub fn fake(&self) -> Option<&platform_fake::FakePlatform> {
        match self {
            Device::Fake(p) => Some(p),
            Device::Cuda(_) | Device::Other(_) => None,
        }
    }

    /// The device's op layer launching on `queue` (a queue of this
    /// device, the session's), where the device has one: the fake device
    /// (the CPU reference on its buffers) and CUDA (NVRTC kernels);
    /// `None` for the host, the sink and ROCm.
    ///
    /// # Errors
    ///
    /// The op layer could not be made (CUDA: libnvrtc absent, the
    /// compilation or the module load failed, a foreign queue); one line.
    pub fn ops<'a>(
        &'a self,
        queue: &'a dyn seam::platform::Queue,
    ) -> Option<Result<Box<dyn device_ops::Ops + 'a>, String>> {
        match self {
            Device::Fake(p) => Some(Ok(Box::new(platform_fake::ops::fake_ops(p)))),
            Device::Cuda(p) => Some(
                platform_cuda::ops::CudaOps::new(p, queue)
                    .map(|o| Box::new(o) as Box<dyn device_ops::Ops + 'a>)
                    .map_err(|e| e.to_string()),
            ),
            Device::Other(_) => None,
        }
    }
}

/// Opens the platform for `spec`. `VT_PINNED_H2D_MIB=0` (read through
/// `env`) is refused on a device that needs the staging ring.
///
/// # Errors
///
/// The device is unavailable, or the knob is refused; the message is one
/// line naming the device.
pub fn open(spec: DeviceSpec, env: &dyn Fn(&str) -> Option<String>) -> Result<Device, String> {
    if requires_staging_ring(spec) && env("VT_PINNED_H2D_MIB").is_some_and(|v| v.trim() == "0") {
        return Err(
            "VT_PINNED_H2D_MIB=0 is refused on ROCm: large copies must go through the staging ring"
                .into(),
        );
    }
    let failed = |e: DeviceError| format!("--device {}: {e}", spec.name());
    Ok(match spec {
        DeviceSpec::Host => Device::Other(Box::new(platform_host::HostPlatform::new())),
        DeviceSpec::Fake => Device::Fake(platform_fake::FakePlatform::new(
            platform_fake::FakeConfig::default(),
        )),
        DeviceSpec::Sink => Device::Other(Box::new(platform_fake::SinkPlatform::new())),
        DeviceSpec::Cuda(n) => Device::Cuda(platform_cuda::CudaPlatform::open(n).map_err(failed)?),
        DeviceSpec::Rocm(n) => Device::Other(Box::new(
            platform_rocm::RocmPlatform::open(n).map_err(failed)?,
        )),
    })
}

impl DeviceSpec {
    /// The name `parse` reads back (`cuda:0`).
    pub fn name(self) -> String {
        match self {
            DeviceSpec::Host => "host".into(),
            DeviceSpec::Fake => "fake".into(),
            DeviceSpec::Sink => "sink".into(),
            DeviceSpec::Cuda(n) => format!("cuda:{n}"),
            DeviceSpec::Rocm(n) => format!("rocm:{n}"),
        }
    }
}

/// Parses a device list (`cuda:0,cuda:1`, `fake,fake`).
///
/// # Errors
///
/// An empty list or a name `parse` refuses.
pub fn parse_list(text: &str) -> Result<Vec<DeviceSpec>, String> {
    let specs = text
        .split(',')
        .map(|name| parse(name.trim()).map_err(|e| format!("--devices {text:?}: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    if specs.is_empty() {
        return Err(format!("--devices {text:?}: no device"));
    }
    Ok(specs)
}

/// Devices for a sharded load, with one collective rank each.
pub enum DeviceGroup {
    /// Fake devices exchanging bytes in memory.
    Fake {
        /// Rank `d` of the exchange (dropped before the devices).
        collectives: Vec<platform_fake::FakeCollective>,
        /// The devices, in rank order.
        platforms: Vec<platform_fake::FakePlatform>,
    },
    /// CUDA GPUs of one NCCL group.
    Cuda {
        /// Rank `d` of the group (dropped before the devices).
        ranks: Vec<platform_cuda::nccl::NcclRank>,
        /// The devices, in rank order.
        platforms: Vec<platform_cuda::CudaPlatform>,
    },
}

impl DeviceGroup {
    /// The devices, in rank order.
    pub fn platforms(&self) -> Vec<&dyn Platform> {
        match self {
            DeviceGroup::Fake { platforms, .. } => {
                platforms.iter().map(|p| p as &dyn Platform).collect()
            }
            DeviceGroup::Cuda { platforms, .. } => {
                platforms.iter().map(|p| p as &dyn Platform).collect()
            }
        }
    }

    /// The collectives, in rank order.
    pub fn collectives(&self) -> Vec<&dyn Collective> {
        match self {
            DeviceGroup::Fake { collectives, .. } => {
                collectives.iter().map(|c| c as &dyn Collective).collect()
            }
            DeviceGroup::Cuda { ranks, .. } => ranks.iter().map(|c| c as &dyn Collective).collect(),
        }
    }
}

/// Opens the devices of `specs` as one group: all fake (any number), or
/// all CUDA GPUs of distinct ordinals joined by NCCL.
///
/// # Errors
///
/// A mixed or repeated list, NCCL or a device unavailable: one line naming
/// the list.
pub fn open_group(specs: &[DeviceSpec]) -> Result<DeviceGroup, String> {
    let list = specs.iter().map(|s| s.name()).collect::<Vec<_>>().join(",");
    let failed = |e: String| format!("--devices {list}: {e}");
    if specs.iter().all(|s| *s == DeviceSpec::Fake) {
        return Ok(DeviceGroup::Fake {
            collectives: platform_fake::FakeCollective::group(specs.len()),
            platforms: specs
                .iter()
                .map(|_| platform_fake::FakePlatform::new(platform_fake::FakeConfig::default()))
                .collect(),
        });
    }
    let ordinals = specs
        .iter()
        .map(|s| match s {
            DeviceSpec::Cuda(n) => Ok(*n),
            _ => Err(failed(
                "a sharded load takes all fake or all cuda devices".into(),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (i, n) in ordinals.iter().enumerate() {
        if ordinals[..i].contains(n) {
            return Err(failed(format!("cuda:{n} is named twice")));
        }
    }
    if let Some(why) = platform_cuda::nccl::unavailable_reason() {
        return Err(failed(why));
    }
    let platforms = ordinals
        .iter()
        .map(|&n| platform_cuda::CudaPlatform::open(n).map_err(|e| failed(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let ranks = platform_cuda::nccl::NcclRank::init_all(&platforms.iter().collect::<Vec<_>>())
        .map_err(|e| failed(e.to_string()))?;
    Ok(DeviceGroup::Cuda { ranks, platforms })
}

pub use platform_cuda::tensor_parallel::{MatmulCheck, MatmulShape};

/// The tensor-parallel matrix product on a CUDA group against the same
/// product on its first GPU (`platform_cuda::tensor_parallel`).
///
/// # Errors
///
/// The group is not CUDA, NVRTC is missing, or a device failed; one line.
pub fn check_matmul(group: &DeviceGroup, shape: MatmulShape) -> Result<MatmulCheck, String> {
    let DeviceGroup::Cuda { ranks, platforms } = group else {
        return Err("the matmul check runs on cuda devices (--devices cuda:0,cuda:1)".into());
    };
    platform_cuda::tensor_parallel::check_matmul(
        &platforms.iter().collect::<Vec<_>>(),
        ranks,
        shape,
    )
    .map_err(|e| e.to_string())
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// One device as `seam doctor` prints it: what it is, the attribute
/// values the policy came from, and the seam's decision.
fn device_line(vendor: &str, index: i32, probe: &DeviceProbe, policy: &DevicePolicy) -> String {
    format!(
        "{vendor}:{index}: {}, {:.1} GiB total, {:.1} GiB free; pageable memory access: {}, integrated: {} (reported, decides nothing) -> {}",
        probe.name,
        gib(probe.total_bytes),
        gib(probe.free_bytes),
        yes_no(probe.pageable_memory_access),
        yes_no(probe.integrated),
        policy.decision()
    )
}

/// What this machine offers, as the lines `seam doctor` prints.
pub fn doctor() -> Vec<String> {
    let mut lines = Vec::new();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let host = seam::host_memory::HostMemory::current();
    lines.push(format!(
        "machine: {cpus} CPUs, {:.1} GiB memory, page size {} bytes",
        host.map_or(0.0, |h| gib(h.total)),
        seam::borrow::page_size()
    ));
    lines.push(match host {
        Some(h) => {
            let (room, bound) = h.room();
            let whose = match bound {
                seam::host_memory::RoomSource::Host => "MemAvailable",
                seam::host_memory::RoomSource::Cgroup => "this process's memory cgroup",
            };
            format!(
                "page cache: {:.1} GiB of room ({whose}); a staging load keeps a model's page cache up to 1/{} of it",
                gib(room),
                seam::policy::PAGE_CACHE_ROOM_DIVISOR
            )
        }
        None => "page cache: host memory unknown (no /proc/meminfo); a staging load drops it".into(),
    });
    let mut gpus = 0;
    if !platform_cuda::library_present() {
        lines.push(format!(
            "cuda: unusable: libcuda not found (searched {})",
            platform_cuda::library_candidates().join(", ")
        ));
    } else {
        match platform_cuda::device_count() {
            Err(e) => lines.push(format!("cuda: unusable: {e}")),
            Ok(0) => lines.push("cuda: libcuda loaded, but no CUDA device is present".into()),
            Ok(n) => {
                for i in 0..n {
                    match platform_cuda::CudaPlatform::open(i) {
                        Err(e) => lines.push(format!("cuda:{i}: unusable: {e}")),
                        Ok(p) => {
                            gpus += 1;
                            lines.push(device_line("cuda", i, p.probe(), &p.device_policy()));
                        }
                    }
                }
            }
        }
    }
    lines.push(match platform_cuda::nccl::unavailable_reason() {
        Some(why) => format!("nccl: {why}"),
        None => "nccl: libnccl loaded (sharded loads over CUDA GPUs: `seam load --devices cuda:0,cuda:1`)".into(),
    });
    if !platform_rocm::library_present() {
        lines.push(format!(
            "rocm: unusable: HIP runtime not found (searched {})",
            platform_rocm::library_candidates().join(", ")
        ));
    } else {
        match platform_rocm::device_count() {
            Err(e) => lines.push(format!("rocm: unusable: {e}")),
            Ok(0) => lines.push("rocm: HIP loaded, but no ROCm device is present".into()),
            Ok(n) => {
                for i in 0..n {
                    match platform_rocm::RocmPlatform::open(i) {
                        Err(e) => lines.push(format!("rocm:{i}: unusable: {e}")),
                        Ok(p) => {
                            gpus += 1;
                            lines.push(device_line("rocm", i, p.probe(), &p.device_policy()));
                        }
                    }
                }
            }
        }
    }
    lines.push(if gpus == 0 {
        "verdict: no GPU present; `seam load` runs on host (kernels read the mapped file), fake or sink"
            .into()
    } else {
        format!("verdict: {gpus} GPU(s) usable; `seam load` picks the first by default")
    });
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_names() {
        assert_eq!(parse("host"), Ok(DeviceSpec::Host));
        assert_eq!(parse("sink"), Ok(DeviceSpec::Sink));
        assert_eq!(parse("cuda"), Ok(DeviceSpec::Cuda(0)));
        assert_eq!(parse("cuda:3"), Ok(DeviceSpec::Cuda(3)));
        assert_eq!(parse("rocm"), Ok(DeviceSpec::Rocm(0)));
        assert_eq!(parse("rocm:1"), Ok(DeviceSpec::Rocm(1)));
        assert!(requires_staging_ring(DeviceSpec::Rocm(0)));
        assert!(!requires_staging_ring(DeviceSpec::Cuda(0)));
        assert!(parse("cuda:-1").is_err());
        assert!(parse("cuda:x").is_err());
        assert!(parse("host:1").is_err());
        assert!(parse("tpu").unwrap_err().contains("unknown device"));
        for spec in [
            DeviceSpec::Host,
            DeviceSpec::Sink,
            DeviceSpec::Cuda(2),
            DeviceSpec::Rocm(1),
        ] {
            assert_eq!(parse(&spec.name()), Ok(spec));
        }
    }

    #[test]
    fn opening_names_the_device_or_the_refused_knob() {
        let no_env = |_: &str| None;
        assert!(open(DeviceSpec::Fake, &no_env).unwrap().fake().is_some());
        assert!(open(DeviceSpec::Sink, &no_env).unwrap().fake().is_none());
        let ring_off = |k: &str| (k == "VT_PINNED_H2D_MIB").then(|| "0".to_owned());
        let err = open(DeviceSpec::Rocm(0), &ring_off).err().unwrap();
        assert!(err.contains("refused on ROCm"), "{err}");
        assert!(open(DeviceSpec::Fake, &ring_off).is_ok());
    }

    /// The doctor's line names the attributes and the decision they lead
    /// to: an APU (integrated, no pageable access) stages and releases; a
    /// part with pageable access reads in place.
    #[test]
    fn doctor_names_the_machine_and_the_page_cache_room() {
        let lines = super::doctor();
        assert!(lines[0].starts_with("machine: "), "{lines:?}");
        assert!(!lines[0].contains(" 0.0 GiB memory"), "{lines:?}");
        assert!(
            lines[1].starts_with("page cache: ")
                && lines[1].contains(" GiB of room (")
                && lines[1].ends_with("up to 1/2 of it"),
            "{lines:?}"
        );
    }

    #[test]
    fn doctor_line_names_attributes_and_decision() {
        let probe = |pageable, integrated| DeviceProbe {
            ordinal: 0,
            name: "gpu".into(),
            total_bytes: 64 << 30,
            free_bytes: 32 << 30,
            pageable_memory_access: pageable,
            integrated,
        };
        let apu = probe(false, true);
        let line = device_line("rocm", 0, &apu, &DevicePolicy::from_probe(&apu));
        assert_eq!(
            line,
            "rocm:0: gpu, 64.0 GiB total, 32.0 GiB free; pageable memory access: no, integrated: yes \
             (reported, decides nothing) -> stages weights, prefault off, gives a staged borrow's host \
             pages back after its copy"
        );
        let coherent = probe(true, false);
        let line = device_line("cuda", 1, &coherent, &DevicePolicy::from_probe(&coherent));
        assert!(line.starts_with("cuda:1: gpu,"), "{line}");
        assert!(
            line.contains("pageable memory access: yes, integrated: no")
                && line.ends_with(
                    "-> kernels read the mapped file: nothing staged, nothing released, prefault on"
                ),
            "{line}"
        );
        let zero_copy = DevicePolicy {
            needs_weight_staging: true,
            host_memory_is_device_addressable: false,
            device_memory_is_host_addressable: true,
        };
        assert_eq!(
            zero_copy.decision(),
            "stages weights, prefault off, keeps host pages (the device may read them)"
        );
        let pageable_but_staging = DevicePolicy {
            host_memory_is_device_addressable: true,
            ..zero_copy
        };
        assert_eq!(
            pageable_but_staging.decision(),
            "stages weights, prefault on, keeps host pages (the device may read them)"
        );
        assert_eq!(
            DevicePolicy::from_probe(&apu).residency_policy(),
            seam::platform::ResidencyPolicy {
                release_host_weights_after_upload: true,
                drop_page_cache: true
            }
        );
        assert_eq!(
            DevicePolicy::from_probe(&coherent).residency_policy(),
            seam::platform::ResidencyPolicy {
                release_host_weights_after_upload: false,
                drop_page_cache: false
            }
        );
    }
}
