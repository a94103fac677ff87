//! Tests of the GGUF layer.
