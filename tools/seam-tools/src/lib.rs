//! Tooling around the seam that engines do not link: the inspect report
//! ([`inspect`]), the whole-model load report of `seam load` ([`load`]),
//! the sharded load over several devices ([`shard_load`]),
//! the benchmark's ceilings and naive path ([`bench`]), and models made in
//! code ([`demo`]: the demo model, generated models, the deterministic
//! byte generator of fixtures, temporary files, pages faulted in for tests);
//! with feature `cli`, what the binaries share on the terminal ([`cli`]:
//! refused flags as one line, progress bars).
//!
//! **Architecture Invariant:** this crate depends on the seam and no
//! platform or family; it issues no device copy of its own (its loads go
//! through a [`seam::session::Session`] or `seam::resident_weight`).

pub mod bench;
#[cfg(feature = "cli")]
pub mod cli;
pub mod demo;
pub mod inspect;
pub mod load;
pub mod output;
pub mod shard_load;
