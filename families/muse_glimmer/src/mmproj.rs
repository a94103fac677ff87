//! The multimodal projector (`--mmproj FILE`): general.architecture `clip`,
//! `clip.projector_type = "muse-glimmer"`, the keys and tensors llama.cpp's
//! clip loader reads for this type (`docs/families/muse_glimmer.md`
//! section 7), checked both ways through the kit's manifest, and its
//! encoder (ViT, pixel shuffle, adapter), every weight asked of
//! `seam::resident_weight`.
//!
//! `v.patch_embd.weight` is checked before anything else, exactly: the
//! published projector is missing half of it, and llama.cpp then crashes
//! or blames another tensor. Absent, short of its shape `{ps, ps, 3, Ev}`,
//! or cut short by the end of the file ([`explain_open_error`]): refused
//! with one line naming the tensor and what is missing. A projector of
//! another model is refused by its `clip.projector_type`.

use device_ops::reference::HostAttnMask;
use device_ops::{Attention, AttnMask, DType, DeviceTensor, KvCache, KvSpec, Scores};
use family_kit::blocks::attention::{DeviceWeights, op_err};
use family_kit::{
    Census, Dims, LoadError, LoadedWeights, Manifest, ManifestBuilder, Meta, Route, TypeClass,
    WeightReader,
};
use family_ops::projector::{dot_rows_f64, gelu_erf, layer_norm};
use family_ops::{AttentionShape, Rope, RopeMode};
use seam::gguf::{GgmlType, GgufError, GgufErrorKind, GgufModel, Value};
use seam::platform::{Platform, Queue};
use seam::weight::Weight;
use serde::Serialize;

/// The projector type this family reads.
pub const PROJECTOR_TYPE: &str = "muse-glimmer";

/// The projector manifest's name in refusals.
const PROJECTOR_MANIFEST: &str = "muse-glimmer projector";

/// The patch embedding, checked first and exactly.
pub const PATCH_EMBD: &str = "v.patch_embd.weight";

/// RoPE base of the ViT's 2D RoPE (`clip.cpp:1705`, no key).
const ROPE_BASE: f32 = 10000.0;

/// Every `SPARSE_FACTOR`-th block (and the last) attends globally; the
/// others inside their window (`clip.cpp:1707`, no key).
const SPARSE_FACTOR: usize = 4;

/// The projector's hyperparameters (`clip.vision.*`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProjectorHparams {
    /// ViT width Ev.
    pub n_embd: usize,
    /// ViT heads.
    pub n_head: usize,
    /// ViT FFN width.
    pub n_ff: usize,
    /// ViT blocks.
    pub n_layer: usize,
    /// The text model's width the adapter ends in.
    pub projection_dim: usize,
    /// LayerNorm eps.
    pub eps: f32,
    /// Patch size ps.
    pub patch_size: usize,
    /// Pixel-shuffle factor f.
    pub merge: usize,
    /// Rows (and columns) of the position table's grid: P.
    pub pos_grid: usize,
    /// The adapter's widths: `mm.0` out, `mm.1` out.
    pub adapter: [usize; 2],
}

/// A loaded projector: hyperparameters, manifest, weights.
pub struct Projector {
    hparams: ProjectorHparams,
    manifest: Manifest,
    census: Census,
    weights: LoadedWeights,
}

impl std::fmt::Debug for Projector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Projector")
            .field("hparams", &self.hparams)
            .field("tensors", &self.manifest.tensors.len())
            .finish()
    }
}

fn to_usize(meta: &Meta<'_>, name: &str, v: u64) -> Result<usize, LoadError> {
    usize::try_from(v).map_err(|_| meta.bad(name, format!("{v} does not fit this machine")))
}

fn req(meta: &Meta<'_>, name: &str) -> Result<usize, LoadError> {
    let v = meta.req_positive(name)?;
    to_usize(meta, name, v)
}

fn incomplete(reason: String) -> LoadError {
    LoadError::RefusedTensor {
        name: PATCH_EMBD.into(),
        reason: format!("incomplete patch embedding: {reason}"),
    }
}

/// One line for a projector file the GGUF reader refused, when the cause is
/// a tensor whose data the file cuts short (the header still claims it):
/// names the tensor and the bytes missing. `None` for any other error.
pub fn explain_open_error(e: &GgufError) -> Option<String> {
    let GgufErrorKind::OutOfRange {
        start,
        end,
        file_len,
    } = e.kind
    else {
        return None;
    };
    let name = e.field.split('"').nth(1)?;
    let need = end.checked_sub(start)?;
    let have = file_len.saturating_sub(start).min(need);
    Some(format!(
        "{}: tensor {name:?} is incomplete: the file ends {} of its {need} bytes in ({} bytes missing)",
        seam::text::path_safe(&e.file),
        have,
        need - have
    ))
}

impl Projector {
    /// Checks the keys, `v.patch_embd.weight` and then the whole tensor
    /// table against the manifest (both ways), and borrows every claimed
    /// weight (nothing is read or staged).
    ///
    /// # Errors
    ///
    /// Another architecture or projector type, a key or a tensor that does
    /// not fit (named).
    pub fn load(model: &GgufModel) -> Result<Projector, LoadError> {
        let meta = Meta::for_arch(model.header(), &["clip"])?;
        let ty_key = if meta.get("projector_type").is_some() {
            "projector_type"
        } else {
            "vision.projector_type"
        };
        match meta.get(ty_key) {
            Some(Value::String(t)) if t == PROJECTOR_TYPE => {}
            Some(Value::String(t)) => {
                return Err(meta.bad(
                    ty_key,
                    format!("{t:?}: a projector for another model, not {PROJECTOR_TYPE:?}"),
                ));
            }
            Some(other) => {
                return Err(LoadError::KeyType {
                    key: meta.key(ty_key),
                    expected: "a string",
                    found: other.type_name(),
                });
            }
            None => return Err(meta.missing("projector_type")),
        }
        match meta.get("has_vision_encoder") {
            Some(Value::Bool(true)) => {}
            _ => return Err(meta.bad("has_vision_encoder", "must be true for a vision projector")),
        }
        let ev = req(&meta, "vision.embedding_length")?;
        let n_head = req(&meta, "vision.attention.head_count")?;
        if ev % n_head != 0 || (ev / n_head) % 4 != 0 {
            return Err(meta.bad(
                "vision.attention.head_count",
                format!("{n_head} heads of vision.embedding_length {ev}: the 2D RoPE needs heads of a multiple of 4"),
            ));
        }
        let n_ff = req(&meta, "vision.feed_forward_length")?;
        let n_layer = req(&meta, "vision.block_count")?;
        let projection_dim = req(&meta, "vision.projection_dim")?;
        let image_size = req(&meta, "vision.image_size")?;
        let ps = req(&meta, "vision.patch_size")?;
        let merge = match meta.opt_u64("vision.spatial_merge_size")? {
            Some(v) => to_usize(
                &meta,
                "vision.spatial_merge_size",
                meta.positive("vision.spatial_merge_size", v)?,
            )?,
            None => 2,
        };
        let eps = meta
            .opt_f32("vision.attention.layer_norm_epsilon")?
            .ok_or_else(|| meta.missing("vision.attention.layer_norm_epsilon"))?;
        for name in ["vision.image_mean", "vision.image_std"] {
            match meta.get(name) {
                Some(Value::Array(seam::gguf::Array::F32(v))) if v.len() >= 3 => {}
                Some(_) => return Err(meta.bad(name, "expected at least 3 floats")),
                None => return Err(meta.missing(name)),
            }
        }
        if image_size % (ps * merge) != 0 {
            return Err(meta.bad(
                "vision.image_size",
                format!(
                    "{image_size} is not a multiple of patch_size {ps} x spatial_merge_size {merge}"
                ),
            ));
        }
        let pos_grid = image_size / (ps * merge);
        // The patch embedding first: present, whole shape, whole bytes
        // (a file cut inside its data fails to open: explain_open_error).
        let (ps64, ev64) = (ps as u64, ev as u64);
        let want = [ps64, ps64, 3, ev64];
        let Some(patch) = model.tensor(PATCH_EMBD) else {
            return Err(incomplete(format!(
                "absent from the file; the projector needs {want:?} (ps, ps, 3, vision.embedding_length) values"
            )));
        };
        if patch.dims != want {
            let have: u64 = patch.dims.iter().product();
            let need: u64 = want.iter().product();
            let what = match patch.dims.as_slice() {
                [a, b, 3, o] if *a == ps64 && *b == ps64 && o < &ev64 => {
                    format!("{} of its {ev} output channels are missing", ev64 - o)
                }
                _ if have < need => format!("{} of its {need} values are missing", need - have),
                _ => "its shape is not the projector's".to_owned(),
            };
            return Err(incomplete(format!(
                "dims {:?}, expected {want:?}: {what}",
                patch.dims
            )));
        }
        let mm_dim = |name: &str| model.tensor(name).and_then(|t| t.dims.get(1).copied());
        // The adapter's widths are its tensors' (no key holds them).
        let adapter_width = |name: &str| {
            mm_dim(name).ok_or_else(|| LoadError::MissingTensor {
                arch: PROJECTOR_MANIFEST,
                name: name.into(),
            })
        };
        let d1 = adapter_width("mm.0.weight")?;
        let d2 = adapter_width("mm.1.weight")?;
        let ff = (ev * merge * merge) as u64;
        let (nff, proj) = (n_ff as u64, projection_dim as u64);
        let mut b = ManifestBuilder::new(PROJECTOR_MANIFEST, model.tensors());
        let vec_of = |n| Dims::Exact(vec![n]);
        b.tensor(
            PATCH_EMBD,
            "patch_embd",
            None,
            Dims::Exact(want.to_vec()),
            TypeClass::Float,
            Route::Dense,
        );
        b.optional(
            "v.patch_embd.bias",
            "patch_embd_bias",
            None,
            vec_of(ev64),
            TypeClass::F32,
            Route::Dense,
        );
        let n_pos = (pos_grid * pos_grid) as u64;
        b.tensor(
            "v.position_embd.weight",
            "position_embd",
            None,
            Dims::Exact(vec![ev64, n_pos]),
            TypeClass::Float,
            Route::Dense,
        );
        for ln in ["v.pre_ln", "v.post_ln"] {
            b.optional(
                format!("{ln}.weight"),
                "ln",
                None,
                vec_of(ev64),
                TypeClass::F32,
                Route::Dense,
            );
            b.optional(
                format!("{ln}.bias"),
                "ln_bias",
                None,
                vec_of(ev64),
                TypeClass::F32,
                Route::Dense,
            );
        }
        for l in 0..n_layer {
            let p = format!("v.blk.{l}.");
            for ln in ["ln1", "ln2"] {
                b.optional(
                    format!("{p}{ln}.weight"),
                    "ln",
                    Some(l),
                    vec_of(ev64),
                    TypeClass::F32,
                    Route::Dense,
                );
                b.optional(
                    format!("{p}{ln}.bias"),
                    "ln_bias",
                    Some(l),
                    vec_of(ev64),
                    TypeClass::F32,
                    Route::Dense,
                );
            }
            for (m, i, o) in [
                ("attn_q", ev64, ev64),
                ("attn_k", ev64, ev64),
                ("attn_v", ev64, ev64),
                ("attn_out", ev64, ev64),
                ("ffn_up", ev64, nff),
                ("ffn_down", nff, ev64),
            ] {
                b.tensor(
                    format!("{p}{m}.weight"),
                    "vit_matrix",
                    Some(l),
                    Dims::Exact(vec![i, o]),
                    TypeClass::Any,
                    Route::Dense,
                );
                b.optional(
                    format!("{p}{m}.bias"),
                    "vit_bias",
                    Some(l),
                    vec_of(o),
                    TypeClass::F32,
                    Route::Dense,
                );
            }
        }
        b.tensor(
            "mm.0.weight",
            "adapter",
            None,
            Dims::Exact(vec![ff, d1]),
            TypeClass::Any,
            Route::Dense,
        );
        b.tensor(
            "mm.1.weight",
            "adapter",
            None,
            Dims::Exact(vec![d1, d2]),
            TypeClass::Any,
            Route::Dense,
        );
        b.tensor(
            "mm.2.weight",
            "projection",
            None,
            Dims::Exact(vec![d2, proj]),
            TypeClass::Any,
            Route::Dense,
        );
        let manifest = b.build();
        manifest.check(model.tensors())?;
        let census = manifest.census(model.tensors());
        let weights = LoadedWeights::load(&manifest, model)?;
        Ok(Projector {
            hparams: ProjectorHparams {
                n_embd: ev,
                n_head,
                n_ff,
                n_layer,
                projection_dim,
                eps,
                patch_size: ps,
                merge,
                pos_grid,
                adapter: [d1 as usize, d2 as usize],
            },
            manifest,
            census,
            weights,
        })
    }

    /// The hyperparameters.
    pub fn hparams(&self) -> &ProjectorHparams {
        &self.hparams
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The census.
    pub fn census(&self) -> &Census {
        &self.census
    }

    /// Every claimed weight.
    pub fn weights(&self) -> &LoadedWeights {
        &self.weights
    }

    /// Stages every weight of the projector through the seam at load, as
    /// llama.cpp's clip loader loads them all before the first image: each
    /// weight once (the seam's memo; later reads by [`Projector::encode`]
    /// find it), its host pages given back by the seam's release rule.
    /// Returns how many weights have a device copy (0 on a device that reads
    /// host memory).
    ///
    /// # Errors
    ///
    /// The seam failed to stage a weight.
    pub fn stage(&self, platform: &dyn Platform, queue: &dyn Queue) -> Result<usize, LoadError> {
        for w in self.weights.all() {
            seam::resident_weight(w, platform, queue)?;
        }
        Ok(self.weights.staged())
    }

    /// Checks the projector against the text model's width.
    ///
    /// # Errors
    ///
    /// `mm.2.weight` does not end in `n_embd`.
    pub fn check_text_width(&self, n_embd: usize) -> Result<(), LoadError> {
        if self.hparams.projection_dim == n_embd {
            Ok(())
        } else {
            Err(LoadError::WrongShape {
                name: "mm.2.weight".into(),
                expected: format!(
                    "[{}, {n_embd}] (the text model's embedding_length)",
                    self.hparams.adapter[1]
                ),
                found: vec![
                    self.hparams.adapter[1] as u64,
                    self.hparams.projection_dim as u64,
                ],
            })
        }
    }

    fn weight(&self, name: &str) -> Result<&Weight, LoadError> {
        self.manifest
            .handle(name)
            .map(|h| self.weights.get(h))
            .ok_or_else(|| LoadError::MissingTensor {
                arch: PROJECTOR_MANIFEST,
                name: name.into(),
            })
    }

    fn optional(&self, name: &str) -> Option<&Weight> {
        self.manifest.handle(name).map(|h| self.weights.get(h))
    }

    /// Encodes `image` into `(width/ps/f)·(height/ps/f)` embeddings of the
    /// text model's width, reading every weight through `reader`.
    ///
    /// # Errors
    ///
    /// The image is not a whole number of merged patches, or the seam
    /// failed to hand out a weight.
    pub fn encode<'w>(
        &'w self,
        reader: &WeightReader<'w>,
        image: &Image,
    ) -> Result<Vec<Vec<f32>>, LoadError> {
        Encoder { p: self, reader }.run(image)
    }
}

impl Projector {
    /// [`Projector::encode`] on a device: every product, norm and the
    /// attention through `dw`'s op layer where the seam staged the
    /// weights, the host's arithmetic op for op (its float64 products,
    /// LayerNorm and GELU; the attention the reference's), so the fake
    /// device gives the host's embeddings to the bit. Only the image's
    /// patches, the resize's weights, the RoPE positions and the window
    /// masks go up (geometry); only the embeddings come back.
    ///
    /// # Errors
    ///
    /// As [`Projector::encode`], or the device failed.
    pub fn encode_on_device(
        &self,
        dw: &DeviceWeights<'_>,
        image: &Image,
    ) -> Result<Vec<Vec<f32>>, LoadError> {
        let hp = &self.hparams;
        let (ps, ev, f, pg) = (hp.patch_size, hp.n_embd, hp.merge, hp.pos_grid);
        let o = dw.ops();
        let kernel = self.weight(PATCH_EMBD)?;
        let (gw, gh, patches) = patches(hp, kernel.ggml_type(), image)?;
        let t_n = gw * gh;
        let patch_len = 3 * ps * ps;
        let patches = o.upload_f32(&patches, &[t_n, patch_len]).map_err(op_err)?;
        // The kernel's rows of one output channel: 3·ps rows of ps.
        let k = dw.small(kernel, &[ev, patch_len])?;
        let k = if kernel.ggml_type() == GgmlType::BF16 {
            o.scale(&k, 1.0).map_err(op_err)?
        } else {
            o.round_f16(&k).map_err(op_err)?
        };
        let mut x = o.dot_rows_f64(&patches, &k).map_err(op_err)?;
        if let Some(b) = self.optional("v.patch_embd.bias") {
            x = o.add(&x, &*dw.small(b, &[ev])?).map_err(op_err)?;
        }
        let table = dw.small(self.weight("v.position_embd.weight")?, &[pg * pg, ev])?;
        x = if gw == pg && gh == pg {
            o.add(&x, &table).map_err(op_err)?
        } else {
            let w = o
                .upload_f32(&bilinear_weights(pg, gw, gh), &[t_n, pg * pg])
                .map_err(op_err)?;
            let columns = o.transpose(&table).map_err(op_err)?;
            let pos = o.dot_rows_f64(&w, &columns).map_err(op_err)?;
            o.add(&x, &pos).map_err(op_err)?
        };
        // A LayerNorm where the file has its gains (else `x` as it is).
        let ln = |name: &str, x: &DeviceTensor| -> Result<DeviceTensor, LoadError> {
            let Some(w) = self.optional(&format!("{name}.weight")) else {
                return o.scale(x, 1.0).map_err(op_err);
            };
            let w = dw.small(w, &[ev])?;
            let b = self
                .optional(&format!("{name}.bias"))
                .map(|b| dw.small(b, &[ev]))
                .transpose()?;
            o.layer_norm_f64(x, hp.eps, Some(&w), b.as_deref())
                .map_err(op_err)
        };
        let linear = |name: &str, bias: Option<&str>, x: &DeviceTensor| {
            let mut y = dw.matmul_f64(self.weight(name)?, x)?;
            if let Some(b) = bias.and_then(|b| self.optional(b)) {
                let (_, cols) = y.rows_cols("linear").map_err(op_err)?;
                y = o.add(&y, &*dw.small(b, &[cols])?).map_err(op_err)?;
            }
            Ok::<_, LoadError>(y)
        };
        x = ln("v.pre_ln", &x)?;
        let dh = ev / hp.n_head;
        let rope = Rope {
            n_rot: dh / 2,
            freq_base: ROPE_BASE,
            mode: RopeMode::Normal,
        };
        let halves = half_head_positions(t_n, gw, hp.n_head);
        let halves = o.upload_i32(&halves, &[halves.len()]).map_err(op_err)?;
        let turn = |t: DeviceTensor| -> Result<DeviceTensor, LoadError> {
            let t = t.reshape(&[t_n * hp.n_head * 2, dh / 2]).map_err(op_err)?;
            o.rope(&t, &halves, dh / 2, &rope)
                .and_then(|t| t.reshape(&[t_n, ev]))
                .map_err(op_err)
        };
        let spec = KvSpec {
            n_ctx: t_n,
            n_head_kv: hp.n_head,
            head_dim_k: dh,
            head_dim_v: dh,
            dtype: DType::F32,
        };
        for il in 0..hp.n_layer {
            let p = format!("v.blk.{il}.");
            let h = ln(&format!("{p}ln1"), &x)?;
            let name = |s: &str| format!("{p}{s}");
            let q = linear(&name("attn_q.weight"), Some(&name("attn_q.bias")), &h)?;
            let k = linear(&name("attn_k.weight"), Some(&name("attn_k.bias")), &h)?;
            let v = linear(&name("attn_v.weight"), Some(&name("attn_v.bias")), &h)?;
            let (q, k) = (turn(q)?, turn(k)?);
            let mut cache = KvCache::new(o, spec).map_err(op_err)?;
            cache.append(o, &k, &v).map_err(op_err)?;
            let mask = block_mask(il, hp.n_layer, t_n, gw, pg);
            let mask = o.upload_f32(&mask, &[t_n, t_n]).map_err(op_err)?;
            let a = o
                .attention(
                    &q,
                    &cache,
                    &Attention {
                        n_head: hp.n_head,
                        scores: Scores::scale(1.0 / (dh as f32).sqrt()),
                        mask: AttnMask::Additive(&mask),
                    },
                )
                .map_err(op_err)?;
            let a = linear(&name("attn_out.weight"), Some(&name("attn_out.bias")), &a)?;
            x = o.add(&x, &a).map_err(op_err)?;
            let h = ln(&format!("{p}ln2"), &x)?;
            let up = linear(&name("ffn_up.weight"), Some(&name("ffn_up.bias")), &h)?;
            let act = o.gelu_erf(&up).map_err(op_err)?;
            let down = linear(&name("ffn_down.weight"), Some(&name("ffn_down.bias")), &act)?;
            x = o.add(&x, &down).map_err(op_err)?;
        }
        x = ln("v.post_ln", &x)?;
        // The pixel shuffle: each merged token's f·f patches, channel by
        // channel (`y[c·f·f + s]` of patch `s`).
        let (ow, oh) = (gw / f, gh / f);
        let ids: Vec<i32> = (0..oh * ow)
            .flat_map(|m| {
                let (oy, ox) = (m / ow, m % ow);
                (0..f * f).map(move |s| ((oy * f + s / f) * gw + ox * f + s % f) as i32)
            })
            .collect();
        let ids = o.upload_i32(&ids, &[oh * ow, f * f]).map_err(op_err)?;
        let y = o
            .gather_rows(&x, &ids)
            .and_then(|t| o.transpose(&t))
            .and_then(|t| t.reshape(&[oh * ow, ev * f * f]))
            .map_err(op_err)?;
        let y = o
            .gelu_erf(&linear("mm.0.weight", None, &y)?)
            .map_err(op_err)?;
        let y = o
            .gelu_erf(&linear("mm.1.weight", None, &y)?)
            .map_err(op_err)?;
        let out = linear("mm.2.weight", None, &y)?;
        let (_, width) = out.rows_cols("encode").map_err(op_err)?;
        let values = o.read_back(&out).map_err(op_err)?;
        Ok(values.chunks_exact(width).map(<[f32]>::to_vec).collect())
    }
}

/// An image already resized and normalised: interleaved RGB, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Image {
    /// Pixels per row.
    pub width: usize,
    /// Rows.
    pub height: usize,
    /// `height · width · 3` values, pixel `(x, y)` channel `c` at
    /// `(y · width + x) · 3 + c`.
    pub pixels: Vec<f32>,
}

impl Image {
    /// The synthetic image of `tools/oracle/mm_encode.cpp`: value
    /// `sin(0.37x + 0.61y + 1.3c)`, in `f32`.
    pub fn synthetic(width: usize, height: usize) -> Image {
        let mut pixels = Vec::with_capacity(width * height * 3);
        for y in 0..height {
            for x in 0..width {
                for c in 0..3 {
                    let arg = 0.37f32 * x as f32 + 0.61f32 * y as f32 + 1.3f32 * c as f32;
                    pixels.push(f64::from(arg).sin() as f32);
                }
            }
        }
        Image {
            width,
            height,
            pixels,
        }
    }
}

fn f16_round(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// The weights of a bilinear resize of a `p × p` grid of rows (row `x +
/// p·y`) to `gw × gh` (ggml's upscale, half-pixel centres, clamped):
/// `[gw·gh, p·p]`, output row `i + gw·j` weighing the grid's rows; where
/// the clamp puts two corners on one row, their weights are summed in
/// `f64` before the one rounding to `f32`.
fn bilinear_weights(p: usize, gw: usize, gh: usize) -> Vec<f32> {
    let axis = |i: usize, g: usize| {
        let s = (i as f64 + 0.5) * p as f64 / g as f64 - 0.5;
        let lo = s.floor() as i64;
        let clamp = |v: i64| v.clamp(0, p as i64 - 1) as usize;
        let (c0, c1) = (clamp(lo), clamp(lo + 1));
        (c0, c1, (s - c0 as f64).clamp(0.0, 1.0))
    };
    let mut w = vec![0f64; gw * gh * p * p];
    for j in 0..gh {
        let (y0, y1, dy) = axis(j, gh);
        for i in 0..gw {
            let (x0, x1, dx) = axis(i, gw);
            let row = &mut w[(j * gw + i) * p * p..][..p * p];
            for (y, wy) in [(y0, 1.0 - dy), (y1, dy)] {
                for (x, wx) in [(x0, 1.0 - dx), (x1, dx)] {
                    row[y * p + x] += wx * wy;
                }
            }
        }
    }
    w.into_iter().map(|v| v as f32).collect()
}

/// Bilinear resize of a `p × p` grid of rows of `e` (row `x + p·y`) to
/// `gw × gh`: the [`bilinear_weights`] times the grid, each value's
/// products summed in `f64` (`family_ops::projector::dot_rows_f64`).
fn bilinear(table: &[f32], e: usize, p: usize, gw: usize, gh: usize) -> Vec<f32> {
    let columns = device_ops::reference::transpose(table, p * p, e);
    dot_rows_f64(&bilinear_weights(p, gw, gh), &columns, p * p)
}

/// Which window block patch `t` of a grid `gw` wide is in (blocks of `pg ×
/// pg` patches).
fn window(t: usize, gw: usize, pg: usize) -> (usize, usize) {
    ((t / gw) / pg, (t % gw) / pg)
}

/// The additive mask of an encoder block over `t_n` patches: `0` where
/// the block is global or both patches share a window, else `-inf`
/// (`[t_n, t_n]`, query rows).
fn block_mask(il: usize, n_layer: usize, t_n: usize, gw: usize, pg: usize) -> Vec<f32> {
    let global = il + 1 == n_layer || (il + 1).is_multiple_of(SPARSE_FACTOR);
    (0..t_n * t_n)
        .map(|i| {
            let (t, j) = (i / t_n, i % t_n);
            if global || window(j, gw, pg) == window(t, gw, pg) {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect()
}

/// The 2D RoPE positions of `t_n` patches of a grid `gw` wide, one per
/// half head (`n_head` heads a patch): the first half of a head turns with
/// the column (1-based), the second with the row.
fn half_head_positions(t_n: usize, gw: usize, n_head: usize) -> Vec<i32> {
    (0..t_n)
        .flat_map(|t| {
            let (pos_w, pos_h) = ((t % gw + 1) as i32, (t / gw + 1) as i32);
            std::iter::repeat_n([pos_w, pos_h], n_head).flatten()
        })
        .collect()
}

/// `image`'s patches as rows `(c, ky, kx)` of `3·ps·ps` (`[gw·gh, ...]`,
/// row `x + gw·y`), rounded to F16 as ggml's im2col does unless the kernel
/// is BF16; and `(gw, gh)`.
///
/// # Errors
///
/// The image is not a whole number of merged patches.
fn patches(
    hp: &ProjectorHparams,
    kernel_type: GgmlType,
    image: &Image,
) -> Result<(usize, usize, Vec<f32>), LoadError> {
    let (ps, f) = (hp.patch_size, hp.merge);
    if !image.width.is_multiple_of(ps * f)
        || !image.height.is_multiple_of(ps * f)
        || image.width == 0
        || image.height == 0
        || image.pixels.len() != image.width * image.height * 3
    {
        return Err(LoadError::Forward(format!(
            "an image of {}x{} is not a whole number of {}-pixel merged patches",
            image.width,
            image.height,
            ps * f
        )));
    }
    let (gw, gh) = (image.width / ps, image.height / ps);
    let t_n = gw * gh;
    let round = kernel_type != GgmlType::BF16;
    let patch_len = 3 * ps * ps;
    let mut out = vec![0f32; t_n * patch_len];
    for t in 0..t_n {
        let (py, px) = (t / gw, t % gw);
        for c in 0..3 {
            for ky in 0..ps {
                for kx in 0..ps {
                    let v = image.pixels[((py * ps + ky) * image.width + px * ps + kx) * 3 + c];
                    out[t * patch_len + (c * ps + ky) * ps + kx] =
                        if round { f16_round(v) } else { v };
                }
            }
        }
    }
    Ok((gw, gh, out))
}

struct Encoder<'w> {
    p: &'w Projector,
    reader: &'w WeightReader<'w>,
}

impl<'w> Encoder<'w> {
    fn vector(&self, w: Option<&'w Weight>) -> Result<Option<std::sync::Arc<[f32]>>, LoadError> {
        w.map(|w| self.reader.vector(w)).transpose()
    }

    /// `W·x (+ b)`; activations rounded first as ggml's CPU matmul rounds
    /// them for the weight's type.
    fn linear(&self, name: &str, bias: Option<&str>, x: &[f32]) -> Result<Vec<f32>, LoadError> {
        let w = self.p.weight(name)?;
        let x = family_ops::as_ggml_multiplies(w.ggml_type(), x)
            .map_err(|e| LoadError::Forward(e.to_string()))?;
        let mut y = self.reader.matvec_f32(w, &x)?;
        if let Some(b) = self.vector(bias.and_then(|b| self.p.optional(b)))? {
            y.iter_mut().zip(b.iter()).for_each(|(v, &b)| *v += b);
        }
        Ok(y)
    }

    fn ln(&self, name: &str, x: &mut [f32]) -> Result<(), LoadError> {
        let Some(w) = self.vector(self.p.optional(&format!("{name}.weight")))? else {
            return Ok(());
        };
        let b = self.vector(self.p.optional(&format!("{name}.bias")))?;
        layer_norm(x, self.p.hparams.eps, Some(&w), b.as_deref());
        Ok(())
    }

    fn run(&self, image: &Image) -> Result<Vec<Vec<f32>>, LoadError> {
        let hp = &self.p.hparams;
        let (ps, ev, f, pg) = (hp.patch_size, hp.n_embd, hp.merge, hp.pos_grid);
        let kernel = self.p.weight(PATCH_EMBD)?;
        let round = kernel.ggml_type() != GgmlType::BF16;
        let (gw, gh, patches) = patches(hp, kernel.ggml_type(), image)?;
        let t_n = gw * gh;
        let patch_len = 3 * ps * ps;
        let mut x = vec![vec![0f32; ev]; t_n];
        for o in 0..ev {
            // One output channel's kernel: 3·ps rows of ps.
            let mut k = self.reader.rows(kernel, o * 3 * ps, 3 * ps)?;
            if round {
                k.iter_mut().for_each(|v| *v = f16_round(*v));
            }
            for (t, xt) in x.iter_mut().enumerate() {
                let p = &patches[t * patch_len..][..patch_len];
                xt[o] = p
                    .iter()
                    .zip(&k)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>() as f32;
            }
        }
        if let Some(b) = self.vector(self.p.optional("v.patch_embd.bias"))? {
            x.iter_mut()
                .for_each(|xt| xt.iter_mut().zip(b.iter()).for_each(|(v, &b)| *v += b));
        }
        let table = self
            .reader
            .rows(self.p.weight("v.position_embd.weight")?, 0, pg * pg)?;
        let pos = if gw == pg && gh == pg {
            table
        } else {
            bilinear(&table, ev, pg, gw, gh)
        };
        for (t, xt) in x.iter_mut().enumerate() {
            xt.iter_mut()
                .zip(&pos[t * ev..][..ev])
                .for_each(|(v, &p)| *v += p);
        }
        for xt in &mut x {
            self.ln("v.pre_ln", xt)?;
        }
        let dh = ev / hp.n_head;
        let rope = Rope {
            n_rot: dh / 2,
            freq_base: ROPE_BASE,
            mode: RopeMode::Normal,
        };
        let shape = AttentionShape {
            n_head: hp.n_head,
            n_head_kv: hp.n_head,
            head_dim_k: dh,
            head_dim_v: dh,
        };
        let ops = |e: family_ops::OpsError| LoadError::Forward(e.to_string());
        for il in 0..hp.n_layer {
            let p = format!("v.blk.{il}.");
            let (mut q, mut k, mut v) = (
                Vec::with_capacity(t_n * ev),
                Vec::with_capacity(t_n * ev),
                Vec::with_capacity(t_n * ev),
            );
            for (t, xt) in x.iter().enumerate() {
                let mut h = xt.clone();
                self.ln(&format!("{p}ln1"), &mut h)?;
                let mut qt = self.linear(
                    &format!("{p}attn_q.weight"),
                    Some(&format!("{p}attn_q.bias")),
                    &h,
                )?;
                let mut kt = self.linear(
                    &format!("{p}attn_k.weight"),
                    Some(&format!("{p}attn_k.bias")),
                    &h,
                )?;
                let vt = self.linear(
                    &format!("{p}attn_v.weight"),
                    Some(&format!("{p}attn_v.bias")),
                    &h,
                )?;
                // 2D RoPE: the first half of a head turns with the column
                // (1-based), the second with the row.
                let (pos_w, pos_h) = (t % gw + 1, t / gw + 1);
                for head in qt.chunks_exact_mut(dh).chain(kt.chunks_exact_mut(dh)) {
                    let (a, b) = head.split_at_mut(dh / 2);
                    family_ops::rope(a, dh / 2, pos_w, &rope).map_err(ops)?;
                    family_ops::rope(b, dh / 2, pos_h, &rope).map_err(ops)?;
                }
                q.extend(qt);
                k.extend(kt);
                v.extend(vt);
            }
            // The block's attention as the op layer's reference computes
            // it (ggml's two products and softmax over an F32 cache, the
            // window as an additive mask).
            let scale = 1.0 / (dh as f32).sqrt();
            let mask = block_mask(il, hp.n_layer, t_n, gw, pg);
            let attended = device_ops::reference::attention(
                &q,
                &k,
                &v,
                t_n,
                &shape,
                &Scores::scale(scale),
                HostAttnMask::Additive {
                    mask: &mask,
                    rows: t_n,
                },
                DType::F32,
            )
            .map_err(|e| LoadError::Forward(e.to_string()))?;
            for (t, a) in attended.chunks_exact(ev).enumerate() {
                let o = self.linear(
                    &format!("{p}attn_out.weight"),
                    Some(&format!("{p}attn_out.bias")),
                    a,
                )?;
                x[t].iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            }
            for xt in &mut x {
                let mut h = xt.clone();
                self.ln(&format!("{p}ln2"), &mut h)?;
                let up = self.linear(
                    &format!("{p}ffn_up.weight"),
                    Some(&format!("{p}ffn_up.bias")),
                    &h,
                )?;
                let act: Vec<f32> = up.into_iter().map(gelu_erf).collect();
                let down = self.linear(
                    &format!("{p}ffn_down.weight"),
                    Some(&format!("{p}ffn_down.bias")),
                    &act,
                )?;
                xt.iter_mut().zip(&down).for_each(|(x, d)| *x += d);
            }
        }
        for xt in &mut x {
            self.ln("v.post_ln", xt)?;
        }
        let mut out = Vec::with_capacity((gw / f) * (gh / f));
        for oy in 0..gh / f {
            for ox in 0..gw / f {
                let mut y = vec![0f32; ev * f * f];
                for ry in 0..f {
                    for rx in 0..f {
                        let s = ry * f + rx;
                        let src = &x[(oy * f + ry) * gw + ox * f + rx];
                        for (c, &val) in src.iter().enumerate() {
                            y[c * f * f + s] = val;
                        }
                    }
                }
                let y: Vec<f32> = self
                    .linear("mm.0.weight", None, &y)?
                    .into_iter()
                    .map(gelu_erf)
                    .collect();
                let y: Vec<f32> = self
                    .linear("mm.1.weight", None, &y)?
                    .into_iter()
                    .map(gelu_erf)
                    .collect();
                out.push(self.linear("mm.2.weight", None, &y)?);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bilinear_keeps_a_grid_of_its_own_size_and_averages_between() {
        // 2x2 grid of one value each: 0 1 / 2 3.
        let t = [0.0, 1.0, 2.0, 3.0];
        assert_eq!(bilinear(&t, 1, 2, 2, 2), t.to_vec());
        let up = bilinear(&t, 1, 2, 4, 1);
        // One row at the vertical centre: mean of the rows, 1 and 2 at the
        // extremes' centres, clamped at the edges.
        assert_eq!(up, vec![1.0, 1.25, 1.75, 2.0]);
    }
}
