//! The manifest: every tensor of a qwen4exp file named once, with its role,
//! the ggml types it may have, its dims (from the hyperparameters) and its
//! route; and the tensors the family drops on purpose, by name.
//!
//! One manifest serves both directions of the check ([`Manifest::check`]:
//! every tensor of the file is claimed or dropped by name, every claimed
//! tensor exists with the expected dims and type) and the load
//! ([`crate::Qwen4Exp::load`]). Tensor names and dims follow
//! docs/families/qwen4_exp.md, section 2.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use seam::gguf::{GgmlType, GgufModel, TensorInfo};
use seam::weight::Role;
use serde::Serialize;

use crate::error::Error;
use crate::hparams::{Hparams, LayerKind};

/// How a weight reaches the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Route {
    /// Staged whole through `seam::resident_weight`, once, on first use.
    Dense,
    /// A stack of experts kept as it is in the file (quantized): one
    /// expert's rows are a sub-span borrow staged when the router picks it;
    /// the stack is never staged whole (`expert_streamed`).
    ExpertStack,
    /// A table read by row gathers from its borrow; never staged whole
    /// (`expert_streamed`).
    LazyTable,
}

impl Route {
    /// The name in reports (`dense`, `expert_stack`, `lazy_table`).
    pub fn name(self) -> &'static str {
        match self {
            Route::Dense => "dense",
            Route::ExpertStack => "expert_stack",
            Route::LazyTable => "lazy_table",
        }
    }
}

/// The ggml types a tensor may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TypeClass {
    /// Any type (matrices: quantized or float).
    Any,
    /// F32 only: RMSNorm gammas named `*_norm.weight` (llama.cpp's
    /// converter and quantizer keep them F32), 1-D biases and `ssm_a`, and
    /// `ssm_conv1d` (ggml_ssm_conv asserts F32).
    F32,
    /// A float type (F32, F16, BF16): tables ggml multiplies elementwise
    /// or casts to F32, whose names escape the quantizer's `_norm.weight`
    /// rule (`ple_norm_*`, `ple_conv1d`).
    Float,
}

impl TypeClass {
    /// Whether `ty` is allowed.
    pub fn allows(self, ty: GgmlType) -> bool {
        match self {
            TypeClass::Any => true,
            TypeClass::F32 => ty == GgmlType::F32,
            TypeClass::Float => matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16),
        }
    }
}

impl fmt::Display for TypeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TypeClass::Any => "any ggml type",
            TypeClass::F32 => "F32",
            TypeClass::Float => "a float type (F32, F16 or BF16)",
        })
    }
}

/// The dims a tensor must have (GGUF order, ne0 first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dims {
    /// Exactly these (trailing 1s are equivalent to absent dims).
    Exact(Vec<u64>),
    /// Any dims with as many elements as these (llama.cpp allows the
    /// reshape: `{E, hc}` may be stored as `{E * hc}`).
    Reshape(Vec<u64>),
    /// `{ne0, rows}` with at least `min_rows` rows (the PLE table).
    RowsAtLeast {
        /// The row width.
        ne0: u64,
        /// The fewest rows.
        min_rows: u64,
    },
}

fn trimmed(dims: &[u64]) -> &[u64] {
    let n = dims.iter().rposition(|&d| d != 1).map_or(0, |i| i + 1);
    &dims[..n]
}

impl Dims {
    /// Whether `found` satisfies the rule.
    pub fn matches(&self, found: &[u64]) -> bool {
        match self {
            Dims::Exact(d) => trimmed(d) == trimmed(found),
            Dims::Reshape(d) => {
                let want: Option<u64> = d.iter().try_fold(1u64, |a, &x| a.checked_mul(x));
                let have: Option<u64> = found.iter().try_fold(1u64, |a, &x| a.checked_mul(x));
                want.is_some() && want == have
            }
            Dims::RowsAtLeast { ne0, min_rows } => {
                matches!(trimmed(found), [n0, rows] if n0 == ne0 && rows >= min_rows)
                    || (*min_rows <= 1 && trimmed(found) == [*ne0])
            }
        }
    }

    /// The canonical dims (for a reshape rule, the documented ones; for a
    /// row rule, the fewest rows).
    pub fn canonical(&self) -> Vec<u64> {
        match self {
            Dims::Exact(d) | Dims::Reshape(d) => d.clone(),
            Dims::RowsAtLeast { ne0, min_rows } => vec![*ne0, *min_rows],
        }
    }
}

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dims::Exact(d) => write!(f, "{d:?}"),
            Dims::Reshape(d) => write!(
                f,
                "{d:?} (or any dims of {} elements)",
                d.iter().product::<u64>()
            ),
            Dims::RowsAtLeast { ne0, min_rows } => {
                write!(f, "[{ne0}, rows] with rows >= {min_rows}")
            }
        }
    }
}

/// One tensor the family claims.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TensorSpec {
    /// The GGUF name.
    pub name: String,
    /// What it is for.
    #[serde(serialize_with = "role_name")]
    pub role: Role,
    /// Its layer (`None` for globals).
    pub layer: Option<usize>,
    /// The dims it must have.
    pub dims: Dims,
    /// The types it may have.
    pub types: TypeClass,
    /// How it reaches the device.
    pub route: Route,
}

fn role_name<S: serde::Serializer>(role: &Role, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(role.as_str())
}

/// A tensor of the file dropped on purpose.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DroppedTensor {
    /// Its name.
    pub name: String,
    /// Why the family drops it.
    pub reason: &'static str,
    /// Its bytes.
    pub bytes: u64,
}

/// Why MTP blocks are dropped.
pub const DROP_MTP: &str =
    "MTP (nextn) block past the decoder's layers: the forward pass does not run it";
/// Why the attention biases are dropped.
pub const DROP_ATTN_BIAS: &str =
    "attention bias: llama.cpp loads it but the qwen4exp graph never reads it";

/// Why activation input scales are dropped.
pub const DROP_INPUT_SCALE: &str =
    "activation input scale: llama.cpp loads it but the qwen4exp graph never reads it";

/// Which of the documented alternatives the file uses (decided from its
/// tensor names, so the manifest claims exactly one of each).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// The vocabulary size (metadata, else `token_embd`'s rows).
    pub n_vocab: u64,
    /// No `output.weight`: the output reuses `token_embd` (tied).
    pub tied_output: bool,
    /// Per layer: one `ffn_gate_up_exps` stack instead of gate and up.
    pub merged_gate_up: Vec<bool>,
    /// The optional `X.scale` tensors the file has (sorted): each multiplies
    /// the output of the matrix `X.weight` (one value, or one per expert).
    pub scales: Vec<String>,
}

impl Layout {
    /// Reads the alternatives from the file's tensor names.
    ///
    /// # Errors
    ///
    /// The vocabulary size is neither in the metadata nor readable from
    /// `token_embd.weight` (absent or not 2-D).
    pub fn from_tensors(hparams: &Hparams, tensors: &[TensorInfo]) -> Result<Layout, Error> {
        let has = |name: &str| tensors.iter().any(|t| t.name == name);
        let n_vocab = match hparams.n_vocab {
            Some(n) => n,
            None => {
                let t = tensors
                    .iter()
                    .find(|t| t.name == "token_embd.weight")
                    .ok_or_else(|| Error::MissingTensor {
                        name: "token_embd.weight".into(),
                    })?;
                match t.dims.as_slice() {
                    [e, n] if *e == hparams.n_embd => *n,
                    _ => {
                        return Err(Error::WrongShape {
                            name: t.name.clone(),
                            expected: format!("[{}, n_vocab]", hparams.n_embd),
                            found: t.dims.clone(),
                        });
                    }
                }
            }
        };
        Ok(Layout {
            n_vocab,
            tied_output: !has("output.weight"),
            merged_gate_up: (0..hparams.n_layer)
                .map(|l| has(&format!("blk.{l}.ffn_gate_up_exps.weight")))
                .collect(),
            scales: {
                let mut s: Vec<String> = tensors
                    .iter()
                    .filter(|t| t.name.ends_with(".scale"))
                    .map(|t| t.name.clone())
                    .collect();
                s.sort();
                s
            },
        })
    }
}

/// The expert stacks of one layer: indices into [`Manifest::tensors`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ExpertStacks {
    /// `ffn_gate_exps`, or the merged `ffn_gate_up_exps` (gate = the first
    /// n_ff_exp rows of each expert).
    pub gate: usize,
    /// `ffn_up_exps`, or the merged stack (up = the next n_ff_exp rows).
    pub up: usize,
    /// `ffn_down_exps`.
    pub down: usize,
    /// Whether gate and up are one merged stack.
    pub merged: bool,
}

/// Every tensor the family claims, and what it drops by name.
#[derive(Clone, Debug, Serialize)]
pub struct Manifest {
    /// The hyperparameters it was built from.
    pub hparams: Hparams,
    /// The alternatives the file uses.
    pub layout: Layout,
    /// The claimed tensors, each named once.
    pub tensors: Vec<TensorSpec>,
    /// Per layer, its expert stacks.
    pub experts: Vec<ExpertStacks>,
    /// The PLE table (`per_layer_token_embd.weight`), if the model has PLE.
    pub ple_table: Option<usize>,
    #[serde(skip)]
    index: HashMap<String, usize>,
}

struct Builder {
    tensors: Vec<TensorSpec>,
}

impl Builder {
    fn add(
        &mut self,
        name: String,
        role: &'static str,
        layer: Option<usize>,
        dims: Dims,
        types: TypeClass,
        route: Route,
    ) -> usize {
        self.tensors.push(TensorSpec {
            name,
            role: Role::new(role),
            layer,
            dims,
            types,
            route,
        });
        self.tensors.len() - 1
    }

    fn global(&mut self, role: &'static str, dims: Dims, types: TypeClass, route: Route) -> usize {
        self.add(format!("{role}.weight"), role, None, dims, types, route)
    }

    /// `blk.{layer}.{suffix}` with role `role`, routed dense.
    fn dense(
        &mut self,
        layer: usize,
        suffix: &str,
        role: &'static str,
        dims: Dims,
        types: TypeClass,
    ) -> usize {
        self.add(
            format!("blk.{layer}.{suffix}"),
            role,
            Some(layer),
            dims,
            types,
            Route::Dense,
        )
    }
}

fn exact(d: &[u64]) -> Dims {
    Dims::Exact(d.to_vec())
}

impl Manifest {
    /// The manifest of a model with these hyperparameters and layout.
    pub fn new(hparams: Hparams, layout: Layout) -> Manifest {
        use TypeClass::{Any, F32, Float};
        let hp = &hparams;
        let e = hp.n_embd;
        let (hc, hc_dim, lr) = (hp.hc, hp.hc_dim(), hp.hc_low_rank);
        let mut b = Builder {
            tensors: Vec::new(),
        };

        // Globals.
        b.global("token_embd", exact(&[e, layout.n_vocab]), Any, Route::Dense);
        if !layout.tied_output {
            b.global("output", exact(&[e, layout.n_vocab]), Any, Route::Dense);
        }
        b.global(
            "output_hc_norm",
            Dims::Reshape(vec![e, hc]),
            F32,
            Route::Dense,
        );
        b.global("output_hc_down", exact(&[hc_dim, lr]), Any, Route::Dense);
        b.global("output_hc_up", exact(&[lr, hc_dim]), Any, Route::Dense);
        let ple_table = hp.ple.as_ref().map(|ple| {
            b.global(
                "per_layer_token_embd",
                Dims::RowsAtLeast {
                    ne0: ple.head_dim,
                    min_rows: ple.min_rows(),
                },
                Any,
                Route::LazyTable,
            )
        });

        let mut experts = Vec::with_capacity(hp.n_layer);
        for l in 0..hp.n_layer {
            // Hyper-connections, twice per layer.
            for (norm, down, up, inject) in [
                (
                    "hc_attn_norm",
                    "hc_attn_down",
                    "hc_attn_up",
                    "hc_attn_inject",
                ),
                ("hc_ffn_norm", "hc_ffn_down", "hc_ffn_up", "hc_ffn_inject"),
            ] {
                b.dense(
                    l,
                    &format!("{norm}.weight"),
                    norm,
                    Dims::Reshape(vec![e, hc]),
                    F32,
                );
                b.dense(
                    l,
                    &format!("{down}.weight"),
                    down,
                    exact(&[hc_dim, lr]),
                    Any,
                );
                b.dense(l, &format!("{up}.weight"), up, exact(&[lr, hc_dim]), Any);
                b.dense(
                    l,
                    &format!("{inject}.weight"),
                    inject,
                    exact(&[hc_dim, hc]),
                    Any,
                );
            }

            // The mixer.
            match hp.layers[l] {
                LayerKind::Gdn => {
                    let s = &hp.ssm;
                    let (hv, conv_dim, value_dim) = (s.n_v_heads, s.conv_dim(), s.value_dim());
                    b.dense(l, "attn_qkv.weight", "attn_qkv", exact(&[e, conv_dim]), Any);
                    b.dense(
                        l,
                        "attn_gate.weight",
                        "attn_gate",
                        exact(&[e, value_dim]),
                        Any,
                    );
                    b.dense(
                        l,
                        "ssm_conv1d.weight",
                        "ssm_conv1d",
                        exact(&[s.conv_kernel, conv_dim]),
                        F32,
                    );
                    b.dense(l, "ssm_dt.bias", "ssm_dt_bias", exact(&[hv]), F32);
                    b.dense(l, "ssm_a", "ssm_a", exact(&[hv]), F32);
                    b.dense(l, "ssm_beta.weight", "ssm_beta", exact(&[e, hv]), Any);
                    b.dense(l, "ssm_alpha.weight", "ssm_alpha", exact(&[e, hv]), Any);
                    b.dense(
                        l,
                        "ssm_norm.weight",
                        "ssm_norm",
                        exact(&[s.state_size]),
                        F32,
                    );
                    b.dense(l, "ssm_out.weight", "ssm_out", exact(&[value_dim, e]), Any);
                }
                LayerKind::FullAttention => {
                    let hd = hp.head_dim;
                    let (nh, nkv) = (hp.n_head[l], hp.n_head_kv[l]);
                    let ix = &hp.indexer;
                    b.dense(l, "attn_q.weight", "attn_q", exact(&[e, 2 * hd * nh]), Any);
                    b.dense(l, "attn_k.weight", "attn_k", exact(&[e, hd * nkv]), Any);
                    b.dense(l, "attn_v.weight", "attn_v", exact(&[e, hd * nkv]), Any);
                    b.dense(
                        l,
                        "attn_output.weight",
                        "attn_output",
                        exact(&[hd * nh, e]),
                        Any,
                    );
                    b.dense(l, "attn_q_norm.weight", "attn_q_norm", exact(&[hd]), F32);
                    b.dense(l, "attn_k_norm.weight", "attn_k_norm", exact(&[hd]), F32);
                    b.dense(
                        l,
                        "indexer.q_proj.weight",
                        "indexer_q_proj",
                        exact(&[e, ix.n_head * ix.head_dim]),
                        Any,
                    );
                    b.dense(
                        l,
                        "indexer.k_proj.weight",
                        "indexer_k_proj",
                        exact(&[e, ix.head_dim]),
                        Any,
                    );
                    b.dense(
                        l,
                        "indexer.q_norm.weight",
                        "indexer_q_norm",
                        exact(&[ix.head_dim]),
                        F32,
                    );
                    b.dense(
                        l,
                        "indexer.k_norm.weight",
                        "indexer_k_norm",
                        exact(&[ix.head_dim]),
                        F32,
                    );
                }
            }

            // PLE mixing weights on its layer.
            if let Some(ple) = hp.ple.as_ref().filter(|p| p.layer == l) {
                b.dense(l, "ple_key.weight", "ple_key", exact(&[e, hc_dim]), Any);
                b.dense(l, "ple_value.weight", "ple_value", exact(&[e, e]), Any);
                for norm in ["ple_norm_key", "ple_norm_query", "ple_norm_conv"] {
                    b.dense(
                        l,
                        &format!("{norm}.weight"),
                        norm,
                        Dims::Reshape(vec![e, hc]),
                        Float,
                    );
                }
                b.dense(
                    l,
                    "ple_conv1d.weight",
                    "ple_conv1d",
                    exact(&[ple.conv_kernel, hc_dim]),
                    Float,
                );
            }

            // MoE: router, expert stacks, shared expert.
            let (n_exp, ff, ff_sh) = (hp.n_expert, hp.n_ff_exp[l], hp.n_ff_shexp[l]);
            b.dense(
                l,
                "ffn_gate_inp.weight",
                "ffn_gate_inp",
                exact(&[e, n_exp]),
                Any,
            );
            let stack = |b: &mut Builder, suffix: &str, role, dims: &[u64]| {
                b.add(
                    format!("blk.{l}.{suffix}"),
                    role,
                    Some(l),
                    exact(dims),
                    Any,
                    Route::ExpertStack,
                )
            };
            let merged = layout.merged_gate_up.get(l).copied().unwrap_or(false);
            let (gate, up) = if merged {
                let i = stack(
                    &mut b,
                    "ffn_gate_up_exps.weight",
                    "ffn_gate_up_exps",
                    &[e, 2 * ff, n_exp],
                );
                (i, i)
            } else {
                (
                    stack(
                        &mut b,
                        "ffn_gate_exps.weight",
                        "ffn_gate_exps",
                        &[e, ff, n_exp],
                    ),
                    stack(&mut b, "ffn_up_exps.weight", "ffn_up_exps", &[e, ff, n_exp]),
                )
            };
            let down = stack(
                &mut b,
                "ffn_down_exps.weight",
                "ffn_down_exps",
                &[ff, e, n_exp],
            );
            experts.push(ExpertStacks {
                gate,
                up,
                down,
                merged,
            });
            b.dense(
                l,
                "ffn_gate_inp_shexp.weight",
                "ffn_gate_inp_shexp",
                exact(&[e]),
                Any,
            );
            b.dense(
                l,
                "ffn_gate_shexp.weight",
                "ffn_gate_shexp",
                exact(&[e, ff_sh]),
                Any,
            );
            b.dense(
                l,
                "ffn_up_shexp.weight",
                "ffn_up_shexp",
                exact(&[e, ff_sh]),
                Any,
            );
            b.dense(
                l,
                "ffn_down_shexp.weight",
                "ffn_down_shexp",
                exact(&[ff_sh, e]),
                Any,
            );
        }

        // Optional output scales of claimed matrices: one value, or one per
        // expert for a stack. A scale of a matrix the family does not claim
        // stays unclaimed (and is refused as an extra tensor).
        for scale in &layout.scales {
            let Some(base) = scale.strip_suffix(".scale") else {
                continue;
            };
            let Some(of) = b
                .tensors
                .iter()
                .find(|t| t.name == format!("{base}.weight"))
            else {
                continue;
            };
            let n = if of.route == Route::ExpertStack {
                hp.n_expert
            } else {
                1
            };
            let spec = TensorSpec {
                name: scale.clone(),
                role: Role::new("scale"),
                layer: of.layer,
                dims: exact(&[n]),
                types: F32,
                route: Route::Dense,
            };
            b.tensors.push(spec);
        }

        let index = b
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Manifest {
            hparams,
            layout,
            tensors: b.tensors,
            experts,
            ple_table,
            index,
        }
    }

    /// The manifest of `model`: hyperparameters from its metadata, the
    /// alternatives from its tensor names. Does not check the tensors
    /// ([`Manifest::check`] does).
    ///
    /// # Errors
    ///
    /// The metadata is refused ([`Hparams::from_header`]) or the vocabulary
    /// size cannot be found.
    pub fn for_model(model: &GgufModel) -> Result<Manifest, Error> {
        let hparams = Hparams::from_header(model.header())?;
        let layout = Layout::from_tensors(&hparams, model.tensors())?;
        Ok(Manifest::new(hparams, layout))
    }

    /// The claimed tensor named `name`.
    pub fn spec(&self, name: &str) -> Option<&TensorSpec> {
        self.position(name).map(|i| &self.tensors[i])
    }

    /// The index in [`Manifest::tensors`] of the claimed tensor `name`.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// Why the family drops the tensor `name` on purpose, or `None` when it
    /// does not.
    pub fn drop_reason(&self, name: &str) -> Option<&'static str> {
        if name.ends_with(".input_scale") {
            return Some(DROP_INPUT_SCALE);
        }
        let rest = name.strip_prefix("blk.")?;
        let (layer, suffix) = rest.split_once('.')?;
        let layer: u64 = layer.parse().ok()?;
        let hp = &self.hparams;
        if layer >= hp.n_layer as u64 {
            return (layer < hp.block_count).then_some(DROP_MTP);
        }
        let full = hp.layers[layer as usize] == LayerKind::FullAttention;
        (full && matches!(suffix, "attn_q.bias" | "attn_k.bias" | "attn_v.bias"))
            .then_some(DROP_ATTN_BIAS)
    }

    /// The rules by which tensors are dropped, for reports.
    pub fn drop_rules(&self) -> Vec<String> {
        let hp = &self.hparams;
        let mut rules = vec![
            format!("blk.{{full-attention layer}}.attn_{{q,k,v}}.bias: {DROP_ATTN_BIAS}"),
            format!("*.input_scale: {DROP_INPUT_SCALE}"),
        ];
        if hp.nextn_predict_layers > 0 {
            let last = hp.block_count - 1;
            let blocks = if hp.n_layer as u64 == last {
                format!("blk.{last}.*")
            } else {
                format!("blk.{{{}..={last}}}.*", hp.n_layer)
            };
            rules.push(format!("{blocks}: {DROP_MTP}"));
        }
        rules
    }

    /// Checks the file's tensor table against the manifest, both ways:
    /// every tensor of the file is claimed (with the expected dims and an
    /// allowed type) or dropped by name, and every claimed tensor exists.
    /// Returns the dropped tensors.
    ///
    /// # Errors
    ///
    /// The first mismatch, naming the tensor: extra, wrong shape or wrong
    /// type (in file order), else missing (in manifest order).
    pub fn check(&self, tensors: &[TensorInfo]) -> Result<Vec<DroppedTensor>, Error> {
        let mut dropped = Vec::new();
        let mut seen = vec![false; self.tensors.len()];
        for t in tensors {
            let Some(&i) = self.index.get(&t.name) else {
                match self.drop_reason(&t.name) {
                    Some(reason) => dropped.push(DroppedTensor {
                        name: t.name.clone(),
                        reason,
                        bytes: t.n_bytes,
                    }),
                    None => {
                        return Err(Error::ExtraTensor {
                            name: t.name.clone(),
                        });
                    }
                }
                continue;
            };
            let spec = &self.tensors[i];
            seen[i] = true;
            if !spec.dims.matches(&t.dims) {
                return Err(Error::WrongShape {
                    name: t.name.clone(),
                    expected: spec.dims.to_string(),
                    found: t.dims.clone(),
                });
            }
            if !spec.types.allows(t.ggml_type) {
                return Err(Error::WrongType {
                    name: t.name.clone(),
                    expected: spec.types,
                    found: t.ggml_type,
                });
            }
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(Error::MissingTensor {
                name: self.tensors[i].name.clone(),
            });
        }
        Ok(dropped)
    }

    /// Counts, bytes and route per role of the claimed tensors in
    /// `tensors`, and what was dropped.
    pub fn census(&self, tensors: &[TensorInfo]) -> Census {
        let mut census = Census::default();
        for t in tensors {
            census.file_tensors += 1;
            census.file_bytes += t.n_bytes;
            let Some(spec) = self.spec(&t.name) else {
                if let Some(reason) = self.drop_reason(&t.name) {
                    census.dropped.push(DroppedTensor {
                        name: t.name.clone(),
                        reason,
                        bytes: t.n_bytes,
                    });
                }
                continue;
            };
            let role = census
                .roles
                .entry(spec.role.as_str().to_owned())
                .or_insert_with(|| RoleCensus {
                    route: spec.route,
                    count: 0,
                    bytes: 0,
                    types: BTreeMap::new(),
                });
            role.count += 1;
            role.bytes += t.n_bytes;
            *role.types.entry(t.ggml_type.name().to_owned()).or_default() += 1;
            let route = census
                .routes
                .entry(spec.route.name().to_owned())
                .or_default();
            route.count += 1;
            route.bytes += t.n_bytes;
            census.claimed_tensors += 1;
            census.claimed_bytes += t.n_bytes;
        }
        census
    }
}

/// One role in the census.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoleCensus {
    /// How its tensors reach the device.
    pub route: Route,
    /// Tensors.
    pub count: usize,
    /// Bytes in the file.
    pub bytes: u64,
    /// Tensors per ggml type.
    pub types: BTreeMap<String, usize>,
}

/// Tensors and bytes of one route.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RouteCensus {
    /// Tensors.
    pub count: usize,
    /// Bytes in the file.
    pub bytes: u64,
}

/// What the file holds, per role and route.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Census {
    /// Per role (`attn_qkv`, `ffn_down_exps`, ...).
    pub roles: BTreeMap<String, RoleCensus>,
    /// Per route (`dense`, `expert_stack`, `lazy_table`).
    pub routes: BTreeMap<String, RouteCensus>,
    /// Claimed tensors.
    pub claimed_tensors: usize,
    /// Their bytes.
    pub claimed_bytes: u64,
    /// Tensors dropped by name.
    pub dropped: Vec<DroppedTensor>,
    /// Every tensor of the file.
    pub file_tensors: usize,
    /// The bytes of every tensor of the file.
    pub file_bytes: u64,
}
