//! What a draft model borrows from its target: the target's own weights,
//! shared by reference (one device memo, one upload and one release
//! whichever model asks first), and the sizes the draft is checked against.

use seam::weight::Weight;

/// The tables a draft borrows from its target.
pub trait TargetTables {
    /// The token embedding table `{n_embd, n_vocab}`, if the target has one.
    fn token_embd(&self) -> Option<&Weight>;
    /// The output head `{n_embd, n_vocab}` (the embedding table when tied),
    /// if the target has one.
    fn output_head(&self) -> Option<&Weight>;
    /// The target's hidden width (one tap's width).
    fn n_embd(&self) -> usize;
    /// The target's vocabulary size.
    fn n_vocab(&self) -> usize;
    /// The target's layers (tap layers must be below).
    fn n_layer(&self) -> usize;
}
