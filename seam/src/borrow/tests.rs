//! Tests of borrows.
