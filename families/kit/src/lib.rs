//! What every model family shares, so a family is its manifest, its
//! hyperparameters, its forward pass and a few lines of binary.
//!
//! - [`meta`]: typed reads of `{arch}.*` metadata (required, optional and
//!   per-layer keys, the architecture check); errors name the key.
//! - [`manifest`]: the [`ManifestBuilder`] (role, dims, type rule and route
//!   per tensor; per-layer patterns, optional tensors, expert stacks, drop
//!   and refusal rules by name), the two-way check and the census.
//! - [`error`]: [`LoadError`], the refusals every family shares.
//! - [`weights`]: [`LoadedWeights`], one borrowed weight per claimed tensor
//!   handed out by [`Handle`], and expert sub-span borrows made once.
//! - [`reader`]: [`WeightReader`], weights read through
//!   `seam::resident_weight` in bounded memory (matrices by rows, only
//!   small tensors kept dequantized, one cache keyed by the weight).
//! - [`fixture`]: fixtures written in code, in memory or streamed.
//! - [`draft`]: [`TargetTables`], what a draft borrows from its target.
//! - [`blocks`]: decoder blocks on the device op layer (the routed MoE,
//!   MLA, the lightning indexer), written once for every family.
//! - [`residency`]: peaks of host residency while decoding.
//! - [`conformance`]: the tests every family runs with one line
//!   ([`conformance_tests!`]).
//! - [`blocks`]: blocks on the device op layer shared by the families'
//!   device decoders ([`blocks::attention`]: full and sliding-window
//!   attention with head norms, partial RoPE, softcaps, an output gate and
//!   sandwich norms, and the final logits).
//! - [`family`]: the family contract ([`Family`], [`Decoder`]) and the
//!   greedy [`decode`] over it with its per-call figures.
//! - `driver` (feature `driver`): the one command line every family
//!   binary runs, `driver::run_family::<F>()`.
//!
//! **Architecture Invariant:** the kit reaches weights only through
//! `seam::resident_weight` and borrows, and knows no platform (the
//! conformance tests use the fake device behind the `conformance` feature).

pub mod blocks;
pub mod conformance;
pub mod draft;
#[cfg(feature = "driver")]
pub mod driver;
pub mod error;
pub mod family;
pub mod fixture;
#[cfg(feature = "conformance")]
pub mod golden;
pub mod greedy;
pub mod manifest;
pub mod meta;
pub mod numerics;
pub mod reader;
pub mod residency;
pub mod weights;

pub use conformance::FamilyUnderTest;
pub use draft::TargetTables;
pub use error::LoadError;
pub use family::{
    Decoder, ExpertStaging, Family, HostOrDevice, Traffic, decode, decode_with, prefill_by_steps,
};
pub use fixture::{FixtureSpec, FixtureTensor};
pub use greedy::{Decoded, greedy};
pub use manifest::{
    Census, Dims, DroppedTensor, Handle, Manifest, ManifestBuilder, RoleCensus, Route, RouteCensus,
    TensorSpec, TypeClass,
};
pub use meta::Meta;
pub use numerics::{CacheType, Numerics};
pub use reader::WeightReader;
pub use weights::{ExpertPart, LoadedWeights};
