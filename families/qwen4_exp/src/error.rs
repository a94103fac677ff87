//! The family's error: the kit's [`family_kit::LoadError`], whose every
//! refusal names the metadata key or the tensor it is about.

pub use family_kit::LoadError as Error;
