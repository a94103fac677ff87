//! seam: the one place where a GGUF weight's bytes go from the file to an
//! accelerator, and where the host's copy is given back.
//!
//! The crate reads GGUF without copying ([`gguf`]), hands out zero-copy
//! [`borrow::Borrow`]s of tensor data, and (in later modules) stages each
//! weight to a device exactly once through `resident_weight`.
//!
//! **Architecture Invariant:** this crate imports no platform crate and no
//! model family crate; it knows no vendor API.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod borrow;
pub mod demo;
pub mod gguf;
pub mod inspect;
