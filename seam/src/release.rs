//! The release of a staged weight's host bytes: the brief's rules, in one
//! place.
//!
//! Called only from inside the memo's once-block in
//! [`resident_weight`](crate::resident_weight), after the device copy is made
//! and its queue synchronized, so it runs once per weight and never on the
//! memoized path.

use crate::borrow::BorrowError;
use crate::platform::{HostRelease, Platform};
use crate::weight::{HostBytes, Weight};

/// Whether the device might still read the host pages of a staged weight:
/// either the platform says its device reads host memory (pageable memory
/// access), or the backend says its weight allocation IS host memory read
/// in place (a zero-copy mapping, so the "device copy" is those very
/// pages). An integrated GPU whose backend allocates with `cuMemAlloc` or
/// `hipMalloc` answers neither: its copy is separate, so its borrows are
/// released like a discrete GPU's.
///
/// Asked by the release of staged borrows: such pages are never given back.
pub fn device_may_read_host_pages(platform: &dyn Platform) -> bool {
    platform.host_memory_is_device_addressable()
        || platform.backend().device_memory_is_host_addressable()
}

/// Whether the platform's policy gives owned host copies back after upload.
///
/// Asked by the release for weights whose host bytes are an owned buffer
/// (a dequantized or repacked copy): borrows follow the release conditions
/// of the file-backed pages instead. The answer comes from
/// [`ResidencyPolicy::release_host_weights_after_upload`](crate::platform::ResidencyPolicy),
/// which the load's knob `VT_RELEASE_HOST_WEIGHTS` may override.
pub fn release_owned_after_upload(platform: &dyn Platform) -> bool {
    platform
        .residency_policy()
        .release_host_weights_after_upload
}

/// Gives back the host bytes of a weight whose device copy has completed
/// (its queue synchronized: the caller's duty). Returns what was released,
/// or `None` when the rules keep the bytes.
///
/// A borrow's spent pages are dropped when ALL hold:
/// 1. the host bytes are a borrow (owned buffers follow
///    [`release_owned_after_upload`]);
/// 2. the borrow is file-backed (it has a file identity);
/// 3. the device cannot read the host pages ([`device_may_read_host_pages`]);
/// 4. the copy has completed (guaranteed by the caller).
///
/// The borrow itself is untouched and stays readable.
///
/// Private to the seam: called from outside before staging, it would give
/// the pages back and count a release with no upload.
///
/// ```compile_fail,E0603
/// fn release_early(w: &seam::weight::Weight, p: &dyn seam::platform::Platform) {
///     let _ = seam::release::release_staged_host_bytes(w, p);
/// }
/// ```
///
/// # Errors
///
/// `madvise` or `posix_fadvise` failed.
pub(crate) fn release_staged_host_bytes(
    weight: &Weight,
    platform: &dyn Platform,
) -> Result<Option<HostRelease>, BorrowError> {
    let release = match weight.host() {
        HostBytes::Borrow(borrow) => {
            if borrow.file_identity().is_none() || device_may_read_host_pages(platform) {
                return Ok(None);
            }
            let drop_page_cache = platform.residency_policy().drop_page_cache;
            let released = borrow.file().drop_resident_pages(
                borrow.offset(),
                borrow.len(),
                drop_page_cache,
            )?;
            HostRelease {
                weight: weight.name().to_owned(),
                borrowed: true,
                offset: borrow.offset(),
                len: borrow.len(),
                released,
            }
        }
        HostBytes::Owned(owned) => {
            if !release_owned_after_upload(platform) {
                return Ok(None);
            }
            HostRelease {
                weight: weight.name().to_owned(),
                borrowed: false,
                offset: 0,
                len: weight.host().len(),
                released: owned.give_back(),
            }
        }
    };
    platform.stage_counters().record_release(&release);
    platform.backend().host_pages_released(&release);
    Ok(Some(release))
}
