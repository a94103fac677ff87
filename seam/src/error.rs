//! Errors of staging a weight (the seam function and its release).

use crate::borrow::BorrowError;
use crate::platform::{DeviceError, DeviceId};

/// Why `resident_weight` could not hand out a weight.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeamError {
    /// The weight is a stack read in slices; staging it whole is refused.
    #[error("weight {weight:?} is expert-streamed: stage a slice of it, never the whole stack")]
    ExpertStreamed {
        /// The weight's name.
        weight: String,
    },
    /// A device operation failed while staging; the memo stays empty.
    #[error("staging weight {weight:?}: {source}")]
    Device {
        /// The weight's name.
        weight: String,
        /// The device's error.
        #[source]
        source: DeviceError,
    },
    /// The weight was staged on another device.
    #[error("weight {weight:?} is resident on device {staged:?}, not {asked:?}")]
    WrongDevice {
        /// The weight's name.
        weight: String,
        /// Where its copy lives.
        staged: DeviceId,
        /// The device asked for.
        asked: DeviceId,
    },
    /// The weight's owned host bytes were given back and there is no copy
    /// on the device asked for.
    #[error("weight {weight:?}: its host bytes were given back after upload")]
    HostBytesGone {
        /// The weight's name.
        weight: String,
    },
    /// The device copy is made, but giving the host pages back failed.
    #[error("releasing the host pages of weight {weight:?}: {source}")]
    Release {
        /// The weight's name.
        weight: String,
        /// The mapping's error.
        #[source]
        source: BorrowError,
    },
}
