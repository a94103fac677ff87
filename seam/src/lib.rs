//! seam: the one place where a GGUF weight's bytes go from the file to an
//! accelerator, and where the host's copy is given back.
//!
//! - [`session`] is the entry point: a load onto one device (the knobs
//!   resolved once, the file mapped with the resolved prefault, the staging
//!   ring, the queue, residency sampling);
//! - [`gguf`] reads GGUF without copying tensor data and writes fixtures;
//! - [`borrow`] holds the mapped files and zero-copy [`borrow::Borrow`]s;
//! - [`weight`] is a tensor with its host bytes and its device memo;
//! - [`resident_weight`] stages a weight once and memoizes the copy, and
//!   [`release`] gives the host's bytes back by the brief's rules;
//! - [`platform`] holds the [`platform::Backend`] and [`platform::Platform`]
//!   traits that the crates under `platforms/` implement, and
//!   [`backend_check`] the copies a backend's own tests may issue;
//! - [`policy`] resolves the load's knobs (env > config file > device
//!   default), [`ring`] the staging ring's;
//! - [`residency`] reads this process's memory figures from `/proc`;
//! - [`text`] makes names and paths safe to print on a terminal.
//!
//! # Loading a model: the session
//!
//! An engine opens a [`Session`](session::Session) on its device, maps the
//! file through it, and asks [`resident_weight`] (or
//! [`Session::resident`](session::Session::resident)) for each weight when a
//! kernel needs it. On a device that reads host memory (the CPU) a weight is
//! its mapped bytes; on one that stages, the first call copies it and the
//! host's pages are given back.
//!
//! ```
//! use seam::session::{Env, Session, SessionOptions};
//! use seam::weight::Role;
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("model.gguf");
//! # let mut w = seam::gguf::GgufWriter::new();
//! # w.add_tensor("output.weight", seam::gguf::GgmlType::F32, &[4], vec![0u8; 16])?;
//! # w.write_file(&path)?;
//!
//! let fake = platform_fake::FakePlatform::new(Default::default());
//! let options = SessionOptions {
//!     env: Env::vars([("VT_GGUF_PREFAULT", "on")]),
//!     ..SessionOptions::default()
//! };
//! let session = Session::new(&fake, &options)?;
//! assert!(session.policy_line().contains("prefault=on (env VT_GGUF_PREFAULT)"));
//! let model = session.open(&path)?;
//! let tensor = model.tensor("output.weight").expect("in the file");
//! let weight = session.weight(&model, tensor, Role::new("output"))?;
//! let resident = session.resident(&weight)?;
//! assert_eq!(resident.device_copy().map(|c| c.buffer().len()), Some(16));
//! // Asked again (every forward step), the memo answers.
//! session.resident(&weight)?;
//! assert_eq!(session.platform().stage_counters().snapshot().uploads, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`Session::stage_all`](session::Session::stage_all) stages every tensor
//! at once and hands the weights back, as `seam load` does.
//!
//! # Opening a file and staging by hand
//!
//! Below the session: a model opened with explicit map options, a weight
//! made of its borrow, staged on the host (nothing is copied: the kernel
//! reads the mapping).
//!
//! ```
//! use seam::borrow::MapOptions;
//! use seam::gguf::{GgmlType, GgufModel, GgufWriter};
//! use seam::platform::Platform;
//! use seam::weight::{Role, Weight};
//! use seam::{Resident, resident_weight};
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("model.gguf");
//!
//! let mut writer = GgufWriter::new();
//! writer.add_tensor("blk.0.ffn_up.weight", GgmlType::I8, &[8], vec![3u8; 8])?;
//! writer.write_file(&path)?;
//!
//! let model = GgufModel::open(&path, MapOptions { prefault: true })?;
//! let info = model.tensor("blk.0.ffn_up.weight").expect("in the file");
//! let weight = Weight::borrowed(
//!     &info.name,
//!     info.ggml_type,
//!     info.dims.clone(),
//!     Role::new("ffn_up"),
//!     model.tensor_borrow(info)?,
//! );
//! let host = platform_host::HostPlatform::new();
//! let queue = host.backend().create_queue()?;
//! match resident_weight(&weight, &host, &*queue)? {
//!     Resident::Host(bytes) => assert_eq!(&bytes[..], &[3u8; 8]),
//!     Resident::Device(_) => unreachable!("the CPU reads host memory"),
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Writing a backend
//!
//! A device is a [`Backend`](platform::Backend) (memory operations) and a
//! [`Platform`](platform::Platform) (policy over it). Both may be
//! implemented outside the seam; the seam calls them. Copies arrive as a
//! [`StagingCopy`](platform::StagingCopy), which only the seam can make:
//! the backend reads its source (valid until the queue is synchronized),
//! destination, offset and queue. Every method may be called from several
//! threads, each with its own queue; [`Backend::synchronize`](
//! platform::Backend::synchronize) is called by the seam on the thread that
//! queued the copies, before it gives any source back.
//!
//! ```
//! use std::any::Any;
//! use std::sync::Mutex;
//! use seam::platform::*;
//!
//! /// Device memory that is ordinary host memory, copied synchronously.
//! struct VecBuffer(Mutex<Vec<u8>>);
//! impl DeviceBuffer for VecBuffer {
//!     fn len(&self) -> u64 { self.0.lock().unwrap().len() as u64 }
//!     fn as_any(&self) -> &dyn Any { self }
//! }
//! struct NoQueue;
//! impl Queue for NoQueue {
//!     fn as_any(&self) -> &dyn Any { self }
//! }
//!
//! struct MyBackend;
//! impl Backend for MyBackend {
//!     fn name(&self) -> String { "mine".into() }
//!     fn allocate(&self, len: u64) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
//!         Ok(Box::new(VecBuffer(Mutex::new(vec![0; len as usize]))))
//!     }
//!     fn create_queue(&self) -> Result<Box<dyn Queue>, DeviceError> {
//!         Ok(Box::new(NoQueue))
//!     }
//!     fn copy_to_device_async(&self, copy: StagingCopy<'_>) -> Result<(), DeviceError> {
//!         let dst = copy.dst().as_any().downcast_ref::<VecBuffer>()
//!             .ok_or_else(|| DeviceError::Misuse("not my buffer".into()))?;
//!         let mut dst = dst.0.lock().unwrap();
//!         let range = buffer_range(copy.dst_offset(), copy.src().len(), dst.len() as u64)?;
//!         dst[range].copy_from_slice(copy.src());
//!         Ok(())
//!     }
//!     fn synchronize(&self, _queue: &dyn Queue) -> Result<(), DeviceError> { Ok(()) }
//!     fn read_back(&self, src: &dyn DeviceBuffer, at: u64, out: &mut [u8]) -> Result<(), DeviceError> {
//!         let src = src.as_any().downcast_ref::<VecBuffer>()
//!             .ok_or_else(|| DeviceError::Misuse("not my buffer".into()))?;
//!         let src = src.0.lock().unwrap();
//!         out.copy_from_slice(&src[buffer_range(at, out.len(), src.len() as u64)?]);
//!         Ok(())
//!     }
//!     fn device_memory_is_host_addressable(&self) -> bool { false }
//! }
//!
//! struct MyPlatform { backend: MyBackend, id: DeviceId, counters: StageCounters }
//! impl Platform for MyPlatform {
//!     fn backend(&self) -> &dyn Backend { &self.backend }
//!     fn device_id(&self) -> DeviceId { self.id }
//!     fn needs_weight_staging(&self) -> bool { true }
//!     fn host_memory_is_device_addressable(&self) -> bool { false }
//!     fn residency_policy(&self) -> ResidencyPolicy { ResidencyPolicy::default() }
//!     fn stage_counters(&self) -> &StageCounters { &self.counters }
//! }
//!
//! let mine = MyPlatform { backend: MyBackend, id: DeviceId::fresh(), counters: Default::default() };
//! let weight = seam::weight::Weight::owned(
//!     "w", seam::gguf::GgmlType::I8, vec![4], seam::weight::Role::new("w"), vec![1u8, 2, 3, 4],
//! );
//! let queue = mine.backend().create_queue()?;
//! let copy = seam::resident_weight(&weight, &mine, &*queue)?.device_copy().expect("staged");
//! let mut back = [0u8; 4];
//! mine.backend().read_back(copy.buffer(), 0, &mut back)?;
//! assert_eq!(back, [1, 2, 3, 4]);
//! // The owned host copy was given back after the upload.
//! assert!(weight.host_view().is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What only the seam can do
//!
//! By construction, not by convention: outside code cannot fill a device
//! memo, issue a device copy, or give a weight's host pages back.
//!
//! Filling a memo: its fields are private.
//!
//! ```compile_fail,E0616
//! fn fill(w: &seam::weight::Weight, copy: seam::weight::DeviceCopy) {
//!     let _ = w.memo.copy.set(copy);
//! }
//! ```
//!
//! ```compile_fail,E0451
//! fn forge(buffer: Box<dyn seam::platform::DeviceBuffer>, device: seam::platform::DeviceId)
//!     -> seam::weight::DeviceCopy
//! {
//!     seam::weight::DeviceCopy { buffer, device }
//! }
//! ```
//!
//! Issuing a weight's copy outside [`resident_weight`]: a backend copies
//! only a [`StagingCopy`](platform::StagingCopy), which has no public
//! constructor, and the staging ring's transfer is the seam's own.
//!
//! ```compile_fail,E0624
//! fn upload(w: &seam::weight::Weight, b: &dyn seam::platform::Backend,
//!           dst: &dyn seam::platform::DeviceBuffer, q: &dyn seam::platform::Queue) {
//!     let bytes = w.host_view().unwrap();
//!     let copy = unsafe { seam::platform::StagingCopy::new(&bytes, dst, 0, q) };
//!     let _ = b.copy_to_device_async(copy);
//! }
//! ```
//!
//! ```compile_fail,E0624
//! fn upload(ring: &seam::ring::StagingRing, b: &dyn seam::platform::Backend,
//!           bytes: &[u8], dst: &dyn seam::platform::DeviceBuffer) {
//!     let _ = ring.transfer(b, todo!(), bytes.len() as u64, dst);
//! }
//! ```
//!
//! Releasing a weight's host bytes (before staging it would count a
//! release with no upload), or a borrow's pages:
//!
//! ```compile_fail,E0603
//! fn release_early(w: &seam::weight::Weight, p: &dyn seam::platform::Platform) {
//!     let _ = seam::release::release_staged_host_bytes(w, p);
//! }
//! ```
//!
//! ```compile_fail,E0624
//! fn drop_pages(b: &seam::borrow::Borrow) {
//!     let _ = b.file().drop_resident_pages(b.offset(), b.len(), false);
//! }
//! ```
//!
//! ```compile_fail,E0624
//! fn give_back(w: &seam::weight::Weight) {
//!     if let seam::weight::HostBytes::Owned(o) = w.host() {
//!         o.give_back();
//!     }
//! }
//! ```
//!
//! **Architecture Invariant:** this crate imports no platform crate and no
//! model family crate; it knows no vendor API.
//!
//! **Architecture Invariant:** only [`resident_weight`] fills a device memo
//! and only the seam issues a device copy or releases a weight's host
//! bytes; the compile-fail examples above prove it.

#![deny(unsafe_op_in_unsafe_fn)]

mod backend;
pub mod backend_check;
pub mod borrow;
pub mod collective;
pub mod error;
pub mod gguf;
pub mod host_memory;
mod knob;
pub mod page_cache;
pub mod platform;
pub mod policy;
pub mod release;
pub mod residency;
pub mod resident;
pub mod ring;
pub mod session;
pub mod shard;
pub mod text;
pub mod weight;

pub use error::SeamError;
pub use resident::{Resident, resident_weight};
