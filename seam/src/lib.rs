//! seam: the one place where a GGUF weight's bytes go from the file to an
//! accelerator, and where the host's copy is given back.
//!
//! - [`gguf`] reads GGUF without copying tensor data and writes fixtures;
//! - [`borrow`] holds the mapped files and zero-copy [`borrow::Borrow`]s;
//! - [`weight`] is a tensor with its host bytes and its device memo;
//! - [`resident_weight`] stages a weight once and memoizes the copy, and
//!   [`release`] gives the host's bytes back by the brief's rules;
//! - [`platform`] holds the [`platform::Backend`] and [`platform::Platform`]
//!   traits that the crates under `platforms/` implement;
//! - [`policy`] resolves the load's knobs (env > config file > device
//!   default);
//! - [`residency`] reads this process's memory figures from `/proc`;
//! - [`text`] makes names and paths safe to print on a terminal, and
//!   [`output`] checks the binaries' output paths before they work.
//!
//! **Architecture Invariant:** this crate imports no platform crate and no
//! model family crate; it knows no vendor API.
//!
//! **Architecture Invariant:** only [`resident_weight`] fills a device memo.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod bench;
pub mod borrow;
pub mod demo;
pub mod error;
pub mod gguf;
pub mod inspect;
pub mod load;
pub mod output;
pub mod page_cache;
pub mod platform;
pub mod policy;
pub mod release;
pub mod residency;
pub mod resident;
pub mod ring;
pub mod shard;
pub mod text;
pub mod weight;

pub use error::SeamError;
pub use resident::{Resident, resident_weight};
