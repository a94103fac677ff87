//! Blocks on the device op layer ([`device_ops::Ops`]), written once and
//! used by every family that has them.

pub mod attention;
