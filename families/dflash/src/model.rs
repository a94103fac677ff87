//! The dflash draft: hyperparameters, tensor checks and load, and the
//! target's tables it borrows.

use family_kit::{Dims, LoadedWeights, ManifestBuilder, Meta, Route, TypeClass};
use seam::gguf::GgufModel;
use seam::weight::Weight;
use serde::Serialize;

/// The GGUF architecture name.
pub const ARCH: &str = "dflash";

/// Why a draft was refused or could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A metadata key is missing, of the wrong type or out of range.
    #[error("metadata {key}: {why}")]
    Metadata {
        /// The full key.
        key: String,
        /// What is wrong with it.
        why: String,
    },
    /// A tensor is missing, unexpected or of the wrong shape.
    #[error("tensor {name}: {why}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// What is wrong with it.
        why: String,
    },
    /// The target does not offer a table the draft borrows.
    #[error("the target lacks {what}: the draft borrows it and has none of its own")]
    TargetLacks {
        /// Which table.
        what: &'static str,
    },
    /// The draft does not fit the target (taps, widths, vocabulary).
    #[error("the draft does not fit the target: {0}")]
    Mismatch(String),
    /// The seam failed to hand out a weight.
    #[error(transparent)]
    Seam(#[from] seam::SeamError),
    /// A weight could not be dequantized.
    #[error("{name}: {why}")]
    Dequantize {
        /// The weight.
        name: String,
        /// Why.
        why: String,
    },
    /// The draft's file could not be read.
    #[error(transparent)]
    Gguf(#[from] seam::gguf::GgufError),
    /// The target's forward pass failed.
    #[error("target: {0}")]
    Target(String),
    /// The file was refused by the kit's checks, or a weight not read.
    #[error(transparent)]
    Load(#[from] family_kit::LoadError),
    /// An op of the device path failed.
    #[error("device: {0}")]
    Device(#[from] device_ops::OpError),
}

pub use family_kit::TargetTables;

/// The `dflash.*` hyperparameters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Hparams {
    /// Hidden width.
    pub n_embd: usize,
    /// Draft layers.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// K/V heads.
    pub n_head_kv: usize,
    /// Head width.
    pub head_dim: usize,
    /// SwiGLU width.
    pub n_ff: usize,
    /// Tokens per block: the anchor and `block_size - 1` drafts.
    pub block_size: usize,
    /// The target's tap layers, 0-based (stored +1 in the file).
    pub target_layers: Vec<usize>,
    /// `tokenizer.ggml.mask_token_id`.
    pub mask_token: u32,
    /// RMSNorm epsilon.
    pub eps: f64,
    /// RoPE base.
    pub rope_base: f64,
}

fn meta_err(key: &str, why: impl Into<String>) -> Error {
    Error::Metadata {
        key: key.to_owned(),
        why: why.into(),
    }
}

fn tensor_err(name: &str, why: impl Into<String>) -> Error {
    Error::Tensor {
        name: name.to_owned(),
        why: why.into(),
    }
}

impl Hparams {
    /// Reads the keys of `model`.
    ///
    /// # Errors
    ///
    /// A key is missing or out of range (the error names it).
    pub fn from_model(model: &GgufModel) -> Result<Hparams, Error> {
        let m = Meta::for_arch(model.header(), &[ARCH])?;
        let req = |k: &str| -> Result<usize, Error> { Ok(m.req_positive(k)? as usize) };
        let float = |k: &str, default: f64| -> Result<f64, Error> {
            Ok(m.opt_f32(k)?.map_or(default, f64::from))
        };
        let n_embd = req("embedding_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = m
            .opt_u64("attention.head_count_kv")?
            .map_or(n_head, |v| v as usize);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(m
                .bad(
                    "attention.head_count_kv",
                    format!("{n_head} heads over {n_head_kv} kv heads"),
                )
                .into());
        }
        let head_dim = m
            .opt_u64("attention.key_length")?
            .map_or(n_embd / n_head, |v| v as usize);
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(m.bad("attention.key_length", "must be even and > 0").into());
        }
        let block_size = req("block_size")?;
        if block_size < 2 {
            return Err(m.bad("block_size", "must be at least 2").into());
        }
        let stored = m
            .opt_u64_array("target_layers")?
            .ok_or_else(|| m.missing("target_layers"))?;
        if stored.is_empty() {
            return Err(m.bad("target_layers", "empty").into());
        }
        // Stored +1: 0 would be the embeddings, not a layer's output.
        let target_layers = stored
            .iter()
            .map(|&v| {
                usize::try_from(v)
                    .ok()
                    .and_then(|v| v.checked_sub(1))
                    .ok_or_else(|| m.bad("target_layers", format!("{v}: stored +1, so at least 1")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mask_token = u32::try_from(m.req_u64_global("tokenizer.ggml.mask_token_id")?)
            .map_err(|_| meta_err("tokenizer.ggml.mask_token_id", "does not fit u32"))?;
        Ok(Hparams {
            n_embd,
            n_layer: req("block_count")?,
            n_head,
            n_head_kv,
            head_dim,
            n_ff: req("feed_forward_length")?,
            block_size,
            target_layers,
            mask_token,
            eps: float("attention.layer_norm_rms_epsilon", 1e-6)?,
            rope_base: float("rope.freq_base", 1e6)?,
        })
    }

    /// Every tensor the draft's file holds, with its dims (GGUF order).
    pub fn tensors(&self, target_n_embd: usize) -> Vec<(String, Vec<u64>)> {
        let e = self.n_embd as u64;
        let (q, kv) = (
            (self.n_head * self.head_dim) as u64,
            (self.n_head_kv * self.head_dim) as u64,
        );
        let (hd, ff) = (self.head_dim as u64, self.n_ff as u64);
        let taps = (self.target_layers.len() * target_n_embd) as u64;
        let mut t = vec![
            ("fc.weight".to_owned(), vec![taps, e]),
            ("enc.output_norm.weight".to_owned(), vec![e]),
            ("output_norm.weight".to_owned(), vec![e]),
        ];
        for l in 0..self.n_layer {
            let b = |s: &str| format!("blk.{l}.{s}.weight");
            t.extend([
                (b("attn_norm"), vec![e]),
                (b("attn_q"), vec![e, q]),
                (b("attn_k"), vec![e, kv]),
                (b("attn_v"), vec![e, kv]),
                (b("attn_output"), vec![q, e]),
                (b("attn_q_norm"), vec![hd]),
                (b("attn_k_norm"), vec![hd]),
                (b("ffn_norm"), vec![e]),
                (b("ffn_gate"), vec![e, ff]),
                (b("ffn_up"), vec![e, ff]),
                (b("ffn_down"), vec![ff, e]),
            ]);
        }
        t
    }
}

/// The draft's own bytes and what it borrows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DraftCensus {
    /// Tensors in the draft's file.
    pub own_tensors: usize,
    /// Their bytes (borrows of the draft's file).
    pub own_bytes: u64,
    /// The target's weights the draft reads (by name).
    pub borrowed: Vec<String>,
    /// Host bytes the borrowed tables add: 0, they are the target's.
    pub borrowed_host_bytes_added: u64,
}

/// The draft's manifest: every tensor of `expected` claimed (norms F32),
/// the target's tables refused by name.
fn manifest(expected: &[(String, Vec<u64>)]) -> family_kit::Manifest {
    let mut b = ManifestBuilder::new(ARCH, &[]);
    for (name, dims) in expected {
        let norm = name.contains("norm");
        let layer = name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse().ok());
        b.tensor(
            name.clone(),
            if norm { "norm" } else { "dflash" },
            layer,
            Dims::Exact(dims.clone()),
            if norm { TypeClass::F32 } else { TypeClass::Any },
            Route::Dense,
        );
    }
    for name in ["token_embd.weight", "output.weight"] {
        b.refuse(
            name,
            "present in the draft's file: the draft borrows the target's, never its own",
        );
    }
    b.build()
}

/// A loaded dflash draft, borrowing its target's tables.
pub struct Dflash<'t> {
    hp: Hparams,
    manifest: family_kit::Manifest,
    weights: LoadedWeights,
    token_embd: &'t Weight,
    output: &'t Weight,
    target_n_embd: usize,
    census: DraftCensus,
}

impl std::fmt::Debug for Dflash<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dflash")
            .field("hparams", &self.hp)
            .field("weights", &self.weights)
            .finish()
    }
}

impl<'t> Dflash<'t> {
    /// Reads the hyperparameters, checks the tensor table both ways and
    /// against `target`, and makes one borrowed weight per tensor (no byte
    /// is read or copied). The target's tables are taken by reference.
    ///
    /// # Errors
    ///
    /// A key or tensor is refused (naming it), the file holds a table the
    /// draft must borrow, the target lacks a table, or the draft does not
    /// fit the target (tap layers, `fc` width, hidden width, mask token).
    pub fn load(model: &GgufModel, target: &'t dyn TargetTables) -> Result<Dflash<'t>, Error> {
        let hp = Hparams::from_model(model)?;
        for name in ["token_embd.weight", "output.weight"] {
            if model.tensor(name).is_some() {
                return Err(tensor_err(
                    name,
                    "present in the draft's file: the draft borrows the target's, never its own",
                ));
            }
        }
        let token_embd = target.token_embd().ok_or(Error::TargetLacks {
            what: "token_embd (the embedding table)",
        })?;
        let output = target.output_head().ok_or(Error::TargetLacks {
            what: "output (the output head)",
        })?;
        let (te, tv) = (target.n_embd(), target.n_vocab());
        if hp.n_embd != te {
            return Err(Error::Mismatch(format!(
                "the draft's embedding_length {} is not the target's n_embd {te} (the draft embeds with the target's table)",
                hp.n_embd
            )));
        }
        for (what, w) in [("token_embd", token_embd), ("output", output)] {
            if w.dims() != [te as u64, tv as u64] {
                return Err(Error::Mismatch(format!(
                    "the target's {what} {} has dims {:?}, expected [{te}, {tv}]",
                    w.name(),
                    w.dims()
                )));
            }
        }
        if let Some(&l) = hp.target_layers.iter().find(|&&l| l >= target.n_layer()) {
            return Err(Error::Mismatch(format!(
                "tap layer {l} (stored {}) is not below the target's {} layers",
                l + 1,
                target.n_layer()
            )));
        }
        if hp.mask_token as usize >= tv {
            return Err(Error::Mismatch(format!(
                "mask token {} is not below the target's vocabulary {tv}",
                hp.mask_token
            )));
        }
        let expected = hp.tensors(te);
        // fc first: its width is the taps', and the refusal says so.
        if let (Some(info), Some((_, dims))) = (model.tensor("fc.weight"), expected.first())
            && info.dims != *dims
        {
            return Err(tensor_err(
                "fc.weight",
                format!(
                    "dims {:?}: fc must be {} wide ({} target taps {:?} of {te}) to {}",
                    info.dims,
                    dims[0],
                    hp.target_layers.len(),
                    hp.target_layers,
                    hp.n_embd
                ),
            ));
        }
        let manifest = manifest(&expected);
        manifest.check(model.tensors())?;
        let weights = LoadedWeights::load(&manifest, model)?;
        let own_bytes = weights.all().iter().map(|w| w.host().len()).sum();
        let mut borrowed = vec![token_embd.name().to_owned()];
        if !std::ptr::eq(token_embd, output) {
            borrowed.push(output.name().to_owned());
        }
        let census = DraftCensus {
            own_tensors: weights.all().len(),
            own_bytes,
            borrowed,
            borrowed_host_bytes_added: 0,
        };
        Ok(Dflash {
            hp,
            manifest,
            weights,
            token_embd,
            output,
            target_n_embd: te,
            census,
        })
    }

    /// The hyperparameters.
    pub fn hparams(&self) -> &Hparams {
        &self.hp
    }

    /// The draft's own weights (its file's tensors).
    pub fn weights(&self) -> &[Weight] {
        self.weights.all()
    }

    /// The draft's own weight `name`.
    pub fn weight(&self, name: &str) -> Option<&Weight> {
        self.manifest.handle(name).map(|h| self.weights.get(h))
    }

    /// The target's embedding table (the target's own weight).
    pub fn token_embd(&self) -> &'t Weight {
        self.token_embd
    }

    /// The target's output head (the target's own weight).
    pub fn output_head(&self) -> &'t Weight {
        self.output
    }

    /// One tap's width (the target's n_embd).
    pub fn target_n_embd(&self) -> usize {
        self.target_n_embd
    }

    /// The census.
    pub fn census(&self) -> &DraftCensus {
        &self.census
    }
}
