//! `cargo xtask gen-gguf --size 32GiB --out FILE [--seed N]`: a valid GGUF
//! of about the asked size with realistic tensors (a MoE-shaped model: a few
//! hundred tensors of mixed ggml types, expert stacks, one embedding table
//! over 1 GiB when the size allows), pseudo-random bytes, written at disk
//! speed without holding the model in memory.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

/// Parses `32GiB`, `300MiB`, `1.5GiB`, `4096` (bytes).
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let (num, unit) = t
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or((t, ""), |i| t.split_at(i));
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        _ => bail!("unknown size unit {unit:?} in {text:?} (use B, KiB, MiB, GiB, TiB)"),
    };
    let value: f64 = num
        .trim()
        .parse()
        .with_context(|| format!("size {text:?}"))?;
    if !(value.is_finite() && value > 0.0) {
        bail!("size {text:?} must be positive");
    }
    Ok((value * scale as f64) as u64)
}

/// Runs `gen-gguf` with its arguments.
pub fn run(args: &[String]) -> Result<()> {
    let mut size = None;
    let mut out = None;
    let mut seed = 0u64;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--size" => size = Some(parse_size(value()?)?),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--seed" => seed = value()?.parse().context("--seed")?,
            other => bail!("unknown argument {other:?}"),
        }
    }
    let (Some(size), Some(out)) = (size, out) else {
        bail!("usage: cargo xtask gen-gguf --size 32GiB --out FILE [--seed N]");
    };
    let w = seam_tools::demo::generated_model(size, seed);
    let start = std::time::Instant::now();
    let n = w.write_file(&out)?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "wrote {} ({} bytes) in {:.1} s ({:.2} GB/s)",
        out.display(),
        n,
        secs,
        n as f64 / secs / 1e9
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("32GiB").unwrap(), 32 << 30);
        assert_eq!(parse_size("300MiB").unwrap(), 300 << 20);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("-1GiB").is_err());
    }

    #[test]
    fn model_has_the_asked_size_and_shape() {
        for size in [64u64 << 20, 300 << 20, 32 << 30] {
            let w = seam_tools::demo::generated_model(size, 1);
            let got = w.file_size();
            assert!(
                got <= size + (1 << 20) && got + (8 << 20) >= size,
                "{size}: {got}"
            );
        }
        let w = seam_tools::demo::generated_model(32 << 30, 1);
        let big = w.tensor_sizes();
        assert!(big.len() > 200 && big.len() < 1000, "{} tensors", big.len());
        assert!(
            big.iter().any(|(_, _, n)| *n > 1 << 30),
            "one tensor over 1 GiB"
        );
        let types: std::collections::HashSet<_> = big.iter().map(|(_, t, _)| *t).collect();
        assert!(types.len() >= 5, "{types:?}");
    }
}
