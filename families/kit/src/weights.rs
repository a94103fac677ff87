//! A family's loaded weights: one borrowed [`Weight`] per claimed tensor of
//! its [`Manifest`], handed out by [`Handle`], flagged by route, and the
//! sub-span weights of expert stacks, made once on first use.
//!
//! - [`Route::Dense`] weights go whole through `seam::resident_weight`.
//! - [`Route::ExpertStack`] and [`Route::LazyTable`] weights are
//!   `expert_streamed`: the seam refuses to stage them whole. One expert of
//!   a stack is a sub-span borrow of its rows ([`LoadedWeights::expert`]),
//!   stageable, made once, so its device memo is shared by every step that
//!   picks it. A lazy table is read by row gathers
//!   ([`LoadedWeights::table_row`]).

use std::sync::OnceLock;

use seam::gguf::GgufModel;
use seam::weight::{HostBytes, Role, Weight, WeightFlags};

use crate::error::LoadError;
use crate::manifest::{Handle, Manifest, Route};

/// Which part of one expert's rows a sub-span weight holds: part `index` of
/// `of` equal slices (a merged gate-up stack holds gate then up: parts 0
/// and 1 of 2; a plain stack: part 0 of 1).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExpertPart {
    /// Which slice.
    pub index: u8,
    /// Of how many.
    pub of: u8,
    /// Appended to the sub-span weight's name (`.gate`), for reports.
    pub suffix: &'static str,
    /// The sub-span weight's role.
    pub role: Role,
}

impl ExpertPart {
    /// All of one expert's rows.
    pub fn whole(role: Role) -> ExpertPart {
        ExpertPart {
            index: 0,
            of: 1,
            suffix: "",
            role,
        }
    }
}

/// Most slices of one expert a family may ask for.
const MAX_PARTS: usize = 2;

/// One borrowed weight per claimed tensor, and the expert sub-spans.
pub struct LoadedWeights {
    weights: Vec<Weight>,
    /// Per stack handle, the first slot of its experts in `experts`.
    expert_base: Vec<Option<usize>>,
    experts: Vec<OnceLock<Box<Weight>>>,
    /// Per stack handle, the stack as one stageable weight
    /// ([`LoadedWeights::whole_stack`]), made on first use.
    whole: Vec<OnceLock<Box<Weight>>>,
}

impl std::fmt::Debug for LoadedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedWeights")
            .field("weights", &self.weights.len())
            .field("experts_made", &self.experts_made().count())
            .finish()
    }
}

impl LoadedWeights {
    /// One borrowed weight per tensor of `manifest` (checked against
    /// `model` already), flagged by route. No byte is read or copied; the
    /// weights keep the mapping alive.
    ///
    /// # Errors
    ///
    /// A claimed tensor is absent or its bytes are outside its file.
    pub fn load(manifest: &Manifest, model: &GgufModel) -> Result<LoadedWeights, LoadError> {
        let mut weights = Vec::with_capacity(manifest.tensors.len());
        let mut expert_base = Vec::with_capacity(manifest.tensors.len());
        let mut slots = 0usize;
        for spec in &manifest.tensors {
            let info = model
                .tensor(&spec.name)
                .ok_or_else(|| LoadError::MissingTensor {
                    arch: manifest.arch,
                    name: spec.name.clone(),
                })?;
            let borrow = model.tensor_borrow(info)?;
            let weight = Weight::borrowed(
                &spec.name,
                info.ggml_type,
                info.dims.clone(),
                spec.role.clone(),
                borrow,
            );
            let streamed = WeightFlags {
                expert_streamed: true,
            };
            weights.push(match spec.route {
                Route::Dense => weight,
                Route::ExpertStack | Route::LazyTable => weight.with_flags(streamed),
            });
            if spec.route == Route::ExpertStack {
                expert_base.push(Some(slots));
                let n_expert = info.dims.get(2).copied().unwrap_or(1) as usize;
                slots += n_expert * MAX_PARTS;
            } else {
                expert_base.push(None);
            }
        }
        Ok(LoadedWeights {
            whole: weights.iter().map(|_| OnceLock::new()).collect(),
            weights,
            expert_base,
            experts: (0..slots).map(|_| OnceLock::new()).collect(),
        })
    }

    /// The weight of `handle`.
    ///
    /// # Panics
    ///
    /// `handle` is not of this manifest.
    pub fn get(&self, handle: Handle) -> &Weight {
        &self.weights[handle.0]
    }

    /// Every claimed weight, in manifest order.
    pub fn all(&self) -> &[Weight] {
        &self.weights
    }

    /// The dense weights (neither stacks nor tables), in manifest order.
    pub fn dense(&self) -> impl Iterator<Item = &Weight> {
        self.weights.iter().filter(|w| !w.flags().expert_streamed)
    }

    /// Expert `expert`'s `part` of the stack `stack`: a weight whose bytes
    /// are a sub-span borrow of those rows (no copy), stageable through
    /// `resident_weight`; made once and kept.
    ///
    /// # Errors
    ///
    /// `stack` is not an expert stack, the expert is out of range, or the
    /// part does not divide the expert's rows.
    pub fn expert(
        &self,
        stack: Handle,
        expert: u64,
        part: ExpertPart,
    ) -> Result<&Weight, LoadError> {
        let w = &self.weights[stack.0];
        let Some(base) = self.expert_base[stack.0] else {
            return Err(LoadError::Forward(format!(
                "{} is not an expert stack",
                w.name()
            )));
        };
        let dims = w.dims();
        let (ne0, rows, n_expert) = (dims[0], dims[1], dims.get(2).copied().unwrap_or(1));
        if expert >= n_expert {
            return Err(LoadError::NoSuchExpert {
                layer: layer_of(w.name()),
                expert,
                n_expert,
            });
        }
        if part.of == 0
            || part.index >= part.of
            || usize::from(part.of) > MAX_PARTS
            || rows % u64::from(part.of) != 0
        {
            return Err(LoadError::Forward(format!(
                "{}: part {} of {} does not divide {rows} rows",
                w.name(),
                part.index,
                part.of
            )));
        }
        let slot = base + expert as usize * MAX_PARTS + usize::from(part.index);
        if let Some(made) = self.experts[slot].get() {
            return Ok(made);
        }
        let HostBytes::Borrow(borrow) = w.host() else {
            return Err(LoadError::Forward(format!("{} is not borrowed", w.name())));
        };
        let row_bytes = row_bytes(w)?;
        let part_rows = rows / u64::from(part.of);
        let start = (expert * rows + u64::from(part.index) * part_rows) * row_bytes;
        let sub = borrow
            .sub_span(start, part_rows * row_bytes)
            .map_err(|source| LoadError::Borrow {
                name: w.name().to_owned(),
                source,
            })?;
        let made = Weight::borrowed(
            format!("{}[{expert}]{}", w.name(), part.suffix),
            w.ggml_type(),
            vec![ne0, part_rows],
            part.role.clone(),
            sub,
        );
        // A racing thread may have filled the slot: keep the first.
        Ok(self.experts[slot].get_or_init(|| Box::new(made)))
    }

    /// The expert stack `stack` as ONE stageable weight: a borrow of the
    /// whole stack's bytes (no copy) under the stack's name, role and
    /// dims, without `expert_streamed`, made once. For a decoder that
    /// stages every stack whole before the first token (`--stage all`), so
    /// an expert product picks its experts by device-side ids; the
    /// streamed stack and its per-expert sub-spans are separate weights
    /// with their own memos.
    ///
    /// # Errors
    ///
    /// `stack` is not an expert stack, or not borrowed.
    pub fn whole_stack(&self, stack: Handle) -> Result<&Weight, LoadError> {
        let w = &self.weights[stack.0];
        if self.expert_base[stack.0].is_none() {
            return Err(LoadError::Forward(format!(
                "{} is not an expert stack",
                w.name()
            )));
        }
        if let Some(made) = self.whole[stack.0].get() {
            return Ok(made);
        }
        let HostBytes::Borrow(borrow) = w.host() else {
            return Err(LoadError::Forward(format!("{} is not borrowed", w.name())));
        };
        let all = borrow
            .sub_span(0, borrow.len())
            .map_err(|source| LoadError::Borrow {
                name: w.name().to_owned(),
                source,
            })?;
        let made = Weight::borrowed(
            w.name(),
            w.ggml_type(),
            w.dims().to_vec(),
            w.role().clone(),
            all,
        );
        Ok(self.whole[stack.0].get_or_init(|| Box::new(made)))
    }

    /// The whole-stack weights made so far ([`LoadedWeights::whole_stack`]).
    pub fn whole_stacks_made(&self) -> impl Iterator<Item = &Weight> {
        self.whole.iter().filter_map(|s| s.get().map(|b| &**b))
    }

    /// The expert weights made so far (each once).
    pub fn experts_made(&self) -> impl Iterator<Item = &Weight> {
        self.experts.iter().filter_map(|s| s.get().map(|b| &**b))
    }

    /// The bytes of row `row` of the lazy table (or any borrowed weight)
    /// `table`, read from its borrow: a row gather, the table never staged.
    ///
    /// # Errors
    ///
    /// The row is out of range, or the weight is not borrowed.
    pub fn table_row(&self, table: Handle, row: u64) -> Result<&[u8], LoadError> {
        let w = &self.weights[table.0];
        let HostBytes::Borrow(borrow) = w.host() else {
            return Err(LoadError::Forward(format!("{} is not borrowed", w.name())));
        };
        let rows: u64 = w.dims().iter().skip(1).product();
        if row >= rows {
            return Err(LoadError::RowOutOfRange {
                name: w.name().to_owned(),
                row,
                rows,
            });
        }
        let rb = row_bytes(w)?;
        let start = (row * rb) as usize;
        Ok(&borrow.bytes()[start..start + rb as usize])
    }

    /// Weights with a device copy: claimed weights, experts and whole
    /// stacks made.
    pub fn staged(&self) -> usize {
        self.weights
            .iter()
            .chain(self.experts_made())
            .chain(self.whole_stacks_made())
            .filter(|w| w.device_copy().is_some())
            .count()
    }

    /// Stacks and tables (`expert_streamed` weights) with a device copy:
    /// always 0, since the seam refuses to stage them whole (a stack staged
    /// whole for `--stage all` is its [`LoadedWeights::whole_stack`], a
    /// weight of its own).
    pub fn whole_stacks_staged(&self) -> usize {
        self.weights
            .iter()
            .filter(|w| w.flags().expert_streamed && w.device_copy().is_some())
            .count()
    }
}

/// Bytes of one row (`dims[0]` elements) of `w`.
pub(crate) fn row_bytes(w: &Weight) -> Result<u64, LoadError> {
    w.ggml_type()
        .row_bytes(w.dims()[0])
        .ok_or_else(|| LoadError::Read {
            name: w.name().to_owned(),
            reason: format!(
                "a row of {} is not whole {} blocks",
                w.dims()[0],
                w.ggml_type()
            ),
        })
}

/// The layer in a `blk.N.` name (0 for globals), for errors.
fn layer_of(name: &str) -> usize {
    name.strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Stages `weights` through `seam::resident_weight` now, `workers` at a
/// time, each worker on a queue of its own (so one's synchronize does not
/// wait for another's copies) taking the next weight not yet taken: what a
/// decoder that stages everything before its first token runs. Each
/// weight is staged once (the seam's memo), released as the seam's rules
/// say; the kernels that read them later order after the copies because
/// the seam synchronizes each copy before it hands the weight out.
///
/// # Errors
///
/// The first weight the seam failed to stage (the others may be staged);
/// a queue could not be made.
pub fn stage_in_parallel(
    weights: &[&Weight],
    platform: &dyn seam::platform::Platform,
    workers: usize,
) -> Result<(), LoadError> {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let first_error: Mutex<Option<LoadError>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..workers.clamp(1, weights.len().max(1)) {
            scope.spawn(|| {
                let staged = (|| -> Result<(), LoadError> {
                    let queue = platform
                        .backend()
                        .create_queue()
                        .map_err(|e| LoadError::Forward(format!("a staging queue: {e}")))?;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(w) = weights.get(i) else {
                            return Ok(());
                        };
                        seam::resident_weight(w, platform, &*queue)
                            .map_err(|e| LoadError::Forward(format!("{}: {e}", w.name())))?;
                    }
                })();
                if let Err(e) = staged {
                    // Stop the others at their next weight.
                    next.store(weights.len(), Ordering::Relaxed);
                    first_error
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
