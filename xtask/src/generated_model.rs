//! `cargo xtask generated-model --base BASE.gguf --types-from Q.gguf
//! --file-type T --seed N --gain G --out OUT.gguf`: writes the model of a
//! generated golden (`family_kit::golden::Recipe`): `BASE`'s metadata and
//! tensor table (one of llama.cpp's `test-llama-archs` models, committed),
//! each tensor of the type `llama-quantize` gave it in `Q` (its output for
//! file type `T`), and this project's pseudo-random values of seed `N` and
//! gain `G`. Prints the recipe and the model's sha256 as one JSON object,
//! which `tools/oracle/generated_goldens.py` writes into the golden; the
//! test makes the same file again from the recipe and checks the sha256.
//!
//! `cargo xtask generated-model --golden G.golden.json --out OUT.gguf`:
//! writes the model of an existing golden from its recipe (the sha256
//! checked), for a run elsewhere (tools/h200_goldens_cuda.sh).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use family_kit::golden::{Generated, Recipe, sha256_hex};
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;

struct Args {
    base: PathBuf,
    types_from: PathBuf,
    file_type: String,
    seed: u64,
    gain: u16,
    out: PathBuf,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut it = args.iter();
    let (mut base, mut types_from, mut file_type, mut seed, mut gain, mut out) =
        (None, None, None, None, None, None);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--base" => base = Some(PathBuf::from(value)),
            "--types-from" => types_from = Some(PathBuf::from(value)),
            "--file-type" => file_type = Some(value.clone()),
            "--seed" => seed = Some(value.parse().context("--seed")?),
            "--gain" => gain = Some(value.parse().context("--gain")?),
            "--out" => out = Some(PathBuf::from(value)),
            _ => bail!("unknown flag {flag}"),
        }
    }
    Ok(Args {
        base: base.context("--base is required")?,
        types_from: types_from.context("--types-from is required")?,
        file_type: file_type.context("--file-type is required")?,
        seed: seed.context("--seed is required")?,
        gain: gain.context("--gain is required")?,
        out: out.context("--out is required")?,
    })
}

fn open(path: &Path) -> Result<GgufModel> {
    GgufModel::open(path, MapOptions::default()).with_context(|| path.display().to_string())
}

pub fn run(args: &[String]) -> Result<()> {
    if args.first().map(String::as_str) == Some("--golden") {
        let [_, golden, flag, out] = args else {
            bail!("usage: generated-model --golden G.golden.json --out OUT.gguf");
        };
        if flag != "--out" {
            bail!("usage: generated-model --golden G.golden.json --out OUT.gguf");
        }
        let g = Generated::read(Path::new(golden)).map_err(anyhow::Error::msg)?;
        return g.write_model(Path::new(out)).map_err(anyhow::Error::msg);
    }
    let a = parse(args)?;
    let base = open(&a.base)?;
    let quantized = open(&a.types_from)?;
    // The types llama-quantize changed; a tensor it kept stays the base's.
    let mut types = BTreeMap::new();
    for t in quantized.tensors() {
        let b = base
            .tensor(&t.name)
            .with_context(|| format!("{} has no tensor {}", a.base.display(), t.name))?;
        if b.dims != t.dims {
            bail!(
                "{}: dims {:?} in the base, {:?} quantized",
                t.name,
                b.dims,
                t.dims
            );
        }
        if b.ggml_type != t.ggml_type {
            types.insert(t.name.clone(), t.ggml_type.name().to_owned());
        }
    }
    let recipe = Recipe {
        base: a
            .base
            .file_name()
            .context("--base has no file name")?
            .to_string_lossy()
            .into_owned(),
        seed: a.seed,
        gain: a.gain,
        file_type: a.file_type,
        types,
    };
    let dir = a.base.parent().unwrap_or(Path::new("."));
    let bytes = recipe
        .spec(dir)
        .map_err(anyhow::Error::msg)?
        .writer()
        .to_bytes();
    std::fs::write(&a.out, &bytes).with_context(|| a.out.display().to_string())?;
    let json = serde_json::json!({
        "recipe": {
            "base": recipe.base,
            "seed": recipe.seed,
            "gain": recipe.gain,
            "file_type": recipe.file_type,
            "types": recipe.types,
        },
        "sha256": sha256_hex(&bytes),
        "bytes": bytes.len(),
    });
    println!("{json}");
    Ok(())
}
