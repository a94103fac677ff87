//! NCCL between the CUDA devices of one process: the seam's
//! [`Collective`] for a sharded load, and the all-reduce and all-gather of
//! a tensor-parallel matrix product.
//!
//! One process drives every GPU, one thread per device (the shape of
//! [`seam::shard::stage_shards_once`]): the communicators are made together
//! by `ncclCommInitAll`, so no unique id has to travel between processes,
//! and the seam's per-device platforms, rings and counters stay in one
//! report. Each rank issues its collectives from its own thread on its own
//! stream, as NCCL allows for one communicator per thread.
//!
//! libnccl is loaded at run time through cudarc's `nccl` feature; its
//! loader panics when the library is missing, so [`NcclRank::init_all`]
//! checks first and answers `DeviceError::Unavailable` naming what it
//! searched. cudarc looks for `libnccl.so` (and `libnccl.so.1`, `.9` to
//! `.12`), not `libnccl.so.2`: where only the runtime package is
//! installed, a `libnccl.so` link to it must be on `LD_LIBRARY_PATH`.
//!
//! NVLink multicast (NVLS) is never asked for: nothing here calls
//! `cuMulticastCreate`, and machines that share GPUs set
//! `NCCL_NVLS_ENABLE=0`, which NCCL reads.

use std::ffi::{CStr, c_void};
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys};
use cudarc::nccl::result as nccl;
use cudarc::nccl::sys as nccl_sys;
use seam::collective::Collective;
use seam::platform::{DeviceBuffer, DeviceError};

use crate::{Context, CudaBuffer, CudaPlatform, cuda_buffer, driver_error};

/// The library names cudarc searches for libnccl.
pub fn library_candidates() -> Vec<String> {
    cudarc::get_lib_name_candidates("nccl")
}

/// Whether libnccl can be loaded.
pub fn library_present() -> bool {
    // SAFETY: this only tries to dlopen the candidate names; it calls
    // nothing in the library.
    unsafe { nccl_sys::is_culib_present() }
}

/// Why NCCL cannot be used, in one line; `None` when it can be loaded.
pub fn unavailable_reason() -> Option<String> {
    (!library_present()).then(|| {
        format!(
            "NCCL unavailable: libnccl not found (searched {}; put a libnccl.so link to libnccl.so.2 on LD_LIBRARY_PATH)",
            library_candidates().join(", ")
        )
    })
}

fn nccl_error(what: &str, e: nccl::NcclError) -> DeviceError {
    // SAFETY: ncclGetErrorString returns a static string for any result
    // code; the library is loaded (an error came from it).
    let text = unsafe { CStr::from_ptr(nccl_sys::ncclGetErrorString(e.0)) };
    DeviceError::CopyFailed(format!("{what}: {}", text.to_string_lossy()))
}

/// One rank: a communicator and a stream on one device.
pub struct NcclRank {
    comm: nccl_sys::ncclComm_t,
    stream: sys::CUstream,
    ctx: Arc<Context>,
    rank: usize,
    n_ranks: usize,
    /// One collective at a time on this communicator.
    busy: Mutex<()>,
}

// SAFETY: the communicator and stream are used only with the rank's
// context made current, one call at a time (`busy`); NCCL allows a
// communicator to be driven from any one thread at a time.
unsafe impl Send for NcclRank {}
// SAFETY: as above: every use takes `busy` first.
unsafe impl Sync for NcclRank {}

impl NcclRank {
    /// One communicator per device of `platforms`, rank `d` on
    /// `platforms[d]`, made together (`ncclCommInitAll`).
    ///
    /// # Errors
    ///
    /// `Unavailable` when libnccl cannot be loaded (naming what was
    /// searched) or NCCL fails to set up the communicators.
    pub fn init_all(platforms: &[&CudaPlatform]) -> Result<Vec<NcclRank>, DeviceError> {
        if let Some(why) = unavailable_reason() {
            return Err(DeviceError::Unavailable(why));
        }
        let n = platforms.len();
        let ordinals: Vec<i32> = platforms.iter().map(|p| p.probe().ordinal).collect();
        let mut comms: Vec<nccl_sys::ncclComm_t> = vec![std::ptr::null_mut(); n];
        let count = i32::try_from(n)
            .map_err(|_| DeviceError::Misuse(format!("{n} devices for one communicator")))?;
        // SAFETY: `comms` has room for `n` communicators and `ordinals`
        // holds `n` device ordinals; both outlive the call.
        unsafe { nccl::comm_init_all(comms.as_mut_ptr(), count, ordinals.as_ptr()) }.map_err(
            |e| match nccl_error("ncclCommInitAll", e) {
                DeviceError::CopyFailed(msg) => DeviceError::Unavailable(msg),
                other => other,
            },
        )?;
        let mut ranks = Vec::with_capacity(n);
        for (rank, (comm, platform)) in comms.iter().zip(platforms).enumerate() {
            let ctx = Arc::clone(&platform.backend.ctx);
            let stream = ctx.bind().and_then(|()| {
                result::stream::create(result::stream::StreamKind::NonBlocking)
                    .map_err(|e| driver_error("cuStreamCreate", e))
            });
            match stream {
                Ok(stream) => ranks.push(NcclRank {
                    comm: *comm,
                    stream,
                    ctx,
                    rank,
                    n_ranks: n,
                    busy: Mutex::new(()),
                }),
                Err(e) => {
                    // The ranks made so far are dropped (destroyed); the
                    // rest are destroyed here.
                    for &left in &comms[rank..] {
                        // SAFETY: made by ncclCommInitAll above and not
                        // owned by any rank yet.
                        let _ = unsafe { nccl::comm_destroy(left) };
                    }
                    return Err(e);
                }
            }
        }
        Ok(ranks)
    }

    fn own_buffer<'b>(&self, buffer: &'b dyn DeviceBuffer) -> Result<&'b CudaBuffer, DeviceError> {
        let buf = cuda_buffer(buffer)?;
        if buf.ctx.device != self.ctx.device {
            return Err(DeviceError::Misuse(format!(
                "rank {}: a buffer of another device",
                self.rank
            )));
        }
        Ok(buf)
    }

    fn stream(&self) -> nccl_sys::cudaStream_t {
        self.stream.cast()
    }

    /// Runs one collective on the rank's stream and waits for it.
    fn run(
        &self,
        what: &str,
        call: impl FnOnce() -> Result<nccl::NcclStatus, nccl::NcclError>,
    ) -> Result<(), DeviceError> {
        let _busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        self.ctx.bind()?;
        call().map_err(|e| nccl_error(what, e))?;
        // SAFETY: the stream was created in this context and is alive.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    /// Sums `count` f32 values of `buffer` over the ranks, in place: every
    /// rank passes its own buffer and ends with the sum.
    ///
    /// # Errors
    ///
    /// A foreign or short buffer, or NCCL failed.
    pub fn all_reduce_sum_f32(
        &self,
        buffer: &dyn DeviceBuffer,
        count: usize,
    ) -> Result<(), DeviceError> {
        let buf = self.own_buffer(buffer)?;
        seam::platform::buffer_range(0, count * 4, buf.len)?;
        let ptr = buf.ptr as *mut c_void;
        self.run("ncclAllReduce", || {
            // SAFETY: `ptr` holds `count` f32 (checked); in place is
            // allowed; the stream is synchronized before `buffer` can go.
            unsafe {
                nccl::all_reduce(
                    ptr,
                    ptr,
                    count,
                    nccl_sys::ncclDataType_t::ncclFloat32,
                    nccl_sys::ncclRedOp_t::ncclSum,
                    self.comm,
                    self.stream(),
                )
            }
        })
    }

    /// Gathers `count` f32 values of every rank's `send` into every rank's
    /// `recv`, in rank order (`recv` holds `count * n_ranks`).
    ///
    /// # Errors
    ///
    /// A foreign or short buffer, or NCCL failed.
    pub fn all_gather_f32(
        &self,
        send: &dyn DeviceBuffer,
        recv: &dyn DeviceBuffer,
        count: usize,
    ) -> Result<(), DeviceError> {
        let (s, r) = (self.own_buffer(send)?, self.own_buffer(recv)?);
        seam::platform::buffer_range(0, count * 4, s.len)?;
        seam::platform::buffer_range(0, count * 4 * self.n_ranks, r.len)?;
        let (sp, rp) = (s.ptr as *const c_void, r.ptr as *mut c_void);
        self.run("ncclAllGather", || {
            // SAFETY: the sizes were checked; the stream is synchronized
            // before either buffer can go.
            unsafe {
                nccl::all_gather(
                    sp,
                    rp,
                    count,
                    nccl_sys::ncclDataType_t::ncclFloat32,
                    self.comm,
                    self.stream(),
                )
            }
        })
    }
}

impl Collective for NcclRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn n_ranks(&self) -> usize {
        self.n_ranks
    }

    fn broadcast(&self, buffer: &dyn DeviceBuffer, root: usize) -> Result<(), DeviceError> {
        let buf = self.own_buffer(buffer)?;
        let root = i32::try_from(root)
            .ok()
            .filter(|&r| (r as usize) < self.n_ranks)
            .ok_or_else(|| {
                DeviceError::Misuse(format!("broadcast from rank {root} of {}", self.n_ranks))
            })?;
        if buf.len == 0 {
            return Ok(());
        }
        let ptr = buf.ptr as *mut c_void;
        let len = buf.len as usize;
        self.run("ncclBroadcast", || {
            // SAFETY: `ptr` holds `len` bytes on this rank's device; in
            // place (send = receive) is allowed; the stream is synchronized
            // before the buffer can go.
            unsafe {
                nccl::broadcast(
                    ptr,
                    ptr,
                    len,
                    nccl_sys::ncclDataType_t::ncclUint8,
                    root,
                    self.comm,
                    self.stream(),
                )
            }
        })
    }
}

impl Drop for NcclRank {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: the stream was created in this context; pending work
            // is waited for before it is destroyed.
            unsafe {
                let _ = result::stream::synchronize(self.stream);
                let _ = result::stream::destroy(self.stream);
            }
        }
        // SAFETY: the communicator was made by ncclCommInitAll and is
        // destroyed once, here.
        let _ = unsafe { nccl::comm_destroy(self.comm) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without libnccl (CI), the reason is one line naming the searched
    /// names; with it, there is no reason.
    #[test]
    fn unavailable_names_what_it_searched_in_one_line() {
        match unavailable_reason() {
            Some(why) => {
                assert!(!library_present());
                assert!(
                    why.starts_with("NCCL unavailable: libnccl not found"),
                    "{why}"
                );
                assert!(why.contains("libnccl.so"), "{why}");
                assert!(!why.contains('\n'), "{why}");
            }
            None => assert!(library_present()),
        }
    }
}
