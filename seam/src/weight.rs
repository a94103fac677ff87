//! Weights: a tensor's name, type, shape, role, flags, host bytes (a borrow
//! of a mapped file or an owned buffer) and its device memo.
//!
//! The memo's fields are private to the seam: only
//! [`resident_weight`](crate::resident_weight) fills it, so no other crate
//! can stage a weight behind the seam's back.

use std::borrow::Cow;
use std::ops::Deref;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::borrow::Borrow;
use crate::gguf::GgmlType;
use crate::platform::{DeviceBuffer, DeviceId};

/// What a weight is for, named by the family that loads it (`"attn_q"`,
/// `"ffn_down_exps"`); the seam only reports it. A name known at compile
/// time costs nothing ([`Role::new`]); one built at run time is owned.
///
/// ```
/// use seam::weight::Role;
/// let layer = 3;
/// assert_eq!(Role::new("attn_q").as_str(), "attn_q");
/// assert_eq!(Role::from(format!("blk.{layer}.ffn")).as_str(), "blk.3.ffn");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Role(Cow<'static, str>);

impl Role {
    /// A role named by a string known at compile time.
    pub const fn new(name: &'static str) -> Role {
        Role(Cow::Borrowed(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&'static str> for Role {
    fn from(name: &'static str) -> Role {
        Role::new(name)
    }
}

impl From<String> for Role {
    fn from(name: String) -> Role {
        Role(Cow::Owned(name))
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Per-weight flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightFlags {
    /// A stack (of experts, of per-layer embedding rows) that is read in
    /// slices and never staged whole: `resident_weight` refuses it.
    pub expert_streamed: bool,
}

/// An owned host buffer, which the seam may give back after upload.
#[derive(Debug)]
pub struct OwnedBytes {
    bytes: RwLock<Option<Arc<[u8]>>>,
    len: u64,
}

impl OwnedBytes {
    fn new(bytes: Arc<[u8]>) -> OwnedBytes {
        OwnedBytes {
            len: bytes.len() as u64,
            bytes: RwLock::new(Some(bytes)),
        }
    }

    /// The bytes, or `None` once given back.
    pub fn get(&self) -> Option<Arc<[u8]>> {
        self.bytes.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Drops this weight's hold on the buffer; returns the bytes given back.
    pub(crate) fn give_back(&self) -> u64 {
        let taken = self.bytes.write().unwrap_or_else(|e| e.into_inner()).take();
        taken.map_or(0, |b| b.len() as u64)
    }
}

/// A weight's host bytes.
#[derive(Debug)]
pub enum HostBytes {
    /// A zero-copy view of a mapped file.
    Borrow(Borrow),
    /// A buffer the process allocated (a dequantized or repacked copy).
    Owned(OwnedBytes),
}

impl HostBytes {
    /// The length in bytes (also after an owned buffer was given back).
    pub fn len(&self) -> u64 {
        match self {
            HostBytes::Borrow(b) => b.len(),
            HostBytes::Owned(o) => o.len,
        }
    }

    /// Whether there are no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A view of a weight's host bytes that kernels may read.
#[derive(Clone, Debug)]
pub enum HostView<'w> {
    /// The weight's borrow.
    Borrow(&'w Borrow),
    /// The weight's owned buffer.
    Owned(Arc<[u8]>),
}

impl Deref for HostView<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            HostView::Borrow(b) => b.bytes(),
            HostView::Owned(o) => o,
        }
    }
}

/// A weight's device copy, made once by the seam.
pub struct DeviceCopy {
    pub(crate) buffer: Box<dyn DeviceBuffer>,
    pub(crate) device: DeviceId,
}

impl std::fmt::Debug for DeviceCopy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceCopy")
            .field("device", &self.device)
            .field("len", &self.buffer.len())
            .finish()
    }
}

impl DeviceCopy {
    /// The device buffer kernels read.
    pub fn buffer(&self) -> &dyn DeviceBuffer {
        &*self.buffer
    }

    /// The device it lives on.
    pub fn device(&self) -> DeviceId {
        self.device
    }
}

/// The device memo: filled at most once, only by the seam.
#[derive(Default)]
pub(crate) struct DeviceMemo {
    pub(crate) copy: OnceLock<DeviceCopy>,
    /// Serialises staging so concurrent first calls upload once.
    pub(crate) staging: Mutex<()>,
}

/// A model weight.
pub struct Weight {
    name: String,
    ggml_type: GgmlType,
    dims: Vec<u64>,
    role: Role,
    flags: WeightFlags,
    host: HostBytes,
    pub(crate) memo: DeviceMemo,
}

impl std::fmt::Debug for Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Weight")
            .field("name", &self.name)
            .field("ggml_type", &self.ggml_type)
            .field("dims", &self.dims)
            .field("role", &self.role)
            .field("flags", &self.flags)
            .field("host", &self.host)
            .field("device", &self.memo.copy.get())
            .finish()
    }
}

impl Weight {
    /// A weight whose host bytes borrow a mapped file.
    pub fn borrowed(
        name: impl Into<String>,
        ggml_type: GgmlType,
        dims: Vec<u64>,
        role: Role,
        borrow: Borrow,
    ) -> Weight {
        Weight::new(
            name.into(),
            ggml_type,
            dims,
            role,
            HostBytes::Borrow(borrow),
        )
    }

    /// A weight whose host bytes the process owns.
    pub fn owned(
        name: impl Into<String>,
        ggml_type: GgmlType,
        dims: Vec<u64>,
        role: Role,
        bytes: impl Into<Arc<[u8]>>,
    ) -> Weight {
        let host = HostBytes::Owned(OwnedBytes::new(bytes.into()));
        Weight::new(name.into(), ggml_type, dims, role, host)
    }

    fn new(
        name: String,
        ggml_type: GgmlType,
        dims: Vec<u64>,
        role: Role,
        host: HostBytes,
    ) -> Weight {
        Weight {
            name,
            ggml_type,
            dims,
            role,
            flags: WeightFlags::default(),
            host,
            memo: DeviceMemo::default(),
        }
    }

    /// The same weight with `flags`.
    pub fn with_flags(mut self, flags: WeightFlags) -> Weight {
        self.flags = flags;
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ggml type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// Dimensions in GGUF order (ne0 first).
    pub fn dims(&self) -> &[u64] {
        &self.dims
    }

    /// The role.
    pub fn role(&self) -> &Role {
        &self.role
    }

    /// The flags.
    pub fn flags(&self) -> WeightFlags {
        self.flags
    }

    /// The host bytes.
    pub fn host(&self) -> &HostBytes {
        &self.host
    }

    /// A readable view of the host bytes; `None` when they were an owned
    /// buffer that was given back after upload.
    pub fn host_view(&self) -> Option<HostView<'_>> {
        match &self.host {
            HostBytes::Borrow(b) => Some(HostView::Borrow(b)),
            HostBytes::Owned(o) => o.get().map(HostView::Owned),
        }
    }

    /// The device copy, if the seam has made one.
    pub fn device_copy(&self) -> Option<&DeviceCopy> {
        self.memo.copy.get()
    }
}

#[cfg(test)]
mod tests {
    use super::{Role, Weight};
    use crate::gguf::GgmlType;

    #[test]
    fn host_bytes_are_empty_only_without_bytes() {
        let w = |n: usize| {
            Weight::owned(
                "w",
                GgmlType::I8,
                vec![n as u64],
                Role::new("w"),
                vec![7u8; n],
            )
        };
        assert!(w(0).host().is_empty());
        assert!(!w(3).host().is_empty());
        assert_eq!(w(3).host().len(), 3);
    }

    #[test]
    fn a_role_is_its_name_static_or_owned() {
        let owned = Role::from(format!("blk.{}.ffn", 3));
        assert_eq!(owned.as_str(), "blk.3.ffn");
        assert_eq!(owned.to_string(), "blk.3.ffn");
        assert_eq!(Role::from("attn_q"), Role::new("attn_q"));
        assert_eq!(Role::new("attn_q").as_str(), "attn_q");
        assert_ne!(Role::new("attn_q"), Role::new("attn_k"));
    }
}
