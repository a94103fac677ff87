//! `resident_weight`: the one function through which a weight's bytes reach
//! a device.
//!
//! It is called on every forward step for every weight, so the memoized path
//! is a flag test and one atomic load. The first call on a staging device
//! makes the device copy inside the memo's once-block: allocate, queue the
//! copy, synchronize, then release the host bytes by the brief's rules.

use crate::error::SeamError;
use crate::platform::{DeviceBuffer, DeviceError, Platform, Queue, StagingCopy};
use crate::release::release_staged_host_bytes;
use crate::ring::{RingError, RingSource};
use crate::weight::{DeviceCopy, HostBytes, HostView, Weight};

/// What a kernel may read for a weight.
#[derive(Debug)]
pub enum Resident<'w> {
    /// The host bytes: the device reads host memory (the CPU).
    Host(HostView<'w>),
    /// The memoized device copy.
    Device(&'w DeviceCopy),
}

impl<'w> Resident<'w> {
    /// The device copy, if the weight lives on a device.
    pub fn device_copy(&self) -> Option<&'w DeviceCopy> {
        match self {
            Resident::Device(c) => Some(c),
            Resident::Host(_) => None,
        }
    }
}

/// Returns what a kernel may read for `weight` on `platform`: the host bytes
/// where the device reads host memory, else the device copy, staged on first
/// use through `queue` and memoized.
///
/// Thread-safe: concurrent first calls stage once and release once.
///
/// # Errors
///
/// The weight is expert-streamed; staging failed (the memo stays empty and
/// nothing is released); the weight lives on another device; or the host
/// pages could not be given back (the device copy is kept).
pub fn resident_weight<'w>(
    weight: &'w Weight,
    platform: &dyn Platform,
    queue: &dyn Queue,
) -> Result<Resident<'w>, SeamError> {
    if weight.flags().expert_streamed {
        return Err(SeamError::ExpertStreamed {
            weight: weight.name().to_owned(),
        });
    }
    if !platform.needs_weight_staging() {
        return weight
            .host_view()
            .map(Resident::Host)
            .ok_or_else(|| SeamError::HostBytesGone {
                weight: weight.name().to_owned(),
            });
    }
    match weight.memo.copy.get() {
        Some(copy) => check_device(weight, copy, platform).map(Resident::Device),
        None => stage_once(weight, platform, queue).map(Resident::Device),
    }
}

fn check_device<'w>(
    weight: &Weight,
    copy: &'w DeviceCopy,
    platform: &dyn Platform,
) -> Result<&'w DeviceCopy, SeamError> {
    if copy.device == platform.device_id() {
        Ok(copy)
    } else {
        Err(SeamError::WrongDevice {
            weight: weight.name().to_owned(),
            staged: copy.device,
            asked: platform.device_id(),
        })
    }
}

/// The once-block: the only code that fills a device memo.
fn stage_once<'w>(
    weight: &'w Weight,
    platform: &dyn Platform,
    queue: &dyn Queue,
) -> Result<&'w DeviceCopy, SeamError> {
    let _staging = weight
        .memo
        .staging
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(copy) = weight.memo.copy.get() {
        return check_device(weight, copy, platform);
    }
    let buffer = copy_to_device(weight, platform, queue)?;
    let copy = weight.memo.copy.get_or_init(|| DeviceCopy {
        buffer,
        device: platform.device_id(),
    });
    if platform.broadcast_source().is_some() {
        platform
            .stage_counters()
            .record_receive(weight.host().len());
    } else {
        platform.stage_counters().record_upload(weight.host().len());
    }
    release_staged_host_bytes(weight, platform).map_err(|source| SeamError::Release {
        weight: weight.name().to_owned(),
        source,
    })?;
    Ok(copy)
}

/// `len` bytes of `file` from `offset`, read as the ring reads a chunk.
fn read_span(
    file: &std::fs::File,
    path: &std::path::Path,
    offset: u64,
    len: usize,
) -> Result<Vec<u8>, RingError> {
    let mut bytes = vec![0u8; len];
    crate::ring::read_exact_at(file, path, offset, &mut bytes)?;
    Ok(bytes)
}

/// Allocates, queues the copy and synchronizes (or receives the bytes from
/// the platform's broadcast source): when this returns, the device holds
/// the bytes and the host bytes may be given back.
fn copy_to_device(
    weight: &Weight,
    platform: &dyn Platform,
    queue: &dyn Queue,
) -> Result<Box<dyn DeviceBuffer>, SeamError> {
    let device_err = |source| SeamError::Device {
        weight: weight.name().to_owned(),
        source,
    };
    let host = weight.host_view().ok_or_else(|| SeamError::HostBytesGone {
        weight: weight.name().to_owned(),
    })?;
    let backend = platform.backend();
    let len = host.len() as u64;
    let buffer = backend.allocate(len).map_err(device_err)?;
    // A replicated weight another device read from the file: its bytes come
    // over the collective, and the broadcast returns once they are here.
    if let Some(source) = platform.broadcast_source() {
        source
            .collective
            .broadcast(&*buffer, source.root)
            .map_err(device_err)?;
        return Ok(buffer);
    }
    let ring = platform.staging_ring();
    if let Some(ring) = ring
        && len >= ring.config().direct_below
    {
        let source = match weight.host() {
            HostBytes::Borrow(b) => match b.file().file() {
                Some(file) => RingSource::File {
                    file,
                    path: b.file().path(),
                    offset: b.offset(),
                    map: b.file(),
                },
                None => RingSource::Bytes(&host),
            },
            HostBytes::Owned(_) => RingSource::Bytes(&host),
        };
        // The ring waits for every copy it queued before returning.
        ring.transfer(backend, source, len, &*buffer)
            .map_err(|e| match e {
                RingError::Device(source) => device_err(source),
                other => device_err(DeviceError::CopyFailed(other.to_string())),
            })?;
        return Ok(buffer);
    }
    // Under a ring, a small borrow of a file is read with `pread` into a
    // bounce buffer, as the ring reads large ones, not copied from the
    // mapping: the copy's page faults would map its pages into the process
    // and, by the kernel's fault-around, its neighbours' too, which its
    // release (the span's page-aligned interior) never gives back, so
    // staging experts one pick at a time grew the mapping without bound.
    let bounce = match (ring, weight.host()) {
        (Some(_), HostBytes::Borrow(b)) => match b.file().file() {
            Some(file) => Some(
                read_span(file, b.file().path(), b.offset(), host.len())
                    .map_err(|e| device_err(DeviceError::CopyFailed(e.to_string())))?,
            ),
            None => None,
        },
        _ => None,
    };
    let source: &[u8] = bounce.as_deref().unwrap_or(&host);
    // SAFETY: `source` (the bounce buffer, a borrow of a live mapping or an
    // Arc of an owned buffer) stays alive and unchanged until the
    // synchronize just below returns; nothing writes to weight bytes.
    let copy = unsafe { StagingCopy::new(source, &*buffer, 0, queue) };
    backend.copy_to_device_async(copy).map_err(device_err)?;
    // The copy is asynchronous: the host bytes may only be released once
    // the device has them.
    backend.synchronize(queue).map_err(device_err)?;
    Ok(buffer)
}
