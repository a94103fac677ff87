//! The loaded model: one borrowed [`Weight`] per claimed tensor, staged the
//! way its route says.
//!
//! - Dense weights go whole through [`seam::resident_weight`]
//!   ([`Qwen4Exp::stage_dense`] is what a forward step does per weight).
//! - Expert stacks stay as they are in the file. One expert is a sub-span
//!   borrow of its rows ([`Qwen4Exp::expert`]), made once and cached, and
//!   staged through `resident_weight` when the router picks it. The stack
//!   weight itself is `expert_streamed`, so the seam refuses to stage it.
//! - The PLE table is read by row gathers from its borrow
//!   ([`Qwen4Exp::ple_row`]); it too is `expert_streamed`.

use std::sync::OnceLock;

use seam::gguf::GgufModel;
use seam::platform::{Platform, Queue};
use seam::weight::{HostBytes, Role, Weight, WeightFlags};
use seam::{Resident, resident_weight};

use crate::error::Error;
use crate::hparams::{Hparams, LayerKind};
use crate::manifest::{Census, DroppedTensor, Manifest, Route};

/// Which matrix of an expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpertKind {
    /// The gate projection (`ffn_gate_exps`).
    Gate,
    /// The up projection (`ffn_up_exps`).
    Up,
    /// The down projection (`ffn_down_exps`).
    Down,
}

impl ExpertKind {
    /// All three, in cache order.
    pub const ALL: [ExpertKind; 3] = [ExpertKind::Gate, ExpertKind::Up, ExpertKind::Down];

    fn index(self) -> usize {
        match self {
            ExpertKind::Gate => 0,
            ExpertKind::Up => 1,
            ExpertKind::Down => 2,
        }
    }

    fn role(self) -> Role {
        Role::new(match self {
            ExpertKind::Gate => "ffn_gate_exps",
            ExpertKind::Up => "ffn_up_exps",
            ExpertKind::Down => "ffn_down_exps",
        })
    }
}

/// A qwen4exp model whose weights borrow its mapped file.
pub struct Qwen4Exp {
    manifest: Manifest,
    /// One per [`Manifest::tensors`], same order.
    weights: Vec<Weight>,
    /// Indices of the dense weights.
    dense: Vec<usize>,
    /// One expert's weight, made on first use: `[layer][kind][expert]`.
    experts: Vec<OnceLock<Box<Weight>>>,
    dropped: Vec<DroppedTensor>,
    census: Census,
}

impl std::fmt::Debug for Qwen4Exp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen4Exp")
            .field("n_layer", &self.manifest.hparams.n_layer)
            .field("weights", &self.weights.len())
            .field("dense", &self.dense.len())
            .field("dropped", &self.dropped.len())
            .finish()
    }
}

impl Qwen4Exp {
    /// Builds the manifest from `model`'s metadata, checks the tensor table
    /// against it both ways, and makes one borrowed weight per claimed
    /// tensor (no byte is read or copied). The weights keep the mapping
    /// alive; `model` may be dropped afterwards.
    ///
    /// # Errors
    ///
    /// The metadata or a tensor is refused (naming the key or tensor), or a
    /// tensor's bytes are outside its file.
    pub fn load(model: &GgufModel) -> Result<Qwen4Exp, Error> {
        let manifest = Manifest::for_model(model)?;
        let dropped = manifest.check(model.tensors())?;
        let census = manifest.census(model.tensors());
        let mut weights = Vec::with_capacity(manifest.tensors.len());
        let mut dense = Vec::new();
        for (i, spec) in manifest.tensors.iter().enumerate() {
            let info = model
                .tensor(&spec.name)
                .ok_or_else(|| Error::MissingTensor {
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
            let weight = match spec.route {
                Route::Dense => {
                    dense.push(i);
                    weight
                }
                Route::ExpertStack | Route::LazyTable => weight.with_flags(WeightFlags {
                    expert_streamed: true,
                }),
            };
            weights.push(weight);
        }
        let hp = &manifest.hparams;
        let slots = hp.n_layer * ExpertKind::ALL.len() * hp.n_expert as usize;
        let experts = (0..slots).map(|_| OnceLock::new()).collect();
        Ok(Qwen4Exp {
            manifest,
            weights,
            dense,
            experts,
            dropped,
            census,
        })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The hyperparameters.
    pub fn hparams(&self) -> &Hparams {
        &self.manifest.hparams
    }

    /// Counts, bytes and routes per role.
    pub fn census(&self) -> &Census {
        &self.census
    }

    /// The tensors of the file dropped by name.
    pub fn dropped(&self) -> &[DroppedTensor] {
        &self.dropped
    }

    /// Every claimed weight, in manifest order (stacks and the PLE table
    /// included: those are `expert_streamed`).
    pub fn weights(&self) -> &[Weight] {
        &self.weights
    }

    /// The claimed weight named `name`.
    pub fn weight(&self, name: &str) -> Option<&Weight> {
        self.manifest.position(name).map(|i| &self.weights[i])
    }

    /// The dense weights, in manifest order.
    pub fn dense_weights(&self) -> impl Iterator<Item = &Weight> {
        self.dense.iter().map(|&i| &self.weights[i])
    }

    /// What layer `layer`'s mixer is.
    ///
    /// # Errors
    ///
    /// No such layer.
    pub fn layer_kind(&self, layer: usize) -> Result<LayerKind, Error> {
        self.check_layer(layer)?;
        Ok(self.manifest.hparams.layers[layer])
    }

    fn check_layer(&self, layer: usize) -> Result<(), Error> {
        let n_layer = self.manifest.hparams.n_layer;
        if layer < n_layer {
            Ok(())
        } else {
            Err(Error::NoSuchLayer { layer, n_layer })
        }
    }

    /// Makes every dense weight resident on `platform` through
    /// [`seam::resident_weight`], as a forward step does per weight: the
    /// first call stages (and releases the host pages per the seam's
    /// rules), later calls hit the memo. Returns how many weights it asked
    /// for.
    ///
    /// # Errors
    ///
    /// The seam failed to stage a weight.
    pub fn stage_dense(&self, platform: &dyn Platform, queue: &dyn Queue) -> Result<usize, Error> {
        let mut n = 0;
        for w in self.dense_weights() {
            resident_weight(w, platform, queue)?;
            n += 1;
        }
        Ok(n)
    }

    /// The stack weight holding `kind` of layer `layer` (the merged
    /// `ffn_gate_up_exps` for gate and up where the file merges them).
    ///
    /// # Errors
    ///
    /// No such layer.
    pub fn expert_stack(&self, layer: usize, kind: ExpertKind) -> Result<&Weight, Error> {
        self.check_layer(layer)?;
        let s = &self.manifest.experts[layer];
        Ok(&self.weights[match kind {
            ExpertKind::Gate => s.gate,
            ExpertKind::Up => s.up,
            ExpertKind::Down => s.down,
        }])
    }

    /// One expert's `kind` matrix of layer `layer`: a weight whose bytes are
    /// a sub-span borrow of that expert's rows in its stack (no copy),
    /// stageable through `resident_weight`. Made once and cached, so its
    /// device memo is shared by every step that picks the expert.
    ///
    /// Dims are the stack's first two (for the merged gate-up stack, n_ff_exp
    /// rows: gate is the first half of the expert's rows, up the second).
    ///
    /// # Errors
    ///
    /// No such layer or expert.
    pub fn expert(&self, layer: usize, kind: ExpertKind, expert: u64) -> Result<&Weight, Error> {
        self.check_layer(layer)?;
        let hp = &self.manifest.hparams;
        if expert >= hp.n_expert {
            return Err(Error::NoSuchExpert {
                layer,
                expert,
                n_expert: hp.n_expert,
            });
        }
        let slot =
            (layer * ExpertKind::ALL.len() + kind.index()) * hp.n_expert as usize + expert as usize;
        if let Some(w) = self.experts[slot].get() {
            return Ok(w);
        }
        let made = self.make_expert(layer, kind, expert)?;
        // A racing thread may have filled the slot: keep the first.
        Ok(self.experts[slot].get_or_init(|| Box::new(made)))
    }

    fn make_expert(&self, layer: usize, kind: ExpertKind, expert: u64) -> Result<Weight, Error> {
        let stacks = self.manifest.experts[layer];
        let stack = self.expert_stack(layer, kind)?;
        let HostBytes::Borrow(borrow) = stack.host() else {
            unreachable!("stack weights are made borrowed in load");
        };
        let dims = stack.dims();
        // Checked against the manifest: [ne0, rows, n_expert].
        let (ne0, rows) = (dims[0], dims[1]);
        let row_bytes = stack
            .ggml_type()
            .row_bytes(ne0)
            .expect("the GGUF reader checked whole blocks");
        let expert_bytes = row_bytes * rows;
        let (start, len, out_rows, suffix) = match (stacks.merged, kind) {
            (true, ExpertKind::Gate) => {
                (expert * expert_bytes, expert_bytes / 2, rows / 2, ".gate")
            }
            (true, ExpertKind::Up) => (
                expert * expert_bytes + expert_bytes / 2,
                expert_bytes / 2,
                rows / 2,
                ".up",
            ),
            _ => (expert * expert_bytes, expert_bytes, rows, ""),
        };
        let sub = borrow
            .sub_span(start, len)
            .map_err(|source| Error::Borrow {
                name: stack.name().to_owned(),
                source,
            })?;
        Ok(Weight::borrowed(
            format!("{}[{expert}]{suffix}", stack.name()),
            stack.ggml_type(),
            vec![ne0, out_rows],
            kind.role(),
            sub,
        ))
    }

    /// Stages one expert's `kind` matrix through `resident_weight` (the
    /// memoized copy from the second pick on).
    ///
    /// # Errors
    ///
    /// No such layer or expert, or the seam failed.
    pub fn stage_expert<'a>(
        &'a self,
        layer: usize,
        kind: ExpertKind,
        expert: u64,
        platform: &dyn Platform,
        queue: &dyn Queue,
    ) -> Result<Resident<'a>, Error> {
        let w = self.expert(layer, kind, expert)?;
        Ok(resident_weight(w, platform, queue)?)
    }

    /// The expert weights made so far (each once).
    pub fn experts_made(&self) -> impl Iterator<Item = &Weight> {
        self.experts.iter().filter_map(|s| s.get().map(|b| &**b))
    }

    /// The PLE table weight (`per_layer_token_embd.weight`).
    ///
    /// # Errors
    ///
    /// The model has no PLE.
    pub fn ple_table(&self) -> Result<&Weight, Error> {
        self.manifest
            .ple_table
            .map(|i| &self.weights[i])
            .ok_or(Error::NoPle)
    }

    /// The bytes of row `row` of the PLE table, read from its borrow (a row
    /// gather: the table is never staged whole). `row` is a hashed row
    /// index `mixed % voc[h] + off[h]` (docs/families/qwen4_exp.md, 8.1).
    ///
    /// # Errors
    ///
    /// The model has no PLE, or the row is out of range.
    pub fn ple_row(&self, row: u64) -> Result<&[u8], Error> {
        let table = self.ple_table()?;
        let HostBytes::Borrow(borrow) = table.host() else {
            unreachable!("the PLE table is made borrowed in load");
        };
        let dims = table.dims();
        let rows = dims.get(1).copied().unwrap_or(1);
        if row >= rows {
            return Err(Error::PleRowOutOfRange { row, rows });
        }
        let row_bytes = table
            .ggml_type()
            .row_bytes(dims[0])
            .expect("the GGUF reader checked whole blocks");
        let start = (row * row_bytes) as usize;
        Ok(&borrow.bytes()[start..start + row_bytes as usize])
    }

    /// Weights with a device copy: the dense weights and experts staged so
    /// far.
    pub fn staged_weights(&self) -> usize {
        self.weights
            .iter()
            .chain(self.experts_made())
            .filter(|w| w.device_copy().is_some())
            .count()
    }

    /// Stacks and tables (`expert_streamed` weights) with a device copy:
    /// always 0, since the seam refuses to stage them whole.
    pub fn whole_stacks_staged(&self) -> usize {
        self.weights
            .iter()
            .filter(|w| w.flags().expert_streamed && w.device_copy().is_some())
            .count()
    }
}
