//! The fake device's op layer: `device-ops`' CPU reference run on the fake
//! device's own buffers ([`FakeOps`]).
//!
//! A kernel reads its inputs in place ([`FakeBuffer::kernel_bytes`]) and
//! writes a new fake buffer ([`FakeBackend::kernel_output`], an allocation
//! the fake device counts); a staged weight is read where the seam put it,
//! never through [`Backend::read_back`], so a family's device path runs
//! in CI with the fake device's read-back count showing what came back.

use device_ops::{HostStorage, OpError, ReferenceOps, WeightKernel};
use seam::Resident;
use seam::platform::{Backend, DeviceBuffer, DeviceError, Platform};
use seam::weight::Weight;

use crate::{FakeBackend, FakeBuffer, FakePlatform, fake_buffer};

/// The fake device's buffers as a reference device's storage.
pub struct FakeStorage<'p> {
    platform: &'p FakePlatform,
}

impl FakeStorage<'_> {
    fn backend(&self) -> &FakeBackend {
        self.platform.fake_backend()
    }
}

impl HostStorage for FakeStorage<'_> {
    fn name(&self) -> String {
        self.backend().name()
    }

    fn kernel_read(&self, buf: &dyn DeviceBuffer) -> Result<Vec<u8>, DeviceError> {
        Ok(fake_buffer(buf)?.kernel_bytes())
    }

    fn kernel_write(&self, bytes: Vec<u8>) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
        Ok(Box::new(self.backend().kernel_output(bytes)?))
    }

    fn kernel_update(&self, buf: &dyn DeviceBuffer, bytes: Vec<u8>) -> Result<(), DeviceError> {
        let mut b = fake_buffer(buf)?.lock();
        if b.len() != bytes.len() {
            return Err(DeviceError::Misuse(format!(
                "an update of {} bytes to a buffer of {}",
                bytes.len(),
                b.len()
            )));
        }
        // In place, so the buffer's address stays what
        // `FakeBuffer::device_ptr` handed out.
        b.copy_from_slice(&bytes);
        Ok(())
    }

    /// An upload is a new buffer holding the bytes (the fake device takes
    /// them at once, as a driver stages pageable memory).
    fn upload(&self, bytes: Vec<u8>) -> Result<Box<dyn DeviceBuffer>, DeviceError> {
        Ok(Box::new(self.backend().kernel_output(bytes)?))
    }

    fn read_back(&self, buf: &dyn DeviceBuffer) -> Result<Vec<u8>, DeviceError> {
        let mut out = vec![0u8; buf.len() as usize];
        self.backend().read_back(buf, 0, &mut out)?;
        Ok(out)
    }

    /// The device copy on this device, or the host bytes where the
    /// platform says the device reads host memory (no staging).
    fn with_weight(
        &self,
        op: &'static str,
        weight: &Weight,
        resident: &Resident<'_>,
        f: &mut WeightKernel<'_>,
    ) -> Result<Vec<f32>, OpError> {
        let foreign = |why: String| OpError::ForeignWeight {
            op,
            weight: weight.name().to_owned(),
            device: self.name(),
            why,
        };
        match resident {
            Resident::Host(view) if !self.platform.needs_weight_staging() => f(view),
            Resident::Host(_) => Err(foreign(
                "its host bytes were handed out, but this fake device stages weights".into(),
            )),
            Resident::Device(copy) => {
                if copy.device() != self.platform.device_id() {
                    return Err(foreign(format!(
                        "it is staged on device {:?}",
                        copy.device()
                    )));
                }
                let buf: &FakeBuffer =
                    fake_buffer(copy.buffer()).map_err(|e| foreign(e.to_string()))?;
                f(&buf.kernel_bytes())
            }
        }
    }
}

/// The fake device's ops.
pub type FakeOps<'p> = ReferenceOps<FakeStorage<'p>>;

/// The ops of `platform`.
pub fn fake_ops(platform: &FakePlatform) -> FakeOps<'_> {
    ReferenceOps::new(FakeStorage { platform })
}

#[cfg(test)]
mod tests;
