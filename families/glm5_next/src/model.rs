//! The manifest (every tensor of a glm5-next file claimed or dropped by
//! name, docs/families/glm5_next.md section 2) and the loaded model: one
//! borrowed weight per claimed tensor, handed out by handle.
//!
//! The three routed expert banks of a MoE layer (`ffn_{gate,up,down}_exps`)
//! take the expert route: claimed as [`Route::ExpertStack`], flagged
//! `expert_streamed`, so `seam::resident_weight` refuses them whole; each
//! expert is a sub-span borrow staged when the router picks it.
//!
//! **The rule for marking a bank resident:** there is none, on purpose.
//! Every bank is an expert stack on every device; a bank asked of the seam
//! whole is refused by name (`SeamError::ExpertStreamed`), and a request to
//! load a bank resident ([`LoadOptions::resident_banks`]) is refused by the
//! load, naming the bank. Experts picked by the router are staged one at a
//! time, each once, and released once. The one exception is asked for by
//! name: the device path's `--stage all` stages each bank as its own
//! whole-stack weight (the kit's `LoadedWeights::whole_stack`, a separate
//! weight with its own memo; the bank itself stays streamed). The shared expert (`*_shexp`) and
//! the router are dense weights, resident by the ordinary route.

use family_kit::blocks::kpool::KpoolWeights;
use family_kit::blocks::mla::MlaWeights;
use family_kit::manifest::{Census, Dims, Handle, Route, TypeClass};
use family_kit::{ExpertPart, LoadError, LoadedWeights, Manifest, ManifestBuilder};
use seam::gguf::{GgufModel, TensorInfo};
use seam::weight::{Role, Weight};

use crate::hparams::{ARCH, Hparams, LayerKind};

/// Why MTP blocks are dropped.
pub const DROP_MTP: &str =
    "MTP (nextn) block past the main layers: llama.cpp skips it for text (TENSOR_SKIP)";
/// Why `.scale` / `.input_scale` tensors are dropped.
pub const DROP_SCALE: &str = "weight or input scale: loaded by llama.cpp's generic pass, never applied by the glm5-next graph";
/// Why KDA q/k/v biases are dropped.
pub const DROP_KDA_BIAS: &str =
    "KDA q/k/v bias: loaded by llama.cpp, never read (the short convs read the weights only)";
/// Why a shared-indexer layer's indexer tensors are dropped.
pub const DROP_SHARED_INDEXER: &str =
    "indexer of a shared-indexer layer: it reuses the previous full layer's selection";

/// mHC tensors of one half-layer.
#[derive(Clone, Copy, Debug)]
pub struct HcHandles {
    /// `{4E, 24}` mixer.
    pub fn_: Handle,
    /// `{24}`.
    pub base: Handle,
    /// `{3}`: pre, post, comb scales.
    pub scale: Handle,
}

/// A KDA layer's tensors.
#[derive(Clone, Copy, Debug)]
pub struct KdaHandles {
    /// q, k, v projections.
    pub qkv: [Handle; 3],
    /// q, k, v short-conv kernels.
    pub conv: [Handle; 3],
    /// Decay low-rank in / out.
    pub f_a: Handle,
    /// Decay low-rank out.
    pub f_b: Handle,
    /// Decay bias per channel.
    pub dt_bias: Handle,
    /// `-exp(A_log)` per head.
    pub a: Handle,
    /// beta projection.
    pub beta: Handle,
    /// Output gate low-rank in.
    pub g_a: Handle,
    /// Output gate low-rank out.
    pub g_b: Handle,
    /// Per-head output RMSNorm gamma.
    pub norm: Handle,
    /// Output projection.
    pub out: Handle,
}

/// An MLA layer's tensors: MLA without a rope part and, on a full layer,
/// the k-pool indexer (the kit's blocks' weights).
#[derive(Clone, Copy, Debug)]
pub struct MlaHandles {
    /// MLA's projections (no output scale).
    pub mla: MlaWeights,
    /// The indexer (`None`: a shared-indexer layer).
    pub indexer: Option<KpoolWeights>,
}

/// A layer's mixer.
#[derive(Clone, Copy, Debug)]
pub enum Mixer {
    /// KDA.
    Kda(KdaHandles),
    /// MLA with the pooled-key indexer.
    Mla(MlaHandles),
}

/// The three routed expert banks of a MoE layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Banks {
    /// `ffn_gate_exps`.
    pub gate: Handle,
    /// `ffn_up_exps`.
    pub up: Handle,
    /// `ffn_down_exps`.
    pub down: Handle,
}

impl Banks {
    /// The three banks with their expert roles.
    pub fn each(&self) -> [(Handle, &'static str); 3] {
        [
            (self.gate, "ffn_gate_exp"),
            (self.up, "ffn_up_exp"),
            (self.down, "ffn_down_exp"),
        ]
    }
}

/// A layer's FFN.
#[derive(Clone, Copy, Debug)]
pub enum Ffn {
    /// A leading dense SwiGLU FFN: gate, up, down.
    Dense([Handle; 3]),
    /// Sigmoid-routed experts plus the shared expert.
    Moe {
        /// Router.
        router: Handle,
        /// Selection bias.
        bias: Handle,
        /// The routed expert banks.
        banks: Banks,
        /// Shared expert gate, up, down.
        shared: [Handle; 3],
    },
}

/// One main layer's handles.
#[derive(Clone, Copy, Debug)]
pub struct LayerHandles {
    /// Pre-mixer RMSNorm gamma.
    pub attn_norm: Handle,
    /// Pre-FFN RMSNorm gamma.
    pub ffn_norm: Handle,
    /// mHC around the mixer.
    pub hc_attn: HcHandles,
    /// mHC around the FFN.
    pub hc_ffn: HcHandles,
    /// The mixer.
    pub mixer: Mixer,
    /// The FFN.
    pub ffn: Ffn,
}

/// Global handles.
#[derive(Clone, Debug)]
pub struct Handles {
    /// `token_embd`.
    pub token_embd: Handle,
    /// `output_norm`.
    pub output_norm: Handle,
    /// `output`.
    pub output: Handle,
    /// Per main layer.
    pub layers: Vec<LayerHandles>,
}

/// Dims from hyperparameters (products of header values saturate, so a
/// hostile header's overflow is a shape no tensor has, refused by name).
fn exact(d: &[usize]) -> Dims {
    Dims::Exact(d.iter().map(|&x| x as u64).collect())
}

/// The vocabulary size: `token_embd`'s rows.
fn n_vocab(hp: &Hparams, tensors: &[TensorInfo]) -> Result<usize, LoadError> {
    let t = tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .ok_or_else(|| LoadError::MissingTensor {
            arch: ARCH,
            name: "token_embd.weight".into(),
        })?;
    match t.dims.as_slice() {
        [e, n] if *e == hp.n_embd as u64 && *n > 0 => Ok(*n as usize),
        _ => Err(LoadError::WrongShape {
            name: t.name.clone(),
            expected: format!("[{}, n_vocab]", hp.n_embd),
            found: t.dims.clone(),
        }),
    }
}

/// Builds the manifest of a file with these hyperparameters.
///
/// # Errors
///
/// `token_embd.weight` is absent or not `[E, n_vocab]`.
pub fn manifest(
    hp: &Hparams,
    tensors: &[TensorInfo],
) -> Result<(Manifest, Handles, usize), LoadError> {
    use TypeClass::{Any, F32};
    let n_vocab = n_vocab(hp, tensors)?;
    let e = hp.n_embd;
    let mut b = ManifestBuilder::new(ARCH, tensors);
    let token_embd = b.global("token_embd", exact(&[e, n_vocab]), Any, Route::Dense);
    let output_norm = b.global("output_norm", exact(&[e]), F32, Route::Dense);
    let output = b.global("output", exact(&[e, n_vocab]), Any, Route::Dense);
    let mut layers = Vec::with_capacity(hp.n_layer);
    for l in 0..hp.n_layer {
        let attn_norm = b.layer(l, "attn_norm.weight", "attn_norm", exact(&[e]), F32);
        let ffn_norm = b.layer(l, "ffn_norm.weight", "ffn_norm", exact(&[e]), F32);
        let hc = |b: &mut ManifestBuilder, p: &str, roles: [&'static str; 3]| HcHandles {
            fn_: b.layer(
                l,
                &format!("{p}_fn.weight"),
                roles[0],
                exact(&[hp.hc.saturating_mul(e), 24]),
                Any,
            ),
            base: b.layer(l, &format!("{p}_base.weight"), roles[1], exact(&[24]), F32),
            scale: b.layer(l, &format!("{p}_scale.weight"), roles[2], exact(&[3]), F32),
        };
        let hc_attn = hc(
            &mut b,
            "hc_attn",
            ["hc_attn_fn", "hc_attn_base", "hc_attn_scale"],
        );
        let hc_ffn = hc(
            &mut b,
            "hc_ffn",
            ["hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale"],
        );
        let (h, s, di) = (hp.n_head, hp.kda_head_dim, hp.d_inner());
        let mixer = match hp.layers[l] {
            LayerKind::Kda => Mixer::Kda(KdaHandles {
                qkv: [
                    b.layer(l, "attn_q.weight", "kda_q", exact(&[e, di]), Any),
                    b.layer(l, "attn_k.weight", "kda_k", exact(&[e, di]), Any),
                    b.layer(l, "attn_v.weight", "kda_v", exact(&[e, di]), Any),
                ],
                conv: [
                    b.layer(
                        l,
                        "ssm_conv1d_q.weight",
                        "ssm_conv1d",
                        exact(&[hp.d_conv, 1, di]),
                        F32,
                    ),
                    b.layer(
                        l,
                        "ssm_conv1d_k.weight",
                        "ssm_conv1d",
                        exact(&[hp.d_conv, 1, di]),
                        F32,
                    ),
                    b.layer(
                        l,
                        "ssm_conv1d_v.weight",
                        "ssm_conv1d",
                        exact(&[hp.d_conv, 1, di]),
                        F32,
                    ),
                ],
                f_a: b.layer(l, "ssm_f_a.weight", "ssm_f_a", exact(&[e, s]), Any),
                f_b: b.layer(l, "ssm_f_b.weight", "ssm_f_b", exact(&[s, di]), Any),
                dt_bias: b.layer(l, "ssm_dt.bias", "ssm_dt", exact(&[di]), F32),
                a: b.layer(l, "ssm_a", "ssm_a", exact(&[h]), F32),
                beta: b.layer(l, "ssm_beta.weight", "ssm_beta", exact(&[e, h]), Any),
                g_a: b.layer(l, "ssm_g_a.weight", "ssm_g_a", exact(&[e, s]), Any),
                g_b: b.layer(l, "ssm_g_b.weight", "ssm_g_b", exact(&[s, di]), Any),
                norm: b.layer(l, "ssm_norm.weight", "ssm_norm", exact(&[s]), F32),
                out: b.layer(l, "attn_output.weight", "attn_output", exact(&[di, e]), Any),
            }),
            LayerKind::Mla => {
                let (q, lat) = (hp.q_lora, hp.kv_lora);
                let (ih, idim) = (hp.idx_heads, hp.idx_dim);
                let indexer = hp.idx_full[l].then(|| KpoolWeights {
                    q_b: b.layer(
                        l,
                        "indexer.attn_q_b.weight",
                        "indexer_q_b",
                        exact(&[q, ih.saturating_mul(idim)]),
                        Any,
                    ),
                    k: b.layer(
                        l,
                        "indexer.attn_k.weight",
                        "indexer_k",
                        exact(&[e, idim]),
                        Any,
                    ),
                    k_norm: b.layer(
                        l,
                        "indexer.k_norm.weight",
                        "indexer_k_norm",
                        exact(&[idim]),
                        F32,
                    ),
                    k_norm_b: b.layer(
                        l,
                        "indexer.k_norm.bias",
                        "indexer_k_norm",
                        exact(&[idim]),
                        F32,
                    ),
                    proj: b.layer(
                        l,
                        "indexer.proj.weight",
                        "indexer_proj",
                        exact(&[e, ih]),
                        Any,
                    ),
                    gate: b.layer(
                        l,
                        "indexer_compressor_gate.weight",
                        "indexer_kpool_gate",
                        exact(&[e, idim]),
                        Any,
                    ),
                    ape: b.layer(
                        l,
                        "indexer_compressor_ape.weight",
                        "indexer_kpool_ape",
                        exact(&[idim, hp.kpool]),
                        F32,
                    ),
                });
                let mla = MlaWeights {
                    q_a: b.layer(l, "attn_q_a.weight", "attn_q_a", exact(&[e, q]), Any),
                    q_a_norm: b.layer(l, "attn_q_a_norm.weight", "attn_q_a_norm", exact(&[q]), F32),
                    q_b: b.layer(
                        l,
                        "attn_q_b.weight",
                        "attn_q_b",
                        exact(&[q, h.saturating_mul(hp.dk)]),
                        Any,
                    ),
                    kv_a: b.layer(
                        l,
                        "attn_kv_a_mqa.weight",
                        "attn_kv_a_mqa",
                        exact(&[e, lat]),
                        Any,
                    ),
                    kv_a_norm: b.layer(
                        l,
                        "attn_kv_a_norm.weight",
                        "attn_kv_a_norm",
                        exact(&[lat]),
                        F32,
                    ),
                    k_b: b.layer(
                        l,
                        "attn_k_b.weight",
                        "attn_k_b",
                        exact(&[hp.dk, lat, h]),
                        Any,
                    ),
                    v_b: b.layer(
                        l,
                        "attn_v_b.weight",
                        "attn_v_b",
                        exact(&[lat, hp.dv, h]),
                        Any,
                    ),
                    out: b.layer(
                        l,
                        "attn_output.weight",
                        "attn_output",
                        exact(&[h.saturating_mul(hp.dv), e]),
                        Any,
                    ),
                    out_scale: None,
                };
                Mixer::Mla(MlaHandles { mla, indexer })
            }
        };
        let ffn = if hp.is_moe(l) {
            let (ff, ne) = (hp.n_ff_exp[l], hp.n_expert);
            let sh = ff.saturating_mul(hp.n_shared);
            Ffn::Moe {
                router: b.layer(
                    l,
                    "ffn_gate_inp.weight",
                    "ffn_gate_inp",
                    exact(&[e, ne]),
                    Any,
                ),
                bias: b.layer(l, "exp_probs_b.bias", "exp_probs_b", exact(&[ne]), F32),
                banks: Banks {
                    gate: b.stack(
                        l,
                        "ffn_gate_exps.weight",
                        "ffn_gate_exps",
                        &[e as u64, ff as u64, ne as u64],
                    ),
                    up: b.stack(
                        l,
                        "ffn_up_exps.weight",
                        "ffn_up_exps",
                        &[e as u64, ff as u64, ne as u64],
                    ),
                    down: b.stack(
                        l,
                        "ffn_down_exps.weight",
                        "ffn_down_exps",
                        &[ff as u64, e as u64, ne as u64],
                    ),
                },
                shared: [
                    b.layer(
                        l,
                        "ffn_gate_shexp.weight",
                        "ffn_gate_shexp",
                        exact(&[e, sh]),
                        Any,
                    ),
                    b.layer(
                        l,
                        "ffn_up_shexp.weight",
                        "ffn_up_shexp",
                        exact(&[e, sh]),
                        Any,
                    ),
                    b.layer(
                        l,
                        "ffn_down_shexp.weight",
                        "ffn_down_shexp",
                        exact(&[sh, e]),
                        Any,
                    ),
                ],
            }
        } else {
            Ffn::Dense([
                b.layer(l, "ffn_gate.weight", "ffn_gate", exact(&[e, hp.n_ff]), Any),
                b.layer(l, "ffn_up.weight", "ffn_up", exact(&[e, hp.n_ff]), Any),
                b.layer(l, "ffn_down.weight", "ffn_down", exact(&[hp.n_ff, e]), Any),
            ])
        };
        layers.push(LayerHandles {
            attn_norm,
            ffn_norm,
            hc_attn,
            hc_ffn,
            mixer,
            ffn,
        });
    }
    let n_layer = hp.n_layer;
    b.drop_when(format!("blk.{{{n_layer}..}}.*"), DROP_MTP, move |name| {
        layer_of(name).is_some_and(|l| l >= n_layer)
    });
    b.drop_when("*.scale, *.input_scale", DROP_SCALE, |name| {
        name.ends_with(".scale") || name.ends_with(".input_scale")
    });
    let kda: Vec<bool> = hp.layers.iter().map(|&k| k == LayerKind::Kda).collect();
    b.drop_when("blk.{KDA}.attn_{q,k,v}.bias", DROP_KDA_BIAS, move |name| {
        layer_of(name).is_some_and(|l| kda.get(l) == Some(&true))
            && ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
                .iter()
                .any(|s| name.ends_with(&format!(".{s}")))
    });
    let shared: Vec<bool> = (0..n_layer)
        .map(|l| hp.layers[l] == LayerKind::Mla && !hp.idx_full[l])
        .collect();
    b.drop_when(
        "blk.{shared indexer}.indexer*",
        DROP_SHARED_INDEXER,
        move |name| {
            layer_of(name).is_some_and(|l| shared.get(l) == Some(&true))
                && name
                    .split_once('.')
                    .and_then(|(_, rest)| rest.split_once('.'))
                    .is_some_and(|(_, t)| t.starts_with("indexer"))
        },
    );
    Ok((
        b.build(),
        Handles {
            token_embd,
            output_norm,
            output,
            layers,
        },
        n_vocab,
    ))
}

/// The layer in a `blk.N.` name.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// How a caller asks the load to treat the banks.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Banks (tensor names) the caller wants resident whole. Always
    /// refused, naming the first: the rule is that a routed expert bank is
    /// streamed one expert at a time on every device (see the module doc).
    pub resident_banks: Vec<String>,
}

/// A loaded glm5-next model: hyperparameters, manifest, weights.
#[derive(Debug)]
pub struct Glm5Next {
    hparams: Hparams,
    manifest: Manifest,
    handles: Handles,
    n_vocab: usize,
    weights: LoadedWeights,
    census: Census,
}

impl Glm5Next {
    /// Checks `model` against the manifest both ways and borrows every
    /// claimed tensor (nothing is read or staged).
    ///
    /// # Errors
    ///
    /// A key or tensor refused, naming it.
    pub fn load(model: &GgufModel) -> Result<Glm5Next, LoadError> {
        Glm5Next::load_with(model, &LoadOptions::default())
    }

    /// [`Glm5Next::load`] with options.
    ///
    /// # Errors
    ///
    /// As [`Glm5Next::load`]; a bank asked resident is refused by name.
    pub fn load_with(model: &GgufModel, options: &LoadOptions) -> Result<Glm5Next, LoadError> {
        let hparams = Hparams::from_header(model.header())?;
        let (manifest, handles, n_vocab) = manifest(&hparams, model.tensors())?;
        manifest.check(model.tensors())?;
        if let Some(name) = options.resident_banks.first() {
            let reason = match manifest.spec(name) {
                Some(s) if s.route == Route::ExpertStack => {
                    "a routed expert bank is never resident whole: each expert is a sub-span \
                     borrow staged when the router picks it (docs/families/glm5_next.md)"
                }
                _ => "not a routed expert bank of this file",
            };
            return Err(LoadError::RefusedTensor {
                name: name.clone(),
                reason: reason.into(),
            });
        }
        let census = manifest.census(model.tensors());
        let weights = LoadedWeights::load(&manifest, model)?;
        Ok(Glm5Next {
            hparams,
            manifest,
            handles,
            n_vocab,
            weights,
            census,
        })
    }

    /// The hyperparameters.
    pub fn hparams(&self) -> &Hparams {
        &self.hparams
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The handles.
    pub fn handles(&self) -> &Handles {
        &self.handles
    }

    /// The vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// The census of the file.
    pub fn census(&self) -> &Census {
        &self.census
    }

    /// The weights.
    pub fn weights(&self) -> &LoadedWeights {
        &self.weights
    }

    /// The weight of `h`.
    pub fn get(&self, h: Handle) -> &Weight {
        self.weights.get(h)
    }

    /// The k-pool indexer's sizes.
    pub fn kpool_shape(&self) -> family_kit::blocks::kpool::KpoolShape {
        let hp = &self.hparams;
        family_kit::blocks::kpool::KpoolShape {
            n_head: hp.idx_heads,
            head_dim: hp.idx_dim,
            kpool: hp.kpool,
            top_k: hp.top_k,
            key_norm_eps: hp.eps_ln,
        }
    }

    /// Expert `e` of the bank `bank` (role `role`): a sub-span borrow, made
    /// once.
    ///
    /// # Errors
    ///
    /// `bank` is not a bank, or `e` is out of range.
    pub fn expert(&self, bank: Handle, e: usize, role: &'static str) -> Result<&Weight, LoadError> {
        self.weights
            .expert(bank, e as u64, ExpertPart::whole(Role::new(role)))
    }

    /// Every bank of every MoE layer.
    pub fn banks(&self) -> Vec<Banks> {
        self.handles
            .layers
            .iter()
            .filter_map(|l| match l.ffn {
                Ffn::Moe { banks, .. } => Some(banks),
                Ffn::Dense(_) => None,
            })
            .collect()
    }
}
