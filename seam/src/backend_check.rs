//! Copies a backend crate may issue for its own tests and benchmarks: of
//! the seam's bytes (a fixed pattern, a pinned buffer the seam fills),
//! never of a weight's.
//!
//! A [`StagingCopy`] has no public constructor, so outside the seam no code
//! can ask a backend to copy, and a weight's bytes reach a device only
//! through [`resident_weight`](crate::resident_weight). A backend still
//! needs to show that its copies land where and when they should; these
//! functions issue such copies from bytes no weight owns.

use std::time::{Duration, Instant};

use crate::backend::{Backend, DeviceBuffer, DeviceError, Queue, StagingCopy};

/// Bytes of [`PATTERN`].
pub const PATTERN_LEN: usize = 4096;

/// The test pattern: byte `i` is `(i * 167 + 13) mod 256`, so every
/// offset within 256 bytes holds a different value.
pub static PATTERN: [u8; PATTERN_LEN] = pattern();

const fn pattern() -> [u8; PATTERN_LEN] {
    let mut out = [0u8; PATTERN_LEN];
    let mut i = 0;
    while i < PATTERN_LEN {
        out[i] = ((i * 167 + 13) % 256) as u8;
        i += 1;
    }
    out
}

/// Queues a copy of `PATTERN[start..start + len]` to `dst[dst_offset..]`
/// on `queue`; the bytes land at the latest when `backend.synchronize(queue)`
/// returns.
///
/// # Errors
///
/// The range lies outside the pattern (`Misuse`), or the backend refused
/// the copy.
///
/// # Example
///
/// ```
/// use seam::backend_check::{PATTERN, queue_pattern_copy};
/// use seam::platform::Platform;
///
/// let fake = platform_fake::FakePlatform::new(Default::default());
/// let backend = fake.backend();
/// let queue = backend.create_queue()?;
/// let buffer = backend.allocate(8)?;
/// queue_pattern_copy(backend, 10, 3, &*buffer, 2, &*queue)?;
/// backend.synchronize(&*queue)?;
/// let mut back = [0u8; 8];
/// backend.read_back(&*buffer, 0, &mut back)?;
/// assert_eq!(back[2..5], PATTERN[10..13]);
/// # Ok::<(), seam::platform::DeviceError>(())
/// ```
pub fn queue_pattern_copy(
    backend: &dyn Backend,
    start: usize,
    len: usize,
    dst: &dyn DeviceBuffer,
    dst_offset: u64,
    queue: &dyn Queue,
) -> Result<(), DeviceError> {
    let range = crate::backend::buffer_range(start as u64, len, PATTERN_LEN as u64)?;
    // SAFETY: the pattern is a static: it is valid and unchanged for the
    // life of the program.
    let copy = unsafe { StagingCopy::new(&PATTERN[range], dst, dst_offset, queue) };
    backend.copy_to_device_async(copy)
}

/// The bus ceiling: one host buffer of `len` bytes (pinned where the
/// backend has pinned memory) copied to one device buffer `rounds` times,
/// after one warm-up copy. Returns the time of the timed rounds.
///
/// # Errors
///
/// A device operation failed.
pub fn pinned_copy_time(
    backend: &dyn Backend,
    len: usize,
    rounds: u32,
) -> Result<Duration, DeviceError> {
    let queue = backend.create_queue()?;
    let dst = backend.allocate(len as u64)?;
    let mut plain;
    let mut pinned = backend.allocate_pinned(len)?;
    let src: &mut [u8] = match pinned.as_mut() {
        Some(p) => p.as_mut_slice(),
        None => {
            plain = vec![0u8; len];
            &mut plain
        }
    };
    src.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
    let src: &[u8] = src;
    let copy_all = || {
        // SAFETY: `src` is not written again and outlives the synchronize
        // that follows the copies.
        let copy = unsafe { StagingCopy::new(src, &*dst, 0, &*queue) };
        backend.copy_to_device_async(copy)
    };
    // Warm-up: first touch and driver setup are not the bus.
    copy_all()?;
    backend.synchronize(&*queue)?;
    let start = Instant::now();
    for _ in 0..rounds {
        copy_all()?;
    }
    backend.synchronize(&*queue)?;
    Ok(start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::{PATTERN, PATTERN_LEN};

    #[test]
    fn the_pattern_differs_within_every_256_bytes() {
        assert_eq!(PATTERN[0], 13);
        assert_eq!(PATTERN[1], 180);
        for window in PATTERN.windows(256).step_by(97) {
            let mut seen = [false; 256];
            for &b in window {
                assert!(!seen[b as usize], "a repeated byte within 256");
                seen[b as usize] = true;
            }
        }
        assert_eq!(PATTERN.len(), PATTERN_LEN);
    }
}
