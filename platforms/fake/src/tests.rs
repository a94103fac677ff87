//! Tests of the fake device.
