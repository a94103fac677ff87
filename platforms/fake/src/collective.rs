//! Collectives between fake devices of one process: what NCCL does for GPUs,
//! done with memory copies, so a sharded load's broadcast runs everywhere.
//!
//! The ranks of a group rendezvous by call number: the root of a broadcast
//! leaves its buffer's bytes under the call's number, and every other rank
//! copies them into its own buffer (waiting for the root if it comes
//! first), as NCCL's ranks meet on the device.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use seam::collective::Collective;
use seam::platform::{DeviceBuffer, DeviceError};

use crate::fake_buffer;

/// A root's bytes, waiting for the ranks that have not taken them yet.
struct Posted {
    root: usize,
    bytes: Arc<Vec<u8>>,
    waiting: usize,
}

#[derive(Default)]
struct Exchange {
    posted: Mutex<HashMap<u64, Posted>>,
    arrived: Condvar,
}

impl Exchange {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Posted>> {
        self.posted.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One rank of a group of fake devices.
pub struct FakeCollective {
    rank: usize,
    n_ranks: usize,
    calls: AtomicU64,
    exchange: Arc<Exchange>,
}

impl FakeCollective {
    /// A group of `n` ranks, in rank order.
    pub fn group(n: usize) -> Vec<FakeCollective> {
        let exchange = Arc::new(Exchange::default());
        (0..n)
            .map(|rank| FakeCollective {
                rank,
                n_ranks: n,
                calls: AtomicU64::new(0),
                exchange: Arc::clone(&exchange),
            })
            .collect()
    }
}

impl Collective for FakeCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn n_ranks(&self) -> usize {
        self.n_ranks
    }

    fn broadcast(&self, buffer: &dyn DeviceBuffer, root: usize) -> Result<(), DeviceError> {
        if root >= self.n_ranks {
            return Err(DeviceError::Misuse(format!(
                "broadcast from rank {root} in a group of {}",
                self.n_ranks
            )));
        }
        let buffer = fake_buffer(buffer)?;
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        if self.n_ranks == 1 {
            return Ok(());
        }
        if self.rank == root {
            let bytes = Arc::new(buffer.lock().clone());
            self.exchange.lock().insert(
                call,
                Posted {
                    root,
                    bytes,
                    waiting: self.n_ranks - 1,
                },
            );
            self.exchange.arrived.notify_all();
            return Ok(());
        }
        let mut posted = self.exchange.lock();
        let bytes = loop {
            if let Some(p) = posted.get_mut(&call) {
                if p.root != root {
                    return Err(DeviceError::Misuse(format!(
                        "broadcast {call}: rank {} expects root {root}, the root was {}",
                        self.rank, p.root
                    )));
                }
                let bytes = Arc::clone(&p.bytes);
                p.waiting -= 1;
                if p.waiting == 0 {
                    posted.remove(&call);
                }
                break bytes;
            }
            posted = self
                .exchange
                .arrived
                .wait(posted)
                .unwrap_or_else(|e| e.into_inner());
        };
        drop(posted);
        let mut mine = buffer.lock();
        if mine.len() != bytes.len() {
            return Err(DeviceError::Misuse(format!(
                "broadcast {call}: rank {} has {} bytes, the root sent {}",
                self.rank,
                mine.len(),
                bytes.len()
            )));
        }
        mine.copy_from_slice(&bytes);
        Ok(())
    }
}
