//! Tests of the pre-tokenizers.
