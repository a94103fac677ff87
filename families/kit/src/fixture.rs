//! Fixture generators: a model's metadata and tensor table as an editable
//! [`FixtureSpec`] (tests make refused variants from it), written with
//! deterministic bytes per tensor, in memory for tiny fixtures
//! ([`FixtureSpec::writer`]) or generated while writing for models of
//! gigabytes ([`FixtureSpec::streaming_writer`]): the same bytes either way.
//!
//! Values: float tensors hold small finite numbers (names with `norm`: near
//! 1; `ssm_a`: negative); quantized blocks hold pseudo-random quants with
//! their f16 scales set to 0.01 ([`BlockScales::Fixed`]), so every tensor
//! dequantizes to finite numbers, or set per tensor so its values' RMS is
//! `1/sqrt(ne0)` ([`BlockScales::FanIn`], a trained model's magnitude).

use std::path::Path;

use seam::gguf::{GgmlType, GgufError, GgufWriter, Header, Value};
use seam_tools::demo::fill_pseudo_random;

/// One tensor of a fixture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixtureTensor {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ggml_type: GgmlType,
    /// Its dims (GGUF order).
    pub dims: Vec<u64>,
}

/// The ggml types of a GLM-layout FFN's matrices in a fixture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlmFfnTypes {
    /// A dense FFN's gate and up, and its down.
    pub dense: (GgmlType, GgmlType),
    /// The routed gate, up and down stacks.
    pub experts: (GgmlType, GgmlType, GgmlType),
    /// The shared expert's three matrices.
    pub shexp: GgmlType,
}

/// The widths of a GLM-layout FFN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlmFfnWidths {
    /// E.
    pub e: u64,
    /// A dense FFN's width.
    pub n_ff: u64,
    /// An expert's (and the shared expert's) width.
    pub n_ff_exp: u64,
    /// Routed experts.
    pub n_expert: u64,
}

/// Layer `l`'s FFN tensors as the GLM families (glm_moe_dsa, glm5_next)
/// store them: a dense SwiGLU FFN, or (`routed`) the router
/// (`ffn_gate_inp`, F32), the selection bias (`exp_probs_b`), the gate, up
/// and down expert stacks and one shared expert, in the files' order.
pub fn glm_ffn_tensors(
    l: u64,
    w: GlmFfnWidths,
    routed: bool,
    ty: &GlmFfnTypes,
) -> Vec<FixtureTensor> {
    let GlmFfnWidths {
        e,
        n_ff,
        n_ff_exp,
        n_expert,
    } = w;
    let t = |name: &str, ggml_type: GgmlType, dims: &[u64]| FixtureTensor {
        name: format!("blk.{l}.{name}"),
        ggml_type,
        dims: dims.to_vec(),
    };
    if !routed {
        return vec![
            t("ffn_gate.weight", ty.dense.0, &[e, n_ff]),
            t("ffn_up.weight", ty.dense.0, &[e, n_ff]),
            t("ffn_down.weight", ty.dense.1, &[n_ff, e]),
        ];
    }
    vec![
        t("ffn_gate_inp.weight", GgmlType::F32, &[e, n_expert]),
        t("exp_probs_b.bias", GgmlType::F32, &[n_expert]),
        t(
            "ffn_gate_exps.weight",
            ty.experts.0,
            &[e, n_ff_exp, n_expert],
        ),
        t("ffn_up_exps.weight", ty.experts.1, &[e, n_ff_exp, n_expert]),
        t(
            "ffn_down_exps.weight",
            ty.experts.2,
            &[n_ff_exp, e, n_expert],
        ),
        t("ffn_gate_shexp.weight", ty.shexp, &[e, n_ff_exp]),
        t("ffn_up_shexp.weight", ty.shexp, &[e, n_ff_exp]),
        t("ffn_down_shexp.weight", ty.shexp, &[n_ff_exp, e]),
    ]
}

/// How a fixture's quantized blocks are scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BlockScales {
    /// Every f16 block scale 0.01: weights of order 1 (tiny fixtures,
    /// whose few layers of small width never grow far).
    #[default]
    Fixed,
    /// Each tensor's f16 block scales set so that its dequantized values'
    /// RMS is about `1/sqrt(ne0)`, as a trained model's are: a product
    /// keeps its input's magnitude, so activations stay of order 1 over
    /// many layers of a wide model. With [`BlockScales::Fixed`] a product
    /// of width 2048 multiplies its input's RMS by about 33 (Q8_0) and the
    /// residual stream of a generated qwen4exp reached an RMS of 40,000
    /// after two layers, where any two f32 implementations part ways
    /// (their last bits flip the F16 scale of a rounded activation block,
    /// then an expert pick).
    ///
    /// `gain` multiplies that RMS (1: a trained model's magnitude; more:
    /// the larger standard deviations of llama.cpp's `test-llama-archs`
    /// models, whose products grow their inputs).
    FanIn {
        /// The RMS is `gain/sqrt(ne0)`.
        gain: u16,
    },
}

/// A fixture before it is written: metadata and tensor table, editable.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct FixtureSpec {
    /// Metadata pairs in file order.
    pub metadata: Vec<(String, Value)>,
    /// Tensors in file order.
    pub tensors: Vec<FixtureTensor>,
    /// How the quantized tensors' blocks are scaled.
    pub block_scales: BlockScales,
    /// Mixed into every tensor's pseudo-random stream: 0 gives the bytes
    /// fixtures always had; another seed, another model of the same
    /// shape.
    pub seed: u64,
}

impl FixtureSpec {
    /// A fixture of the metadata and tensor table of `header` (another
    /// model's, e.g. one of llama.cpp's `test-llama-archs` models), whose
    /// bytes the generator then writes: the same shape, this project's
    /// values. `general.alignment` is left out (the writer aligns to its
    /// default and records no key).
    pub fn from_header(header: &Header) -> FixtureSpec {
        FixtureSpec {
            metadata: header
                .metadata
                .iter()
                .filter(|(k, _)| k != "general.alignment")
                .cloned()
                .collect(),
            tensors: header
                .tensors
                .iter()
                .map(|t| FixtureTensor {
                    name: t.name.clone(),
                    ggml_type: t.ggml_type,
                    dims: t.dims.clone(),
                })
                .collect(),
            ..FixtureSpec::default()
        }
    }

    /// Gives each tensor named in `types` that type (a quantizer's choice
    /// per tensor, e.g. what `llama-quantize` chose for a file type).
    ///
    /// # Errors
    ///
    /// A name is not a tensor of this fixture, or a tensor's rows are not
    /// whole blocks of its new type.
    pub fn retype<'a>(
        &mut self,
        types: impl IntoIterator<Item = (&'a str, GgmlType)>,
    ) -> Result<(), String> {
        for (name, ty) in types {
            let t = self
                .tensor_mut(name)
                .ok_or_else(|| format!("no tensor {name:?} to give type {ty}"))?;
            let ne0 = t.dims.first().copied().unwrap_or(1);
            if ty.row_bytes(ne0).is_none() {
                return Err(format!(
                    "{name}: a row of {ne0} is not whole blocks of {ty} ({} elements a block)",
                    ty.block_size()
                ));
            }
            t.ggml_type = ty;
        }
        Ok(())
    }

    /// The tensor named `name`.
    pub fn tensor_mut(&mut self, name: &str) -> Option<&mut FixtureTensor> {
        self.tensors.iter_mut().find(|t| t.name == name)
    }

    /// Removes the tensor `name`; whether it was there.
    pub fn remove_tensor(&mut self, name: &str) -> bool {
        let before = self.tensors.len();
        self.tensors.retain(|t| t.name != name);
        self.tensors.len() != before
    }

    /// Adds a tensor at the end.
    pub fn add_tensor(&mut self, name: &str, ggml_type: GgmlType, dims: &[u64]) {
        self.tensors.push(FixtureTensor {
            name: name.to_owned(),
            ggml_type,
            dims: dims.to_vec(),
        });
    }

    /// Removes the metadata key `key` (full name); whether it was there.
    pub fn remove_key(&mut self, key: &str) -> bool {
        let before = self.metadata.len();
        self.metadata.retain(|(k, _)| k != key);
        self.metadata.len() != before
    }

    /// Sets (or adds) the metadata key `key` (full name).
    pub fn set_key(&mut self, key: &str, value: Value) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key.to_owned(), value)),
        }
    }

    /// `general.architecture` (empty when absent or not a string).
    fn architecture(&self) -> String {
        match self
            .metadata
            .iter()
            .find(|(k, _)| k == "general.architecture")
        {
            Some((_, Value::String(a))) => a.clone(),
            _ => String::new(),
        }
    }

    /// This fixture with no vocabulary of its own, as llama.cpp runs a
    /// model without one: `tokenizer.ggml.model` `none` (llama.cpp then
    /// makes `ARCH.vocab_size` dummy tokens, set here to the rows of
    /// `token_embd.weight`) and no other `tokenizer.*` key. Token ids in,
    /// token ids out; a generated benchmark model is written this way.
    pub fn without_vocabulary(&self) -> FixtureSpec {
        let mut spec = self.clone();
        spec.metadata.retain(|(k, _)| !k.starts_with("tokenizer."));
        spec.metadata.push((
            "tokenizer.ggml.model".to_owned(),
            Value::String("none".into()),
        ));
        let arch = self.architecture();
        let rows = self
            .tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .and_then(|t| t.dims.get(1).copied());
        if let Some(n) = rows {
            spec.set_key(&format!("{arch}.vocab_size"), Value::U32(n as u32));
        }
        spec
    }

    /// This fixture with the tokenizer of another GGUF file (`vocab`, its
    /// header): its `tokenizer.*` keys in place of the fixture's, and the
    /// tensors of one row per token (`token_embd.weight`, `output.weight`)
    /// and `ARCH.vocab_size` sized to its vocabulary. The oracle's
    /// `tools/oracle/add_tokenizer.py` grafts the other way round.
    ///
    /// # Errors
    ///
    /// `vocab` has no `tokenizer.ggml.tokens` list.
    pub fn with_tokenizer(&self, vocab: &seam::gguf::Header) -> Result<FixtureSpec, String> {
        let n_tokens = match vocab.get("tokenizer.ggml.tokens") {
            Some(Value::Array(a)) => a.len() as u64,
            _ => return Err("the vocabulary file has no tokenizer.ggml.tokens".into()),
        };
        let mut spec = self.clone();
        spec.metadata.retain(|(k, _)| !k.starts_with("tokenizer."));
        spec.metadata.extend(
            vocab
                .metadata
                .iter()
                .filter(|(k, _)| k.starts_with("tokenizer."))
                .cloned(),
        );
        let arch = self.architecture();
        let vocab_size = format!("{arch}.vocab_size");
        if spec.metadata.iter().any(|(k, _)| *k == vocab_size) {
            spec.set_key(&vocab_size, Value::U32(n_tokens as u32));
        }
        for name in ["token_embd.weight", "output.weight"] {
            if let Some(t) = spec.tensor_mut(name)
                && t.dims.len() == 2
            {
                t.dims[1] = n_tokens;
            }
        }
        Ok(spec)
    }

    /// The writer for this fixture, every tensor's bytes in memory.
    ///
    /// # Panics
    ///
    /// A tensor's ne0 is not a whole number of its type's blocks (fixtures
    /// and their variants keep them whole).
    pub fn writer(&self) -> GgufWriter {
        let mut w = self.metadata_writer();
        for t in &self.tensors {
            w.add_tensor(t.name.clone(), t.ggml_type, &t.dims, self.bytes_of(t))
                .expect("fixture tensors have whole blocks");
        }
        w
    }

    /// The writer for this fixture with every tensor's bytes generated
    /// while writing (a model of gigabytes is never held in memory); the
    /// bytes equal [`FixtureSpec::writer`]'s.
    ///
    /// # Errors
    ///
    /// A tensor's shape is invalid for its type.
    pub fn streaming_writer(&self) -> Result<GgufWriter, GgufError> {
        let mut w = self.metadata_writer();
        for t in &self.tensors {
            let (name, ty, seed) = (t.name.clone(), t.ggml_type, self.seed);
            let scale = block_scale(self.block_scales, ty, &t.dims);
            let fill = Box::new(move |offset: u64, buf: &mut [u8]| {
                fill_scaled_tensor(&name, seed, ty, scale, offset, buf)
            });
            w.add_tensor_fill(t.name.clone(), t.ggml_type, &t.dims, fill)?;
        }
        Ok(w)
    }

    /// Writes the fixture (in memory) to `path`; returns its size.
    ///
    /// # Errors
    ///
    /// The file cannot be written.
    pub fn write_file(&self, path: &Path) -> Result<u64, GgufError> {
        self.writer().write_file(path)
    }

    /// The bytes of tensor `t` of this fixture.
    fn bytes_of(&self, t: &FixtureTensor) -> Vec<u8> {
        let scale = block_scale(self.block_scales, t.ggml_type, &t.dims);
        scaled_tensor_bytes(&t.name, self.seed, t.ggml_type, &t.dims, scale)
    }

    fn metadata_writer(&self) -> GgufWriter {
        let mut w = GgufWriter::new();
        for (k, v) in &self.metadata {
            w.add_metadata(k.clone(), v.clone());
        }
        w
    }
}

/// The pseudo-random stream of tensor `name` of a fixture of `seed`.
fn name_seed(name: &str, seed: u64) -> u64 {
    // FNV-1a; seed 0 keeps every fixture's bytes as they were.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    h ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// f16 bits of 0.01.
const SCALE_F16: [u8; 2] = 0x211F_u16.to_le_bytes();

/// f16 bits of 1.
const UNIT_SCALE_F16: [u8; 2] = 0x3C00_u16.to_le_bytes();

/// The f16 block scale of a tensor of `ty` and `dims` under `scales`.
fn block_scale(scales: BlockScales, ty: GgmlType, dims: &[u64]) -> [u8; 2] {
    match (scales, dims.first()) {
        (BlockScales::FanIn { gain }, Some(&ne0)) if ne0 > 0 && !is_float(ty) => {
            fan_in_scale(ty, ne0, gain).unwrap_or(SCALE_F16)
        }
        _ => SCALE_F16,
    }
}

/// Whether `ty` holds plain floats (no block scales).
fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// The f16 scale that gives pseudo-random blocks of `ty` an RMS of
/// `gain/sqrt(ne0)`: the RMS at scale 1, measured on 64 blocks (the values
/// are linear in the scale), divided out. `None` where the type does not
/// dequantize or its blocks are all zero.
fn fan_in_scale(ty: GgmlType, ne0: u64, gain: u16) -> Option<[u8; 2]> {
    let ts = ty.type_size();
    let n_blocks = 64u64;
    let mut raw = vec![0u8; (ts * n_blocks) as usize];
    fill_scaled_tensor("fan-in probe", 0, ty, UNIT_SCALE_F16, 0, &mut raw);
    let mut out = vec![0f32; (ty.block_size() * n_blocks) as usize];
    family_ops::dequantize(ty, &raw, &mut out).ok()?;
    let rms = (out
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        / out.len() as f64)
        .sqrt();
    let scale = f64::from(gain) / ((ne0 as f64).sqrt() * rms);
    (scale.is_finite() && scale > 0.0).then(|| half::f16::from_f64(scale).to_le_bytes())
}

fn f32_to_f16_bits(x: f32) -> u16 {
    // Values here are small and normal in f16, or zero.
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    if !(1..31).contains(&exp) {
        return sign;
    }
    let mant = ((bits >> 13) & 0x3ff) as u16;
    sign | ((exp as u16) << 10) | mant
}

/// The float value of element `word` (a pseudo-random 32-bit word) of
/// tensor `name`.
fn float_value(name: &str, word: [u8; 4]) -> f32 {
    // In [-1, 1).
    let u = u32::from_le_bytes(word);
    let x = (u >> 8) as f32 / (1u32 << 23) as f32 - 1.0;
    if name.ends_with("ssm_a") {
        -(0.5 + 0.5 * x.abs())
    } else if name.contains("norm") {
        1.0 + 0.1 * x
    } else {
        0.1 * x
    }
}

/// The byte offsets of the f16 scales (and mins) in one block of `ty`: a
/// pseudo-random f16 there could be infinite or NaN.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[0],
    }
}

/// Fills `buf` with the bytes of tensor `name` (of type `ty`) from byte
/// `offset` of the tensor on.
pub fn fill_tensor(name: &str, ty: GgmlType, offset: u64, buf: &mut [u8]) {
    fill_scaled_tensor(name, 0, ty, SCALE_F16, offset, buf);
}

/// [`fill_tensor`] of a fixture of `seed`, with the quantized blocks' f16
/// scales set to `scale`.
fn fill_scaled_tensor(
    name: &str,
    seed: u64,
    ty: GgmlType,
    scale: [u8; 2],
    offset: u64,
    buf: &mut [u8],
) {
    let seed = name_seed(name, seed);
    let elem_bytes: u64 = match ty {
        GgmlType::F32 => 4,
        GgmlType::F16 | GgmlType::BF16 => 2,
        _ => 0,
    };
    if elem_bytes == 0 {
        fill_pseudo_random(seed, offset, buf);
        let ts = ty.type_size();
        let end = offset + buf.len() as u64;
        let mut block = offset / ts;
        while block * ts < end {
            for &at in scale_offsets(ty) {
                for (i, &b) in scale.iter().enumerate() {
                    let pos = block * ts + at as u64 + i as u64;
                    if (offset..end).contains(&pos) {
                        buf[(pos - offset) as usize] = b;
                    }
                }
            }
            block += 1;
        }
        return;
    }
    let first = offset / elem_bytes;
    let last = (offset + buf.len() as u64).div_ceil(elem_bytes);
    let mut words = vec![0u8; ((last - first) * 4) as usize];
    fill_pseudo_random(seed, first * 4, &mut words);
    for (k, word) in words.chunks_exact(4).enumerate() {
        let x = float_value(name, [word[0], word[1], word[2], word[3]]);
        let bytes: Vec<u8> = match ty {
            GgmlType::F32 => x.to_le_bytes().to_vec(),
            GgmlType::F16 => f32_to_f16_bits(x).to_le_bytes().to_vec(),
            _ => ((x.to_bits() >> 16) as u16).to_le_bytes().to_vec(),
        };
        let elem_start = (first + k as u64) * elem_bytes;
        for (i, &b) in bytes.iter().enumerate() {
            let pos = elem_start + i as u64;
            if pos >= offset && pos < offset + buf.len() as u64 {
                buf[(pos - offset) as usize] = b;
            }
        }
    }
}

/// The deterministic bytes of fixture tensor `name`.
///
/// # Panics
///
/// `dims[0]` is not a whole number of `ty`'s blocks.
pub fn tensor_bytes(name: &str, ty: GgmlType, dims: &[u64]) -> Vec<u8> {
    scaled_tensor_bytes(name, 0, ty, dims, SCALE_F16)
}

fn scaled_tensor_bytes(
    name: &str,
    seed: u64,
    ty: GgmlType,
    dims: &[u64],
    scale: [u8; 2],
) -> Vec<u8> {
    let n_elems: u64 = dims.iter().product();
    let n_bytes = ty.row_bytes(dims[0]).expect("whole blocks") * (n_elems / dims[0]);
    let mut raw = vec![0u8; n_bytes as usize];
    fill_scaled_tensor(name, seed, ty, scale, 0, &mut raw);
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_vocabulary_the_tokenizer_is_none_and_the_vocabulary_size_the_embedding_rows() {
        let mut spec = FixtureSpec {
            metadata: vec![
                ("general.architecture".into(), Value::String("arch".into())),
                ("tokenizer.ggml.model".into(), Value::String("test".into())),
                ("tokenizer.ggml.pre".into(), Value::String("x".into())),
            ],
            ..FixtureSpec::default()
        };
        spec.add_tensor("token_embd.weight", GgmlType::F32, &[8, 300]);
        let s = spec.without_vocabulary();
        let keys: Vec<(&str, &Value)> = s.metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
        assert_eq!(
            keys,
            vec![
                ("general.architecture", &Value::String("arch".into())),
                ("tokenizer.ggml.model", &Value::String("none".into())),
                ("arch.vocab_size", &Value::U32(300)),
            ]
        );
        assert_eq!(s.tensors, spec.tensors);
    }

    #[test]
    fn a_grafted_tokenizer_replaces_the_keys_and_sizes_the_vocabulary_tensors() {
        let mut spec = FixtureSpec::default();
        spec.set_key("general.architecture", Value::String("fam".into()));
        spec.set_key("fam.vocab_size", Value::U32(4));
        spec.set_key("tokenizer.ggml.model", Value::String("test".into()));
        spec.set_key("tokenizer.ggml.eot_token_id", Value::U32(3));
        spec.add_tensor("token_embd.weight", GgmlType::F32, &[8, 4]);
        spec.add_tensor("output.weight", GgmlType::F32, &[8, 4]);
        spec.add_tensor("blk.0.ffn_up.weight", GgmlType::F32, &[8, 4]);
        let mut vocab = GgufWriter::new();
        vocab.add_metadata("general.architecture", Value::String("llama".into()));
        vocab.add_metadata("tokenizer.ggml.model", Value::String("gpt2".into()));
        vocab.add_metadata(
            "tokenizer.ggml.tokens",
            Value::Array(seam::gguf::Array::String(vec!["a".into(); 6])),
        );
        let bytes = vocab.to_bytes();
        let header = seam::gguf::parse_header(&bytes, Path::new("v.gguf"), 0).expect("a header");
        let g = spec.with_tokenizer(&header).expect("grafts");
        let key = |k: &str| {
            g.metadata
                .iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            key("tokenizer.ggml.model"),
            Some(Value::String("gpt2".into()))
        );
        assert_eq!(
            key("tokenizer.ggml.eot_token_id"),
            None,
            "the fixture's own keys go"
        );
        assert_eq!(
            key("general.architecture"),
            Some(Value::String("fam".into()))
        );
        assert_eq!(key("fam.vocab_size"), Some(Value::U32(6)));
        let dims = |n: &str| {
            g.tensors
                .iter()
                .find(|t| t.name == n)
                .map(|t| t.dims.clone())
        };
        assert_eq!(dims("token_embd.weight"), Some(vec![8, 6]));
        assert_eq!(dims("output.weight"), Some(vec![8, 6]));
        assert_eq!(dims("blk.0.ffn_up.weight"), Some(vec![8, 4]));
        let empty = seam::gguf::parse_header(&GgufWriter::new().to_bytes(), Path::new("e"), 0)
            .expect("a header");
        assert!(spec.with_tokenizer(&empty).is_err());
    }

    #[test]
    fn chunked_fills_equal_the_whole_and_dequantize_to_finite_numbers() {
        for (ty, dims) in [
            (GgmlType::F32, vec![48u64, 3]),
            (GgmlType::F16, vec![48, 3]),
            (GgmlType::BF16, vec![48, 3]),
            (GgmlType::Q4_K, vec![256, 3]),
            (GgmlType::Q6_K, vec![256, 3]),
            (GgmlType::Q8_0, vec![64, 3]),
            // The types of llama-quantize's mixes: a pseudo-random f16
            // where a block keeps a scale or a min is infinite or NaN in
            // one block of 32, so 64 blocks find a wrong offset.
            (GgmlType::Q4_0, vec![256, 8]),
            (GgmlType::Q4_1, vec![256, 8]),
            (GgmlType::Q5_0, vec![256, 8]),
            (GgmlType::Q5_1, vec![256, 8]),
            (GgmlType::Q2_K, vec![256, 64]),
            (GgmlType::Q3_K, vec![256, 64]),
            (GgmlType::Q5_K, vec![256, 64]),
            (GgmlType::IQ4_NL, vec![256, 8]),
            (GgmlType::IQ4_XS, vec![256, 64]),
        ] {
            let whole = tensor_bytes("blk.0.x_norm.weight", ty, &dims);
            for chunk in [1usize, 3, 7, 100] {
                let mut pieces = vec![0u8; whole.len()];
                for (i, c) in pieces.chunks_mut(chunk).enumerate() {
                    fill_tensor("blk.0.x_norm.weight", ty, (i * chunk) as u64, c);
                }
                assert_eq!(pieces, whole, "{ty} in chunks of {chunk}");
            }
            let mut out = vec![0f32; dims.iter().product::<u64>() as usize];
            family_ops::dequantize(ty, &whole, &mut out).unwrap();
            assert!(out.iter().all(|v| v.is_finite()), "{ty}");
        }
    }

    fn rms(ty: GgmlType, bytes: &[u8], n: usize) -> f64 {
        let mut out = vec![0f32; n];
        family_ops::dequantize(ty, bytes, &mut out).unwrap();
        (out.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / n as f64).sqrt()
    }

    /// `FanIn` gives each quantized tensor an RMS near `1/sqrt(ne0)`
    /// (within the f16 rounding of its scale and the sampling), streamed
    /// and in memory alike; float tensors and `Fixed` keep today's bytes.
    #[test]
    fn fan_in_scales_give_quantized_tensors_an_rms_of_one_over_root_ne0() {
        for (ty, ne0) in [
            (GgmlType::Q8_0, 2048u64),
            (GgmlType::Q8_0, 512),
            (GgmlType::Q4_K, 2048),
            (GgmlType::Q6_K, 2048),
            (GgmlType::Q4_0, 256),
        ] {
            let dims = [ne0, 16];
            let mut spec = FixtureSpec::default();
            spec.add_tensor("blk.0.ffn_up.weight", ty, &dims);
            let fixed = spec.bytes_of(&spec.tensors[0]);
            assert_eq!(fixed, tensor_bytes("blk.0.ffn_up.weight", ty, &dims));
            spec.block_scales = BlockScales::FanIn { gain: 1 };
            let scaled = spec.bytes_of(&spec.tensors[0]);
            let n = (ne0 * 16) as usize;
            let want = 1.0 / (ne0 as f64).sqrt();
            let got = rms(ty, &scaled, n);
            assert!(
                (got / want - 1.0).abs() < 0.1,
                "{ty} ne0 {ne0}: rms {got}, want {want}"
            );
            assert_ne!(fixed, scaled, "{ty}: FanIn changes the block scales");
            assert_eq!(
                spec.streaming_writer().unwrap().to_bytes(),
                spec.writer().to_bytes(),
                "{ty}: streamed bytes equal the written"
            );
        }
        let mut spec = FixtureSpec::default();
        spec.add_tensor("blk.0.ffn_up.weight", GgmlType::F32, &[64, 2]);
        let fixed = spec.bytes_of(&spec.tensors[0]);
        spec.block_scales = BlockScales::FanIn { gain: 1 };
        assert_eq!(spec.bytes_of(&spec.tensors[0]), fixed);
    }
}
