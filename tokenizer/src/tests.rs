//! Tests of the tokenizer on vocabularies built in code.
