//! The manifest: every tensor of a qwen4exp file named once, with its role,
//! the ggml types it may have, its dims (from the hyperparameters) and its
//! route; and the tensors the family drops on purpose, by name.
//!
//! One manifest serves both directions of the check ([`Manifest::check`]:
//! every tensor of the file is claimed or dropped by name, every claimed
//! tensor exists with the expected dims and type) and the load
//! ([`crate::Qwen4Exp::load`]). Tensor names and dims follow
//! docs/families/qwen4_exp.md, section 2.

use std::ops::Deref;

use family_kit::ManifestBuilder;
pub use family_kit::manifest::{
    Census, Dims, DroppedTensor, Handle, RoleCensus, Route, RouteCensus, TensorSpec, TypeClass,
};
use seam::gguf::{GgufModel, TensorInfo};
use serde::Serialize;

use crate::error::Error;
use crate::hparams::{ARCH, Hparams, LayerKind};

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
                        arch: ARCH,
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

/// Every tensor the family claims, and what it drops by name: the kit's
/// [`family_kit::Manifest`] (through `Deref`) with the qwen4exp specifics.
#[derive(Debug, Serialize)]
pub struct Manifest {
    /// The hyperparameters it was built from.
    pub hparams: Hparams,
    /// The alternatives the file uses.
    pub layout: Layout,
    /// The claimed tensors and the drop rules.
    #[serde(flatten)]
    pub table: family_kit::Manifest,
    /// Per layer, its expert stacks.
    pub experts: Vec<ExpertStacks>,
    /// The PLE table (`per_layer_token_embd.weight`), if the model has PLE.
    pub ple_table: Option<usize>,
}

impl Deref for Manifest {
    type Target = family_kit::Manifest;
    fn deref(&self) -> &family_kit::Manifest {
        &self.table
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
        let mut b = ManifestBuilder::new(ARCH, &[]);

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
                b.layer(
                    l,
                    &format!("{norm}.weight"),
                    norm,
                    Dims::Reshape(vec![e, hc]),
                    F32,
                );
                b.layer(
                    l,
                    &format!("{down}.weight"),
                    down,
                    exact(&[hc_dim, lr]),
                    Any,
                );
                b.layer(l, &format!("{up}.weight"), up, exact(&[lr, hc_dim]), Any);
                b.layer(
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
                    b.layer(l, "attn_qkv.weight", "attn_qkv", exact(&[e, conv_dim]), Any);
                    b.layer(
                        l,
                        "attn_gate.weight",
                        "attn_gate",
                        exact(&[e, value_dim]),
                        Any,
                    );
                    b.layer(
                        l,
                        "ssm_conv1d.weight",
                        "ssm_conv1d",
                        exact(&[s.conv_kernel, conv_dim]),
                        F32,
                    );
                    b.layer(l, "ssm_dt.bias", "ssm_dt_bias", exact(&[hv]), F32);
                    b.layer(l, "ssm_a", "ssm_a", exact(&[hv]), F32);
                    b.layer(l, "ssm_beta.weight", "ssm_beta", exact(&[e, hv]), Any);
                    b.layer(l, "ssm_alpha.weight", "ssm_alpha", exact(&[e, hv]), Any);
                    b.layer(
                        l,
                        "ssm_norm.weight",
                        "ssm_norm",
                        exact(&[s.state_size]),
                        F32,
                    );
                    b.layer(l, "ssm_out.weight", "ssm_out", exact(&[value_dim, e]), Any);
                }
                LayerKind::FullAttention => {
                    let hd = hp.head_dim;
                    let (nh, nkv) = (hp.n_head[l], hp.n_head_kv[l]);
                    let ix = &hp.indexer;
                    b.layer(l, "attn_q.weight", "attn_q", exact(&[e, 2 * hd * nh]), Any);
                    b.layer(l, "attn_k.weight", "attn_k", exact(&[e, hd * nkv]), Any);
                    b.layer(l, "attn_v.weight", "attn_v", exact(&[e, hd * nkv]), Any);
                    b.layer(
                        l,
                        "attn_output.weight",
                        "attn_output",
                        exact(&[hd * nh, e]),
                        Any,
                    );
                    b.layer(l, "attn_q_norm.weight", "attn_q_norm", exact(&[hd]), F32);
                    b.layer(l, "attn_k_norm.weight", "attn_k_norm", exact(&[hd]), F32);
                    b.layer(
                        l,
                        "indexer.q_proj.weight",
                        "indexer_q_proj",
                        exact(&[e, ix.n_head * ix.head_dim]),
                        Any,
                    );
                    b.layer(
                        l,
                        "indexer.k_proj.weight",
                        "indexer_k_proj",
                        exact(&[e, ix.head_dim]),
                        Any,
                    );
                    b.layer(
                        l,
                        "indexer.q_norm.weight",
                        "indexer_q_norm",
                        exact(&[ix.head_dim]),
                        F32,
                    );
                    b.layer(
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
                b.layer(l, "ple_key.weight", "ple_key", exact(&[e, hc_dim]), Any);
                b.layer(l, "ple_value.weight", "ple_value", exact(&[e, e]), Any);
                for norm in ["ple_norm_key", "ple_norm_query", "ple_norm_conv"] {
                    b.layer(
                        l,
                        &format!("{norm}.weight"),
                        norm,
                        Dims::Reshape(vec![e, hc]),
                        Float,
                    );
                }
                b.layer(
                    l,
                    "ple_conv1d.weight",
                    "ple_conv1d",
                    exact(&[ple.conv_kernel, hc_dim]),
                    Float,
                );
            }

            // MoE: router, expert stacks, shared expert.
            let (n_exp, ff, ff_sh) = (hp.n_expert, hp.n_ff_exp[l], hp.n_ff_shexp[l]);
            b.layer(
                l,
                "ffn_gate_inp.weight",
                "ffn_gate_inp",
                exact(&[e, n_exp]),
                Any,
            );
            let stack = |b: &mut ManifestBuilder, suffix: &str, role, dims: &[u64]| {
                b.stack(l, suffix, role, dims).0
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
            b.layer(
                l,
                "ffn_gate_inp_shexp.weight",
                "ffn_gate_inp_shexp",
                exact(&[e]),
                Any,
            );
            b.layer(
                l,
                "ffn_gate_shexp.weight",
                "ffn_gate_shexp",
                exact(&[e, ff_sh]),
                Any,
            );
            b.layer(
                l,
                "ffn_up_shexp.weight",
                "ffn_up_shexp",
                exact(&[e, ff_sh]),
                Any,
            );
            b.layer(
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
                .claimed()
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
            let layer = of.layer;
            b.tensor(
                scale.clone(),
                "scale",
                layer,
                exact(&[n]),
                F32,
                Route::Dense,
            );
        }

        // Dropped by name.
        let full: Vec<bool> = hp
            .layers
            .iter()
            .map(|&k| k == LayerKind::FullAttention)
            .collect();
        b.drop_when(
            "blk.{full-attention layer}.attn_{q,k,v}.bias",
            DROP_ATTN_BIAS,
            move |name| {
                block_of(name).is_some_and(|(layer, suffix)| {
                    usize::try_from(layer).is_ok_and(|l| full.get(l) == Some(&true))
                        && matches!(suffix, "attn_q.bias" | "attn_k.bias" | "attn_v.bias")
                })
            },
        );
        b.drop_when("*.input_scale", DROP_INPUT_SCALE, |name| {
            name.ends_with(".input_scale")
        });
        if hp.nextn_predict_layers > 0 {
            let (n_layer, block_count) = (hp.n_layer as u64, hp.block_count);
            let last = block_count - 1;
            let blocks = if n_layer == last {
                format!("blk.{last}.*")
            } else {
                format!("blk.{{{n_layer}..={last}}}.*")
            };
            b.drop_when(blocks, DROP_MTP, move |name| {
                block_of(name).is_some_and(|(l, _)| l >= n_layer && l < block_count)
            });
        }
        Manifest {
            hparams,
            layout,
            table: b.build(),
            experts,
            ple_table: ple_table.map(|h| h.0),
        }
    }

    /// The manifest of `model`: hyperparameters from its metadata, the
    /// alternatives from its tensor names. Does not check the tensors
    /// ([`family_kit::Manifest::check`] does).
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
}

/// `blk.{layer}.{suffix}` split, if `name` is a block's tensor.
fn block_of(name: &str) -> Option<(u64, &str)> {
    let (layer, suffix) = name.strip_prefix("blk.")?.split_once('.')?;
    Some((layer.parse().ok()?, suffix))
}
