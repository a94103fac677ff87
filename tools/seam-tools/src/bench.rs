//! Measurements for the load benchmark (`seam bench`): the ceilings a load
//! is judged against, and the naive path it is compared with.
//!
//! - [`read_file`]: the page-cache (or disk, when caches were dropped) read
//!   ceiling: `pread` of the whole file by N threads in large chunks.
//! - [`pinned_h2d`]: the bus ceiling: one pinned buffer copied to the
//!   device over and over.
//! - [`naive_load`]: what PyTorch-style loaders and llama.cpp's default do:
//!   map the file, then one pageable copy per tensor straight from the
//!   mapping, nothing released. It is a baseline to compare against and
//!   never used to load a model. Its copies go through `resident_weight`
//!   too (only the seam issues copies), on a view of the device that has no
//!   ring and says the device reads host memory, so nothing is released.
//!
//! Each returns bytes moved and seconds; the caller runs each in its own
//! process so residency figures are not mixed.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::{Backend, DeviceError, DeviceId, Platform, ResidencyPolicy, StageCounters};
use seam::residency::{self, Residency};
use seam::session::LoadError;
use seam::weight::{Role, Weight};

/// Bytes moved and the time it took.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Throughput {
    /// Bytes moved.
    pub bytes: u64,
    /// Wall seconds.
    pub seconds: f64,
}

impl Throughput {
    /// GB/s (10^9 bytes per second).
    pub fn gbps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

/// Reads all of `path` with `threads` threads in `chunk` byte reads.
///
/// # Errors
///
/// The file cannot be opened or read.
pub fn read_file(path: &Path, threads: usize, chunk: usize) -> std::io::Result<Throughput> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let next = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|scope| -> std::io::Result<()> {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(|| -> std::io::Result<()> {
                    let mut buf = vec![0u8; chunk];
                    loop {
                        let at = next.fetch_add(chunk as u64, Ordering::Relaxed);
                        if at >= len {
                            return Ok(());
                        }
                        let n = (len - at).min(chunk as u64) as usize;
                        file.read_exact_at(&mut buf[..n], at)?;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| std::io::Error::other("reader panicked"))??;
        }
        Ok(())
    })?;
    Ok(Throughput {
        bytes: len,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Copies one pinned buffer of `len` bytes to the device `rounds` times.
/// Falls back to plain memory where the backend has no pinned memory.
///
/// # Errors
///
/// A device operation failed.
pub fn pinned_h2d(
    platform: &dyn Platform,
    len: usize,
    rounds: u32,
) -> Result<Throughput, DeviceError> {
    let time = seam::backend_check::pinned_copy_time(platform.backend(), len, rounds)?;
    Ok(Throughput {
        bytes: len as u64 * u64::from(rounds),
        seconds: time.as_secs_f64(),
    })
}

/// The naive loader's view of a device: no ring, and "the device reads host
/// memory", so `resident_weight` copies straight from the mapping and
/// releases nothing.
struct Naive<'p>(&'p dyn Platform);

impl Platform for Naive<'_> {
    fn backend(&self) -> &dyn Backend {
        self.0.backend()
    }
    fn device_id(&self) -> DeviceId {
        self.0.device_id()
    }
    fn needs_weight_staging(&self) -> bool {
        true
    }
    fn host_memory_is_device_addressable(&self) -> bool {
        true
    }
    fn residency_policy(&self) -> ResidencyPolicy {
        ResidencyPolicy {
            release_host_weights_after_upload: false,
            drop_page_cache: false,
        }
    }
    fn stage_counters(&self) -> &StageCounters {
        self.0.stage_counters()
    }
}

/// The naive path: map the model, then for each tensor allocate and copy
/// straight from the mapping (pageable), synchronously, releasing nothing.
/// Returns the throughput and this process's residency at the end, with
/// the mapping still held (as such loaders hold it); the device buffers and
/// the mapping are dropped afterwards.
///
/// # Errors
///
/// The file or a device operation failed.
pub fn naive_load(
    path: &Path,
    platform: &dyn Platform,
) -> Result<(Throughput, Residency), LoadError> {
    let model = GgufModel::open(path, MapOptions::default())?;
    let naive = Naive(platform);
    let queue = platform.backend().create_queue()?;
    let start = Instant::now();
    let mut held = Vec::with_capacity(model.tensors().len());
    for t in model.tensors() {
        let weight = Weight::borrowed(
            &t.name,
            t.ggml_type,
            t.dims.clone(),
            Role::new("tensor"),
            model.tensor_borrow(t)?,
        );
        seam::resident_weight(&weight, &naive, &*queue)?;
        held.push(weight);
    }
    let throughput = Throughput {
        bytes: model.total_tensor_bytes(),
        seconds: start.elapsed().as_secs_f64(),
    };
    Ok((throughput, residency::current().unwrap_or_default()))
}
