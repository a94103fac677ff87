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

use family_kit::{ExpertPart, LoadedWeights, TargetTables};
use seam::gguf::GgufModel;
use seam::platform::{Platform, Queue};
use seam::weight::{Role, Weight};
use seam::{Resident, resident_weight};

use crate::error::Error;
use crate::hparams::{Hparams, LayerKind};
use crate::manifest::{Census, DroppedTensor, Handle, Manifest};

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
    /// One per [`Manifest::tensors`], by handle; experts made on first use.
    weights: LoadedWeights,
    dropped: Vec<DroppedTensor>,
    census: Census,
}

impl std::fmt::Debug for Qwen4Exp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen4Exp")
            .field("n_layer", &self.manifest.hparams.n_layer)
            .field("weights", &self.weights)
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
        let weights = LoadedWeights::load(&manifest, model)?;
        Ok(Qwen4Exp {
            manifest,
            weights,
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
        self.weights.all()
    }

    /// The weight of `handle`.
    ///
    /// # Panics
    ///
    /// `handle` is not of this model's manifest.
    pub fn get(&self, handle: Handle) -> &Weight {
        self.weights.get(handle)
    }

    /// The claimed weight named `name`.
    pub fn weight(&self, name: &str) -> Option<&Weight> {
        self.manifest.handle(name).map(|h| self.weights.get(h))
    }

    /// The dense weights, in manifest order.
    pub fn dense_weights(&self) -> impl Iterator<Item = &Weight> {
        self.weights.dense()
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
        Ok(self.weights.get(Handle(match kind {
            ExpertKind::Gate => s.gate,
            ExpertKind::Up => s.up,
            ExpertKind::Down => s.down,
        })))
    }

    /// The stack holding `kind` of layer `layer` as one stageable weight
    /// (`family_kit::LoadedWeights::whole_stack`: the whole stack's bytes,
    /// no copy, made once), for a decoder that stages every stack before
    /// the first token and picks experts on the device. Gate and up of a
    /// merged stack are the same weight.
    ///
    /// # Errors
    ///
    /// No such layer.
    pub fn whole_expert_stack(&self, layer: usize, kind: ExpertKind) -> Result<&Weight, Error> {
        self.check_layer(layer)?;
        let s = &self.manifest.experts[layer];
        self.weights.whole_stack(Handle(match kind {
            ExpertKind::Gate => s.gate,
            ExpertKind::Up => s.up,
            ExpertKind::Down => s.down,
        }))
    }

    /// Whether layer `layer`'s gate and up experts are one merged stack
    /// (`ffn_gate_up_exps`: per expert, its gate rows then its up rows).
    ///
    /// # Errors
    ///
    /// No such layer.
    pub fn merged_gate_up(&self, layer: usize) -> Result<bool, Error> {
        self.check_layer(layer)?;
        Ok(self.manifest.experts[layer].merged)
    }

    /// The whole-stack weights made so far
    /// ([`Qwen4Exp::whole_expert_stack`]).
    pub fn whole_stacks_made(&self) -> impl Iterator<Item = &Weight> {
        self.weights.whole_stacks_made()
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
        let s = self.manifest.experts[layer];
        let (stack, part) = match (s.merged, kind) {
            (true, ExpertKind::Gate) => (
                s.gate,
                ExpertPart {
                    index: 0,
                    of: 2,
                    suffix: ".gate",
                    role: kind.role(),
                },
            ),
            (true, ExpertKind::Up) => (
                s.up,
                ExpertPart {
                    index: 1,
                    of: 2,
                    suffix: ".up",
                    role: kind.role(),
                },
            ),
            (_, ExpertKind::Gate) => (s.gate, ExpertPart::whole(kind.role())),
            (_, ExpertKind::Up) => (s.up, ExpertPart::whole(kind.role())),
            (_, ExpertKind::Down) => (s.down, ExpertPart::whole(kind.role())),
        };
        self.weights
            .expert(Handle(stack), expert, part)
            .map_err(|e| match e {
                Error::NoSuchExpert {
                    expert, n_expert, ..
                } => Error::NoSuchExpert {
                    layer,
                    expert,
                    n_expert,
                },
                e => e,
            })
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
        self.weights.experts_made()
    }

    /// The PLE table weight (`per_layer_token_embd.weight`).
    ///
    /// # Errors
    ///
    /// The model has no PLE.
    pub fn ple_table(&self) -> Result<&Weight, Error> {
        self.manifest
            .ple_table
            .map(|i| self.weights.get(Handle(i)))
            .ok_or(NO_PLE)
    }

    /// The bytes of row `row` of the PLE table, read from its borrow (a row
    /// gather: the table is never staged whole). `row` is a hashed row
    /// index `mixed % voc[h] + off[h]` (docs/families/qwen4_exp.md, 8.1).
    ///
    /// # Errors
    ///
    /// The model has no PLE, or the row is out of range.
    pub fn ple_row(&self, row: u64) -> Result<&[u8], Error> {
        let table = self.manifest.ple_table.ok_or(NO_PLE)?;
        self.weights.table_row(Handle(table), row)
    }

    /// Weights with a device copy: the dense weights and experts staged so
    /// far.
    pub fn staged_weights(&self) -> usize {
        self.weights.staged()
    }

    /// Stacks and tables (`expert_streamed` weights) with a device copy:
    /// always 0, since the seam refuses to stage them whole.
    pub fn whole_stacks_staged(&self) -> usize {
        self.weights.whole_stacks_staged()
    }
}

/// The refusal of a PLE read on a model without PLE.
const NO_PLE: Error = Error::Absent {
    what: "per-layer embedding (qwen4exp.ple.layers is absent or empty)",
};

/// A draft (dflash) borrows the embedding table and the output head.
impl TargetTables for Qwen4Exp {
    fn token_embd(&self) -> Option<&Weight> {
        self.weight("token_embd.weight")
    }
    fn output_head(&self) -> Option<&Weight> {
        self.weight("output.weight")
            .or_else(|| self.weight("token_embd.weight"))
    }
    fn n_embd(&self) -> usize {
        self.hparams().n_embd as usize
    }
    fn n_vocab(&self) -> usize {
        self.manifest().layout.n_vocab as usize
    }
    fn n_layer(&self) -> usize {
        self.hparams().n_layer
    }
}
