//! The manifest (every tensor of a glm-dsa file claimed or dropped by name,
//! docs/families/glm_moe_dsa.md section 9b) and the loaded model: one
//! borrowed weight per claimed tensor, handed out by handle.
//!
//! The routed expert stacks of a MoE layer (`ffn_{gate,up,down}_exps`)
//! take the expert route ([`Route::ExpertStack`]): `seam::resident_weight`
//! refuses them whole; each expert is a sub-span borrow staged when the
//! router picks it. Dropped by name: the MTP block (`blk.N.*`, N >=
//! n_layer, `nextn.*` included), the shared layers' copies of the indexer
//! (the public file carries the indexer on every block) and `.input_scale`.

use family_kit::blocks::indexer::IndexerShape;
use family_kit::blocks::mla::MlaWeights;
use family_kit::manifest::{Census, Dims, Handle, Route, TypeClass};
use family_kit::{ExpertPart, LoadError, LoadedWeights, Manifest, ManifestBuilder};
use family_ops::RopeMode;
use family_ops::ggml_cpu::GgmlRope;
use seam::gguf::{GgufModel, TensorInfo};
use seam::weight::{Role, Weight};

use crate::hparams::{ARCH, Hparams};

/// Why the MTP block is dropped.
pub const DROP_MTP: &str =
    "MTP (nextn) block past the trunk layers: only llama.cpp's MTP draft graph reads it";
/// Why `.input_scale` tensors are dropped.
pub const DROP_INPUT_SCALE: &str = "input scale: loaded by llama.cpp, never applied";
/// Why a shared layer's indexer tensors are dropped.
pub const DROP_SHARED_INDEXER: &str = "indexer copy on a shared layer: the layer reuses the last full layer's selection and never reads it";

/// The lightning indexer of a full layer (the kit's block's weights).
pub use family_kit::blocks::indexer::IndexerWeights as IndexerHandles;

/// A trunk layer's attention: MLA and, on a full layer, the indexer.
#[derive(Clone, Copy, Debug)]
pub struct AttnHandles {
    /// MLA's weights (the kit's block's).
    pub mla: MlaWeights,
    /// The indexer (`None`: a shared layer).
    pub indexer: Option<IndexerHandles>,
}

/// A SwiGLU FFN's three matrices and their optional scales (the kit's
/// block's weights).
pub use family_kit::blocks::moe::SwigluWeights as Swiglu;

/// A layer's FFN.
#[derive(Clone, Copy, Debug)]
pub enum Ffn {
    /// A leading dense FFN.
    Dense(Swiglu),
    /// Sigmoid-routed experts plus the shared expert.
    Moe {
        /// Router.
        router: Handle,
        /// Selection bias (`exp_probs_b`), if present.
        bias: Option<Handle>,
        /// Expert stacks gate, up, down.
        stacks: [Handle; 3],
        /// Their per-expert `.scale` tensors, if present.
        stack_scales: [Option<Handle>; 3],
        /// The shared expert.
        shared: Swiglu,
    },
}

/// One trunk layer's handles.
#[derive(Clone, Copy, Debug)]
pub struct LayerHandles {
    /// Pre-attention RMSNorm gamma.
    pub attn_norm: Handle,
    /// Pre-FFN RMSNorm gamma.
    pub ffn_norm: Handle,
    /// The attention.
    pub attn: AttnHandles,
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
    /// `output` (`token_embd` when the file has none: tied).
    pub output: Handle,
    /// Per trunk layer.
    pub layers: Vec<LayerHandles>,
}

/// The expert roles of the three stacks.
pub const EXPERT_ROLES: [&str; 3] = ["ffn_gate_exp", "ffn_up_exp", "ffn_down_exp"];

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

/// The layer in a `blk.N.` name.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Claims `blk.{l}.{stem}.scale` of `dims` if the file has it.
fn scale(b: &mut ManifestBuilder, l: usize, stem: &str, dims: &[usize]) -> Option<Handle> {
    b.optional(
        format!("blk.{l}.{stem}.scale"),
        "weight_scale",
        Some(l),
        exact(dims),
        TypeClass::F32,
        Route::Dense,
    )
}

fn swiglu(b: &mut ManifestBuilder, l: usize, sfx: &str, e: usize, ff: usize) -> Swiglu {
    use TypeClass::Any;
    let roles: [&'static str; 3] = if sfx.is_empty() {
        ["ffn_gate", "ffn_up", "ffn_down"]
    } else {
        ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"]
    };
    let w = [
        b.layer(
            l,
            &format!("ffn_gate{sfx}.weight"),
            roles[0],
            exact(&[e, ff]),
            Any,
        ),
        b.layer(
            l,
            &format!("ffn_up{sfx}.weight"),
            roles[1],
            exact(&[e, ff]),
            Any,
        ),
        b.layer(
            l,
            &format!("ffn_down{sfx}.weight"),
            roles[2],
            exact(&[ff, e]),
            Any,
        ),
    ];
    let scale = [
        scale(b, l, &format!("ffn_gate{sfx}"), &[1]),
        scale(b, l, &format!("ffn_up{sfx}"), &[1]),
        scale(b, l, &format!("ffn_down{sfx}"), &[1]),
    ];
    Swiglu { w, scale }
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
    let output = b
        .optional(
            "output.weight",
            "output",
            None,
            exact(&[e, n_vocab]),
            Any,
            Route::Dense,
        )
        .unwrap_or(token_embd);
    let (h, dk, dv, dn, r) = (hp.n_head, hp.dk, hp.dv, hp.dn(), hp.n_rot);
    let (q, lat, ih, idim) = (hp.q_lora, hp.kv_lora, hp.idx_heads, hp.idx_dim);
    let mut layers = Vec::with_capacity(hp.n_layer);
    for l in 0..hp.n_layer {
        let attn_norm = b.layer(l, "attn_norm.weight", "attn_norm", exact(&[e]), F32);
        let ffn_norm = b.layer(l, "ffn_norm.weight", "ffn_norm", exact(&[e]), F32);
        let indexer = hp.idx_full[l].then(|| {
            let ln = |b: &mut ManifestBuilder, sfx: &str| {
                b.optional(
                    format!("blk.{l}.indexer.k_norm.{sfx}"),
                    "indexer_k_norm",
                    Some(l),
                    exact(&[idim]),
                    F32,
                    Route::Dense,
                )
            };
            IndexerHandles {
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
                k_norm: ln(&mut b, "weight"),
                k_norm_b: ln(&mut b, "bias"),
                proj: b.layer(
                    l,
                    "indexer.proj.weight",
                    "indexer_proj",
                    exact(&[e, ih]),
                    Any,
                ),
            }
        });
        let mla = MlaWeights {
            q_a: b.layer(l, "attn_q_a.weight", "attn_q_a", exact(&[e, q]), Any),
            q_a_norm: b.layer(l, "attn_q_a_norm.weight", "attn_q_a_norm", exact(&[q]), F32),
            q_b: b.layer(
                l,
                "attn_q_b.weight",
                "attn_q_b",
                exact(&[q, h.saturating_mul(dk)]),
                Any,
            ),
            kv_a: b.layer(
                l,
                "attn_kv_a_mqa.weight",
                "attn_kv_a_mqa",
                exact(&[e, lat.saturating_add(r)]),
                Any,
            ),
            kv_a_norm: b.layer(
                l,
                "attn_kv_a_norm.weight",
                "attn_kv_a_norm",
                exact(&[lat]),
                F32,
            ),
            k_b: b.layer(l, "attn_k_b.weight", "attn_k_b", exact(&[dn, lat, h]), Any),
            v_b: b.layer(l, "attn_v_b.weight", "attn_v_b", exact(&[lat, dv, h]), Any),
            out: b.layer(
                l,
                "attn_output.weight",
                "attn_output",
                exact(&[h.saturating_mul(dv), e]),
                Any,
            ),
            out_scale: scale(&mut b, l, "attn_output", &[1]),
        };
        let attn = AttnHandles { mla, indexer };
        let ffn = if hp.is_moe(l) {
            let (ff, ne) = (hp.n_ff_exp[l], hp.n_expert);
            let router = b.layer(
                l,
                "ffn_gate_inp.weight",
                "ffn_gate_inp",
                exact(&[e, ne]),
                Any,
            );
            let bias = b.optional(
                format!("blk.{l}.exp_probs_b.bias"),
                "exp_probs_b",
                Some(l),
                exact(&[ne]),
                F32,
                Route::Dense,
            );
            let (e64, ff64, ne64) = (e as u64, ff as u64, ne as u64);
            let stacks = [
                b.stack(
                    l,
                    "ffn_gate_exps.weight",
                    "ffn_gate_exps",
                    &[e64, ff64, ne64],
                ),
                b.stack(l, "ffn_up_exps.weight", "ffn_up_exps", &[e64, ff64, ne64]),
                b.stack(
                    l,
                    "ffn_down_exps.weight",
                    "ffn_down_exps",
                    &[ff64, e64, ne64],
                ),
            ];
            let stack_scales = [
                scale(&mut b, l, "ffn_gate_exps", &[ne]),
                scale(&mut b, l, "ffn_up_exps", &[ne]),
                scale(&mut b, l, "ffn_down_exps", &[ne]),
            ];
            let shared = swiglu(&mut b, l, "_shexp", e, ff.saturating_mul(hp.n_shared));
            Ffn::Moe {
                router,
                bias,
                stacks,
                stack_scales,
                shared,
            }
        } else {
            Ffn::Dense(swiglu(&mut b, l, "", e, hp.n_ff))
        };
        layers.push(LayerHandles {
            attn_norm,
            ffn_norm,
            attn,
            ffn,
        });
    }
    let n_layer = hp.n_layer;
    b.drop_when(format!("blk.{{{n_layer}..}}.*"), DROP_MTP, move |name| {
        layer_of(name).is_some_and(|l| l >= n_layer)
    });
    b.drop_when("*.input_scale", DROP_INPUT_SCALE, |name| {
        name.ends_with(".input_scale")
    });
    let shared: Vec<bool> = hp.idx_full.iter().map(|&f| !f).collect();
    b.drop_when(
        "blk.{shared layer}.indexer.*",
        DROP_SHARED_INDEXER,
        move |name| {
            layer_of(name).is_some_and(|l| shared.get(l) == Some(&true))
                && name
                    .split_once('.')
                    .and_then(|(_, rest)| rest.split_once('.'))
                    .is_some_and(|(_, t)| t.starts_with("indexer."))
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

/// A loaded glm-dsa model: hyperparameters, manifest, weights.
#[derive(Debug)]
pub struct GlmMoeDsa {
    hparams: Hparams,
    manifest: Manifest,
    handles: Handles,
    n_vocab: usize,
    weights: LoadedWeights,
    census: Census,
}

impl GlmMoeDsa {
    /// Checks `model` against the manifest both ways and borrows every
    /// claimed tensor (nothing is read or staged).
    ///
    /// # Errors
    ///
    /// A key or tensor refused, naming it.
    pub fn load(model: &GgufModel) -> Result<GlmMoeDsa, LoadError> {
        let hparams = Hparams::from_header(model.header())?;
        let (manifest, handles, n_vocab) = manifest(&hparams, model.tensors())?;
        manifest.check(model.tensors())?;
        let census = manifest.census(model.tensors());
        let weights = LoadedWeights::load(&manifest, model)?;
        Ok(GlmMoeDsa {
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

    /// The lightning indexer's sizes, its keys stored as `numerics`'s K
    /// cache (section 5): RoPE of the leading `n_rot` dims of each head,
    /// ROPE_NORM.
    pub fn indexer_shape(&self, numerics: family_kit::Numerics) -> IndexerShape {
        let hp = &self.hparams;
        IndexerShape {
            n_head: hp.idx_heads,
            head_dim: hp.idx_dim,
            top_k: hp.top_k,
            rope: self.rope(),
            cache: numerics.cache_type_k,
            // glm-dsa never sets `f_norm_eps` (section 5).
            key_norm_eps: 0.0,
        }
    }

    /// The rotation of MLA's rope part and the indexer's heads: ROPE_NORM
    /// of `n_rot` dims, no scaling (what llama.cpp's glm-dsa graph asks).
    pub fn rope(&self) -> GgmlRope {
        GgmlRope::plain(self.hparams.n_rot, RopeMode::Normal, self.hparams.freq_base)
    }

    /// Expert `e` of the stack `stack` (one of [`EXPERT_ROLES`]): a
    /// sub-span borrow, made once.
    ///
    /// # Errors
    ///
    /// `stack` is not an expert stack, or `e` is out of range.
    pub fn expert(
        &self,
        stack: Handle,
        e: usize,
        role: &'static str,
    ) -> Result<&Weight, LoadError> {
        self.weights
            .expert(stack, e as u64, ExpertPart::whole(Role::new(role)))
    }
}
