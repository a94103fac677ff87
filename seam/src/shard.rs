//! Sharded staging: one model over several devices.
//!
//! A [`ShardPlan`] says, for each weight, which of its bytes go to which
//! device, from a device count and a [`ShardStrategy`] per weight:
//!
//! - [`ShardStrategy::Rows`] (tensor parallel, row split): GGUF dims are
//!   `[ne0, ne1, ...]`; a row is `ne0` elements, `row_bytes` contiguous
//!   bytes (whole quantization blocks by construction, so a quantized split
//!   never cuts a block). The `ne1 * ne2 * ...` rows are split into one
//!   contiguous range per device, as evenly as possible (the first
//!   `rows % n` devices get one row more). For a matrix `W` of dims
//!   `[in, out]` this splits the *output* rows: each device computes its
//!   slice of `y = W x` and the slices are concatenated. (A column split,
//!   over `in`, would leave each device a partial sum of every output,
//!   to be added across devices: the all-reduce NCCL does on GPUs. Its
//!   shards would also be strided, not contiguous byte ranges.)
//! - [`ShardStrategy::Experts`] (expert parallel): a 3-D stack
//!   `[ne0, ne1, n_expert]`; expert `e` is the contiguous bytes of
//!   `ne0 * ne1` elements. Experts are dealt to devices in contiguous
//!   groups, as evenly as possible.
//! - [`ShardStrategy::Replicate`]: small tensors (norms, biases): every
//!   device gets the whole tensor.
//!
//! A shard that would hold no bytes (more devices than rows) is left out of
//! the plan: that device gets nothing of the weight.
//!
//! A device's shard of a borrowed weight is a sub-span of the weight's
//! borrow ([`Borrow::sub_span`]): same file, narrower range, no copy. Each
//! shard becomes a [`Weight`] of its own, staged through
//! [`resident_weight`] on *its* device's platform, so the memo and the
//! release of the host pages hold per shard exactly as for a whole weight:
//! staged once, released once, pages given back after the copy completed.
//! [`stage_shards`] stages every device's shards (one thread per device) and
//! reports per-device counts from each platform's
//! [`stage_counters`](Platform::stage_counters).

use std::collections::HashMap;
use std::ops::Range;

use crate::SeamError;
use crate::borrow::{Borrow, BorrowError};
use crate::collective::{Collective, Receiving};
use crate::gguf::{GgmlType, GgufError, GgufModel, TensorInfo};
use crate::platform::{DeviceError, Platform, StageCounts};
use crate::resident::resident_weight;
use crate::weight::{Role, Weight};

/// How one weight is spread over the devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShardStrategy {
    /// Every device gets the whole tensor (norms, biases, small tables).
    Replicate,
    /// Tensor parallel: the rows (`ne0` elements each) are split into one
    /// contiguous range per device.
    Rows,
    /// Expert parallel: the experts of a `[ne0, ne1, n_expert]` stack are
    /// dealt to devices in contiguous groups.
    Experts,
}

impl ShardStrategy {
    /// A default by shape: a 3-D stack is split by experts, a matrix by
    /// rows, anything else replicated. Families that know a weight's role
    /// choose for themselves.
    pub fn by_shape(dims: &[u64]) -> ShardStrategy {
        match dims.len() {
            3 => ShardStrategy::Experts,
            2 => ShardStrategy::Rows,
            _ => ShardStrategy::Replicate,
        }
    }
}

/// Which part of a weight a shard is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ShardPart {
    /// The whole tensor (replicated).
    Whole,
    /// Rows `[start, end)` (rows of `ne0` elements, outer dims flattened).
    Rows(Range<u64>),
    /// Experts `[start, end)` of a stack.
    Experts(Range<u64>),
}

/// One device's part of one weight.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DeviceShard {
    /// The device: an index into the platforms a plan is staged on.
    pub device: usize,
    /// The shard's bytes, relative to the weight's first byte.
    pub byte_range: Range<u64>,
    /// The rows or experts it holds.
    pub part: ShardPart,
    /// The shard's dims in GGUF order: `[ne0, rows]` for a row split,
    /// `[ne0, ne1, experts]` for an expert split, the weight's own when
    /// replicated.
    pub dims: Vec<u64>,
}

impl DeviceShard {
    /// Bytes of the shard.
    pub fn len(&self) -> u64 {
        self.byte_range.end - self.byte_range.start
    }

    /// Whether the shard has no bytes (never so in a plan).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the plan needs to know of a weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSpec {
    /// The name.
    pub name: String,
    /// The ggml type.
    pub ggml_type: GgmlType,
    /// Dims in GGUF order (ne0 first).
    pub dims: Vec<u64>,
    /// The role (given to every shard's weight).
    pub role: Role,
    /// How it is spread.
    pub strategy: ShardStrategy,
}

/// The plan of one weight: its shards, in device order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WeightPlan {
    /// The weight.
    pub spec: ShardSpec,
    /// Bytes of the whole weight.
    pub n_bytes: u64,
    /// Bytes of one row (`ne0` elements).
    pub row_bytes: u64,
    /// The shards, in device order; none empty.
    pub shards: Vec<DeviceShard>,
}

/// Why a plan could not be made or staged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// A plan over no devices.
    #[error("a shard plan needs at least one device")]
    NoDevices,
    /// The weight's shape does not fit its strategy or its type.
    #[error("weight {weight:?} (dims {dims:?}): cannot shard by {strategy:?}: {reason}")]
    Shape {
        /// The weight.
        weight: String,
        /// Its dims.
        dims: Vec<u64>,
        /// The strategy asked for.
        strategy: ShardStrategy,
        /// What is wrong.
        reason: String,
    },
    /// The host bytes handed in are not the planned weight's size.
    #[error("weight {weight:?}: the plan expects {expected} bytes, the borrow has {got}")]
    Length {
        /// The weight.
        weight: String,
        /// Bytes of the plan.
        expected: u64,
        /// Bytes of the borrow.
        got: u64,
    },
    /// A shard's sub-span could not be borrowed.
    #[error("weight {weight:?}: {source}")]
    Borrow {
        /// The weight.
        weight: String,
        /// The borrow's error.
        #[source]
        source: BorrowError,
    },
    /// The model has no tensor of a planned name.
    #[error("the model has no tensor {0:?}")]
    UnknownTensor(String),
    /// The model's file could not be borrowed from.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The plan is for a different number of devices than were given.
    #[error("the plan is for {planned} devices, {given} platforms were given")]
    DeviceCount {
        /// Devices in the plan.
        planned: usize,
        /// Platforms given.
        given: usize,
    },
    /// The collectives are not one rank per plan device, in order.
    #[error("collective {index} is rank {rank} of {n_ranks}; the plan has {planned} devices")]
    Ranks {
        /// Index of the collective given.
        index: usize,
        /// Its rank.
        rank: usize,
        /// Its group's size.
        n_ranks: usize,
        /// Devices in the plan.
        planned: usize,
    },
    /// A replicated weight is already resident on a device, so the ranks
    /// could not agree on which broadcasts to make.
    #[error("replicated weight {weight:?} is already resident on device {device}")]
    AlreadyResident {
        /// The weight.
        weight: String,
        /// The device.
        device: usize,
    },
    /// Another device failed, so this one did not take part in the
    /// broadcasts.
    #[error("device {device}: not broadcasting: another device failed")]
    PeerFailed {
        /// The plan's device index.
        device: usize,
    },
    /// Two plan devices are the same platform instance.
    #[error("devices {first} and {second} are the same platform device")]
    SameDevice {
        /// The first index.
        first: usize,
        /// The second index.
        second: usize,
    },
    /// A device could not make a queue.
    #[error("device {device}: {source}")]
    Device {
        /// The plan's device index.
        device: usize,
        /// The device's error.
        #[source]
        source: DeviceError,
    },
    /// Staging a shard failed.
    #[error("device {device}: {source}")]
    Seam {
        /// The plan's device index.
        device: usize,
        /// The seam's error.
        #[source]
        source: SeamError,
    },
}

/// Splits `count` items into `n` contiguous ranges, in order, as evenly as
/// possible: the first `count % n` ranges hold one item more. The ranges
/// partition `[0, count)`; with `count < n` the last ones are empty.
/// `n == 0` gives no ranges.
pub fn split_even(count: u64, n: usize) -> Vec<Range<u64>> {
    let n64 = n as u64;
    if n64 == 0 {
        return Vec::new();
    }
    let (base, extra) = (count / n64, count % n64);
    (0..n64)
        .map(|d| {
            let start = d * base + d.min(extra);
            let len = base + u64::from(d < extra);
            start..start + len
        })
        .collect()
}

impl WeightPlan {
    /// Plans one weight over `n_devices` devices.
    ///
    /// # Errors
    ///
    /// No devices; `ne0` is not whole blocks of the type; the size
    /// overflows; `Rows` on fewer than 2 dims; `Experts` on other than 3.
    pub fn new(spec: ShardSpec, n_devices: usize) -> Result<WeightPlan, ShardError> {
        if n_devices == 0 {
            return Err(ShardError::NoDevices);
        }
        let shape = |reason: String| ShardError::Shape {
            weight: spec.name.clone(),
            dims: spec.dims.clone(),
            strategy: spec.strategy,
            reason,
        };
        let ne0 = spec.dims.first().copied().unwrap_or(1);
        let row_bytes = spec.ggml_type.row_bytes(ne0).ok_or_else(|| {
            shape(format!(
                "ne0 {ne0} is not whole {} blocks of {}",
                spec.ggml_type,
                spec.ggml_type.block_size()
            ))
        })?;
        let rows = spec
            .dims
            .iter()
            .skip(1)
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| shape("the row count overflows".into()))?;
        let n_bytes = rows
            .checked_mul(row_bytes)
            .ok_or_else(|| shape("the size overflows".into()))?;
        let shards: Vec<DeviceShard> = match spec.strategy {
            ShardStrategy::Replicate => (0..n_devices)
                .map(|device| DeviceShard {
                    device,
                    byte_range: 0..n_bytes,
                    part: ShardPart::Whole,
                    dims: spec.dims.clone(),
                })
                .collect(),
            ShardStrategy::Rows => {
                if spec.dims.len() < 2 {
                    return Err(shape("a row split needs at least 2 dims".into()));
                }
                split_even(rows, n_devices)
                    .into_iter()
                    .enumerate()
                    .map(|(device, r)| DeviceShard {
                        device,
                        byte_range: r.start * row_bytes..r.end * row_bytes,
                        dims: vec![ne0, r.end - r.start],
                        part: ShardPart::Rows(r),
                    })
                    .collect()
            }
            ShardStrategy::Experts => {
                let &[_, ne1, n_expert] = spec.dims.as_slice() else {
                    return Err(shape(
                        "an expert split needs 3 dims [ne0, ne1, n_expert]".into(),
                    ));
                };
                // ne1 * row_bytes <= n_bytes, which did not overflow.
                let expert_bytes = ne1 * row_bytes;
                split_even(n_expert, n_devices)
                    .into_iter()
                    .enumerate()
                    .map(|(device, e)| DeviceShard {
                        device,
                        byte_range: e.start * expert_bytes..e.end * expert_bytes,
                        dims: vec![ne0, ne1, e.end - e.start],
                        part: ShardPart::Experts(e),
                    })
                    .collect()
            }
        };
        let shards = shards.into_iter().filter(|s| !s.is_empty()).collect();
        Ok(WeightPlan {
            spec,
            n_bytes,
            row_bytes,
            shards,
        })
    }

    /// One weight per shard, each borrowing its sub-span of `borrow` (the
    /// whole weight's bytes): same file, narrower range, no copy.
    ///
    /// # Errors
    ///
    /// `borrow` is not the planned size.
    pub fn shard_weights(&self, borrow: &Borrow) -> Result<Vec<(DeviceShard, Weight)>, ShardError> {
        if borrow.len() != self.n_bytes {
            return Err(ShardError::Length {
                weight: self.spec.name.clone(),
                expected: self.n_bytes,
                got: borrow.len(),
            });
        }
        self.shards
            .iter()
            .map(|shard| {
                let span = borrow
                    .sub_span(shard.byte_range.start, shard.len())
                    .map_err(|source| ShardError::Borrow {
                        weight: self.spec.name.clone(),
                        source,
                    })?;
                let weight = Weight::borrowed(
                    self.spec.name.clone(),
                    self.spec.ggml_type,
                    shard.dims.clone(),
                    self.spec.role.clone(),
                    span,
                );
                Ok((shard.clone(), weight))
            })
            .collect()
    }
}

/// Which device gets which bytes of every weight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlan {
    n_devices: usize,
    weights: Vec<WeightPlan>,
}

impl ShardPlan {
    /// Plans `specs` over `n_devices` devices.
    ///
    /// # Errors
    ///
    /// No devices, or a weight's shape does not fit its strategy.
    pub fn new(
        n_devices: usize,
        specs: impl IntoIterator<Item = ShardSpec>,
    ) -> Result<ShardPlan, ShardError> {
        if n_devices == 0 {
            return Err(ShardError::NoDevices);
        }
        let weights = specs
            .into_iter()
            .map(|spec| WeightPlan::new(spec, n_devices))
            .collect::<Result<_, _>>()?;
        Ok(ShardPlan { n_devices, weights })
    }

    /// Plans every tensor of `model`; `choose` gives each its role and
    /// strategy.
    ///
    /// # Errors
    ///
    /// As [`ShardPlan::new`].
    pub fn for_model(
        model: &GgufModel,
        n_devices: usize,
        choose: impl Fn(&TensorInfo) -> (Role, ShardStrategy),
    ) -> Result<ShardPlan, ShardError> {
        let specs = model.tensors().iter().map(|t| {
            let (role, strategy) = choose(t);
            ShardSpec {
                name: t.name.clone(),
                ggml_type: t.ggml_type,
                dims: t.dims.clone(),
                role,
                strategy,
            }
        });
        ShardPlan::new(n_devices, specs)
    }

    /// The number of devices.
    pub fn n_devices(&self) -> usize {
        self.n_devices
    }

    /// Every weight's plan, in the order given.
    pub fn weights(&self) -> &[WeightPlan] {
        &self.weights
    }

    /// The plan of the weight named `name`.
    pub fn weight(&self, name: &str) -> Option<&WeightPlan> {
        self.weights.iter().find(|w| w.spec.name == name)
    }

    /// Bytes each device is planned to receive.
    pub fn device_bytes(&self) -> Vec<u64> {
        let mut bytes = vec![0; self.n_devices];
        for shard in self.weights.iter().flat_map(|w| &w.shards) {
            bytes[shard.device] += shard.len();
        }
        bytes
    }

    /// Builds every shard's weight; `borrow_of` gives the whole weight's
    /// borrow.
    ///
    /// # Errors
    ///
    /// `borrow_of` failed, or a borrow is not its weight's planned size.
    pub fn borrow_weights(
        &self,
        mut borrow_of: impl FnMut(&WeightPlan) -> Result<Borrow, ShardError>,
    ) -> Result<ShardedWeights, ShardError> {
        let mut devices: Vec<Vec<ShardWeight>> = (0..self.n_devices).map(|_| Vec::new()).collect();
        for (tensor, plan) in self.weights.iter().enumerate() {
            let borrow = borrow_of(plan)?;
            for (shard, weight) in plan.shard_weights(&borrow)? {
                devices[shard.device].push(ShardWeight {
                    tensor,
                    shard,
                    weight,
                });
            }
        }
        Ok(ShardedWeights { devices })
    }

    /// Builds every shard's weight from `model`'s tensors of the same names.
    ///
    /// # Errors
    ///
    /// A planned tensor is not in `model`, or its size differs.
    pub fn model_weights(&self, model: &GgufModel) -> Result<ShardedWeights, ShardError> {
        let by_name: HashMap<&str, &TensorInfo> = model
            .tensors()
            .iter()
            .map(|t| (t.name.as_str(), t))
            .collect();
        self.borrow_weights(|plan| {
            let info = by_name
                .get(plan.spec.name.as_str())
                .ok_or_else(|| ShardError::UnknownTensor(plan.spec.name.clone()))?;
            Ok(model.tensor_borrow(info)?)
        })
    }
}

/// One shard as a weight of its own device.
#[derive(Debug)]
pub struct ShardWeight {
    /// Index of the whole weight in [`ShardPlan::weights`].
    pub tensor: usize,
    /// Which part of it this is.
    pub shard: DeviceShard,
    /// The shard's weight: a sub-span borrow, with the shard's dims and the
    /// whole weight's name, type and role. Its device memo holds the copy.
    pub weight: Weight,
}

/// Every device's shard weights.
#[derive(Debug)]
pub struct ShardedWeights {
    devices: Vec<Vec<ShardWeight>>,
}

impl ShardedWeights {
    /// The number of devices.
    pub fn n_devices(&self) -> usize {
        self.devices.len()
    }

    /// Device `device`'s shards, in plan order.
    ///
    /// # Panics
    ///
    /// `device` is not below [`ShardedWeights::n_devices`].
    pub fn device(&self, device: usize) -> &[ShardWeight] {
        &self.devices[device]
    }

    /// Every device's shards.
    pub fn devices(&self) -> &[Vec<ShardWeight>] {
        &self.devices
    }
}

/// What staging did on one device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceStaging {
    /// The plan's device index.
    pub device: usize,
    /// Shards the plan gives it.
    pub shards: usize,
    /// Bytes the plan gives it.
    pub planned_bytes: u64,
    /// What this call added to the device's
    /// [`stage_counters`](Platform::stage_counters) (zero for shards
    /// already resident: the memo).
    pub counts: StageCounts,
}

fn counts_since(before: StageCounts, after: StageCounts) -> StageCounts {
    StageCounts {
        uploads: after.uploads.saturating_sub(before.uploads),
        uploaded_bytes: after.uploaded_bytes.saturating_sub(before.uploaded_bytes),
        releases: after.releases.saturating_sub(before.releases),
        released_page_bytes: after
            .released_page_bytes
            .saturating_sub(before.released_page_bytes),
        released_span_bytes: after
            .released_span_bytes
            .saturating_sub(before.released_span_bytes),
        receives: after.receives.saturating_sub(before.receives),
        received_bytes: after.received_bytes.saturating_sub(before.received_bytes),
    }
}

/// Stages `shards` (those `skip` leaves) on `platform` through
/// [`resident_weight`], one worker per lane of the platform's staging ring
/// (one without a ring), each with its own queue: while one weight's
/// pipeline drains, the next one's fills, as in a single-device load.
fn stage_in_lanes(
    device: usize,
    shards: &[ShardWeight],
    platform: &dyn Platform,
    skip: &(dyn Fn(&ShardWeight) -> bool + Sync),
) -> Result<(), ShardError> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let workers = platform
        .staging_ring()
        .map_or(1, |r| r.lanes())
        .clamp(1, shards.len().max(1));
    let next = AtomicUsize::new(0);
    let first_error: Mutex<Option<ShardError>> = Mutex::new(None);
    let failed = || {
        first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    };
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                let staged = (|| {
                    let queue = platform
                        .backend()
                        .create_queue()
                        .map_err(|source| ShardError::Device { device, source })?;
                    while !failed() {
                        let Some(shard) = shards.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            break;
                        };
                        if !skip(shard) {
                            resident_weight(&shard.weight, platform, &*queue)
                                .map_err(|source| ShardError::Seam { device, source })?;
                        }
                    }
                    Ok(())
                })();
                if let Err(e) = staged {
                    first_error
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .get_or_insert(e);
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn stage_device(
    device: usize,
    shards: &[ShardWeight],
    platform: &dyn Platform,
) -> Result<DeviceStaging, ShardError> {
    let before = platform.stage_counters().snapshot();
    stage_in_lanes(device, shards, platform, &|_| false)?;
    Ok(DeviceStaging {
        device,
        shards: shards.len(),
        planned_bytes: shards.iter().map(|s| s.shard.len()).sum(),
        counts: counts_since(before, platform.stage_counters().snapshot()),
    })
}

/// Which device reads each replicated weight from the file: the `k`-th
/// replicated weight of the plan (in plan order) goes to device
/// `k % n_devices`, so the reads are spread over the devices. Keyed by the
/// weight's index in [`ShardPlan::weights`].
pub fn replicated_readers(weights: &ShardedWeights) -> HashMap<usize, usize> {
    let n = weights.n_devices().max(1);
    weights
        .devices
        .first()
        .map(|first| {
            first
                .iter()
                .filter(|s| s.shard.part == ShardPart::Whole)
                .enumerate()
                .map(|(k, s)| (s.tensor, k % n))
                .collect()
        })
        .unwrap_or_default()
}

fn check_distinct(platforms: &[&dyn Platform], planned: usize) -> Result<(), ShardError> {
    if platforms.len() != planned {
        return Err(ShardError::DeviceCount {
            planned,
            given: platforms.len(),
        });
    }
    let mut seen = HashMap::new();
    for (d, p) in platforms.iter().enumerate() {
        if let Some(first) = seen.insert(p.device_id(), d) {
            return Err(ShardError::SameDevice { first, second: d });
        }
    }
    Ok(())
}

/// One device's part of [`stage_shards_once`]: its own shards and the
/// replicated weights it reads, then (once every device got that far
/// without failing) the broadcasts, in plan order.
fn stage_device_once(
    device: usize,
    shards: &[ShardWeight],
    platform: &dyn Platform,
    collective: &dyn Collective,
    readers: &HashMap<usize, usize>,
    all_read: &std::sync::Barrier,
    failed: &std::sync::atomic::AtomicBool,
) -> Result<DeviceStaging, ShardError> {
    use std::sync::atomic::Ordering;
    let before = platform.stage_counters().snapshot();
    let read = stage_in_lanes(device, shards, platform, &|shard| {
        readers.get(&shard.tensor).is_some_and(|&r| r != device)
    })
    .and_then(|()| {
        platform
            .backend()
            .create_queue()
            .map_err(|source| ShardError::Device { device, source })
    });
    if read.is_err() {
        failed.store(true, Ordering::SeqCst);
    }
    // Every rank must make every broadcast or none: a rank that failed
    // would leave the others waiting for it.
    all_read.wait();
    let queue = read?;
    if failed.load(Ordering::SeqCst) {
        return Err(ShardError::PeerFailed { device });
    }
    for shard in shards {
        let Some(&root) = readers.get(&shard.tensor) else {
            continue;
        };
        let seam = |source| ShardError::Seam { device, source };
        if root == device {
            let resident = resident_weight(&shard.weight, platform, &*queue).map_err(seam)?;
            if let Some(copy) = resident.device_copy() {
                collective
                    .broadcast(copy.buffer(), root)
                    .map_err(|source| ShardError::Device { device, source })?;
            }
        } else {
            let receiving = Receiving::new(platform, collective, root);
            resident_weight(&shard.weight, &receiving, &*queue).map_err(seam)?;
        }
    }
    Ok(DeviceStaging {
        device,
        shards: shards.len(),
        planned_bytes: shards.iter().map(|s| s.shard.len()).sum(),
        counts: counts_since(before, platform.stage_counters().snapshot()),
    })
}

/// Stages every device's shards as [`stage_shards`] does, except that each
/// replicated weight is read from the file by one device only (see
/// [`replicated_readers`]) and reaches the others by a broadcast over
/// `collectives` (rank `d` for device `d`): each byte of the file is read
/// once across the devices. A received copy counts as a receive, not an
/// upload, in its device's counters.
///
/// Replicated weights must not be resident yet (the ranks must agree on
/// the broadcasts). If a device fails before the broadcasts, none are made
/// and the other devices report [`ShardError::PeerFailed`].
///
/// # Errors
///
/// As [`stage_shards`]; the collectives are not one rank per device in
/// order; a replicated weight is already resident; a broadcast failed.
pub fn stage_shards_once(
    weights: &ShardedWeights,
    platforms: &[&dyn Platform],
    collectives: &[&dyn Collective],
) -> Result<Vec<DeviceStaging>, ShardError> {
    let n = weights.n_devices();
    check_distinct(platforms, n)?;
    for (index, c) in collectives.iter().enumerate() {
        if c.rank() != index || c.n_ranks() != n {
            return Err(ShardError::Ranks {
                index,
                rank: c.rank(),
                n_ranks: c.n_ranks(),
                planned: n,
            });
        }
    }
    if collectives.len() != n {
        return Err(ShardError::Ranks {
            index: collectives.len(),
            rank: collectives.len(),
            n_ranks: collectives.len(),
            planned: n,
        });
    }
    let readers = replicated_readers(weights);
    for (device, shards) in weights.devices.iter().enumerate() {
        if let Some(s) = shards
            .iter()
            .find(|s| readers.contains_key(&s.tensor) && s.weight.device_copy().is_some())
        {
            return Err(ShardError::AlreadyResident {
                weight: s.weight.name().to_owned(),
                device,
            });
        }
    }
    let all_read = std::sync::Barrier::new(n);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let results: Vec<Result<DeviceStaging, ShardError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|d| {
                let (shards, platform, collective) =
                    (&weights.devices[d], platforms[d], collectives[d]);
                let (readers, all_read, failed) = (&readers, &all_read, &failed);
                scope.spawn(move || {
                    stage_device_once(d, shards, platform, collective, readers, all_read, failed)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    // The first real failure, not a peer's echo of it.
    let mut staged = Vec::with_capacity(n);
    let mut echo = None;
    for result in results {
        match result {
            Ok(s) => staged.push(s),
            Err(e @ ShardError::PeerFailed { .. }) => {
                echo.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    match echo {
        Some(e) => Err(e),
        None => Ok(staged),
    }
}

/// Stages every device's shards through [`resident_weight`] on that
/// device's platform (`platforms[d]` for device `d`), one thread per device,
/// and returns what each device's counters gained. Shards already resident
/// are not staged again.
///
/// The counts are differences of each platform's cumulative counters, so
/// other staging on the same platforms at the same time is counted too.
///
/// # Errors
///
/// The platforms are not one distinct device per plan device, or a device
/// failed (the first failing device in order is reported; other devices'
/// shards may be resident).
pub fn stage_shards(
    weights: &ShardedWeights,
    platforms: &[&dyn Platform],
) -> Result<Vec<DeviceStaging>, ShardError> {
    check_distinct(platforms, weights.n_devices())?;
    let results: Vec<Result<DeviceStaging, ShardError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = weights
            .devices
            .iter()
            .zip(platforms)
            .enumerate()
            .map(|(d, (shards, &platform))| scope.spawn(move || stage_device(d, shards, platform)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    });
    results.into_iter().collect()
}
