//! Models made in code: the built-in demo model (what the CLI writes when no
//! file is given, so the README's main command runs anywhere) and generated
//! models of any size for benchmarks and residency tests.

use seam::gguf::{GgmlType, GgufWriter, Value};

/// A deterministic pseudo-random byte stream (SplitMix64), so fixtures and
/// generated models are reproducible without a dependency.
pub fn fill_pseudo_random(seed: u64, offset: u64, buf: &mut [u8]) {
    let mut word_index = offset / 8;
    let mut skip = (offset % 8) as usize;
    let mut i = 0;
    while i < buf.len() {
        let mut z = seed
            .wrapping_add(word_index.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        for &b in &z.to_le_bytes()[skip..] {
            if i == buf.len() {
                break;
            }
            buf[i] = b;
            i += 1;
        }
        skip = 0;
        word_index += 1;
    }
}

/// Bytes of a tensor of `n` bytes generated from `seed`.
pub fn pseudo_random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    fill_pseudo_random(seed, 0, &mut v);
    v
}

/// Reads one byte of every page of `bytes`, so each is mapped in this
/// process: how tests set up a mapping that is resident before the seam
/// stages from it. (A load never does this: its prefault is
/// `MAP_POPULATE`, not a loop that touches pages.)
pub fn fault_in_pages(bytes: &[u8]) {
    let page = seam::borrow::page_size() as usize;
    let sum = (0..bytes.len())
        .step_by(page)
        .fold(0u8, |acc, i| acc ^ bytes[i]);
    std::hint::black_box(sum);
}

/// The demo model: a two-layer toy with mixed ggml types (about 1 MiB).
pub fn demo_model() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("seam-demo".into()))
        .add_metadata("general.name", Value::String("seam built-in demo".into()))
        .add_metadata("seam-demo.block_count", Value::U32(2))
        .add_metadata("seam-demo.embedding_length", Value::U32(256));
    let mut add = |name: &str, ty: GgmlType, dims: &[u64], seed: u64| {
        let n = ty.row_bytes(dims[0]).expect("whole blocks") * dims[1..].iter().product::<u64>();
        w.add_tensor(name, ty, dims, pseudo_random_bytes(seed, n as usize))
            .expect("demo tensors are valid");
    };
    add("token_embd.weight", GgmlType::Q8_0, &[256, 512], 1);
    for l in 0..2u64 {
        add(
            &format!("blk.{l}.attn_norm.weight"),
            GgmlType::F32,
            &[256],
            10 + l,
        );
        add(
            &format!("blk.{l}.attn_qkv.weight"),
            GgmlType::Q4_K,
            &[256, 768],
            20 + l,
        );
        add(
            &format!("blk.{l}.attn_output.weight"),
            GgmlType::Q6_K,
            &[256, 256],
            30 + l,
        );
        add(
            &format!("blk.{l}.ffn_up_exps.weight"),
            GgmlType::IQ4_NL,
            &[256, 512, 4],
            40 + l,
        );
        add(
            &format!("blk.{l}.ffn_down_exps.weight"),
            GgmlType::Q5_K,
            &[512, 256, 4],
            50 + l,
        );
    }
    add("output_norm.weight", GgmlType::F32, &[256], 60);
    add("output.weight", GgmlType::F16, &[256, 512], 61);
    w
}

struct Shape {
    hidden: u64,
    ffn: u64,
    experts: u64,
    vocab: u64,
}

fn bytes_of(ty: GgmlType, dims: &[u64]) -> u64 {
    ty.row_bytes(dims[0]).expect("whole blocks") * dims[1..].iter().product::<u64>()
}

/// The tensors of one layer: (name suffix, type, dims).
fn layer(s: &Shape) -> Vec<(&'static str, GgmlType, Vec<u64>)> {
    let (h, f, e) = (s.hidden, s.ffn, s.experts);
    vec![
        ("attn_norm.weight", GgmlType::F32, vec![h]),
        ("attn_q.weight", GgmlType::Q5_K, vec![h, h]),
        ("attn_k.weight", GgmlType::Q8_0, vec![h, h / 4]),
        ("attn_v.weight", GgmlType::Q8_0, vec![h, h / 4]),
        ("attn_output.weight", GgmlType::Q6_K, vec![h, h]),
        ("ffn_norm.weight", GgmlType::F32, vec![h]),
        ("ffn_gate_inp.weight", GgmlType::F32, vec![h, e]),
        ("ffn_gate_exps.weight", GgmlType::IQ2_XXS, vec![h, f, e]),
        ("ffn_up_exps.weight", GgmlType::IQ2_XXS, vec![h, f, e]),
        ("ffn_down_exps.weight", GgmlType::IQ4_NL, vec![f, h, e]),
    ]
}

/// A generated model of about `size` bytes: MoE-shaped (attention, norms,
/// router, expert stacks of mixed ggml types), one embedding table over
/// 1 GiB when `size` is at least 8 GiB, pseudo-random bytes from `seed`
/// filled while writing (nothing is held in memory).
pub fn generated_model(size: u64, seed: u64) -> GgufWriter {
    let shape = if size >= 8 << 30 {
        Shape {
            hidden: 4096,
            ffn: 1536,
            experts: 128,
            vocab: 262_144,
        }
    } else {
        Shape {
            hidden: 1024,
            ffn: 512,
            experts: 32,
            vocab: 32_768,
        }
    };
    let mut tensors: Vec<(String, GgmlType, Vec<u64>)> = Vec::new();
    let mut total = 0u64;
    let push = |tensors: &mut Vec<_>, total: &mut u64, name: String, ty, dims: Vec<u64>| {
        *total += bytes_of(ty, &dims);
        tensors.push((name, ty, dims));
    };
    push(
        &mut tensors,
        &mut total,
        "token_embd.weight".into(),
        GgmlType::Q8_0,
        vec![shape.hidden, shape.vocab],
    );
    let per_layer: u64 = layer(&shape).iter().map(|(_, t, d)| bytes_of(*t, d)).sum();
    let tail = bytes_of(GgmlType::Q6_K, &[shape.hidden, shape.vocab]) + shape.hidden * 4;
    let mut n = 0;
    while total + per_layer + tail <= size {
        for (suffix, ty, dims) in layer(&shape) {
            push(
                &mut tensors,
                &mut total,
                format!("blk.{n}.{suffix}"),
                ty,
                dims,
            );
        }
        n += 1;
    }
    push(
        &mut tensors,
        &mut total,
        "output_norm.weight".into(),
        GgmlType::F32,
        vec![shape.hidden],
    );
    if total + tail - shape.hidden * 4 <= size {
        push(
            &mut tensors,
            &mut total,
            "output.weight".into(),
            GgmlType::Q6_K,
            vec![shape.hidden, shape.vocab],
        );
    }
    // Fill what is left with one Q8_0 tensor, so the file has about the size asked.
    let row = bytes_of(GgmlType::Q8_0, &[shape.hidden]);
    if size > total + row {
        let rows = (size - total) / row;
        push(
            &mut tensors,
            &mut total,
            "extra.weight".into(),
            GgmlType::Q8_0,
            vec![shape.hidden, rows],
        );
    }

    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("seam-gen".into()))
        .add_metadata(
            "general.name",
            Value::String(format!("generated by cargo xtask gen-gguf (seed {seed})")),
        )
        .add_metadata("seam-gen.block_count", Value::U32(n as u32))
        .add_metadata("seam-gen.embedding_length", Value::U32(shape.hidden as u32))
        .add_metadata("seam-gen.expert_count", Value::U32(shape.experts as u32));
    for (i, (name, ty, dims)) in tensors.into_iter().enumerate() {
        let tensor_seed = seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
        w.add_tensor_fill(
            name,
            ty,
            &dims,
            Box::new(move |offset, buf| fill_pseudo_random(tensor_seed, offset, buf)),
        )
        .expect("generated shapes are valid");
    }
    w
}

/// A built-in model written to a temporary file, removed when dropped: what
/// the binaries load when no FILE is given. It is also removed when the
/// process is ended by SIGINT or SIGTERM (Ctrl-C during a load), where the
/// program has not set its own handler for them.
#[derive(Debug)]
pub struct TempGguf {
    path: std::path::PathBuf,
    slot: Option<usize>,
}

impl TempGguf {
    /// Writes `writer` to a new file in the temporary directory, named
    /// after `stem` and this process.
    ///
    /// # Errors
    ///
    /// The file cannot be written.
    pub fn write(writer: &GgufWriter, stem: &str) -> seam::gguf::Result<TempGguf> {
        let path = std::env::temp_dir().join(format!("{stem}-{}.gguf", std::process::id()));
        let slot = interrupt::remove_on_signal(&path);
        let file = TempGguf { path, slot };
        writer.write_file(&file.path)?;
        Ok(file)
    }

    /// Where it is.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for TempGguf {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            interrupt::forget(slot);
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Temporary files removed by a SIGINT/SIGTERM handler: a fixed table of
/// C strings, so the handler only loads atomics and calls `unlink`, `signal`
/// and `raise` (all async-signal-safe). Whoever swaps a slot's pointer out
/// owns it: the handler (which then never frees it: the process is ending)
/// or [`forget`].
mod interrupt {
    use std::ffi::{CString, c_char};
    use std::os::unix::ffi::OsStrExt;
    use std::sync::Once;
    use std::sync::atomic::{AtomicPtr, Ordering};

    const SLOTS: usize = 16;
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());
    static PATHS: [AtomicPtr<c_char>; SLOTS] = [EMPTY; SLOTS];
    static INSTALL: Once = Once::new();

    extern "C" fn on_signal(signal: libc::c_int) {
        for slot in &PATHS {
            let p = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if !p.is_null() {
                // SAFETY: `p` came from `CString::into_raw` and nobody else
                // can free it now that it is swapped out; unlink only reads it.
                unsafe { libc::unlink(p) };
            }
        }
        // SAFETY: back to the default action, then the same signal again:
        // the process ends as it would have without this handler (and its
        // parent sees the signal). Both calls are async-signal-safe.
        unsafe {
            libc::signal(signal, libc::SIG_DFL);
            libc::raise(signal);
        }
    }

    /// Installs the handler for SIGINT and SIGTERM where they still have
    /// their default action.
    fn install() {
        for signal in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: a zeroed sigaction is a valid value to receive the
            // current action into.
            let mut current: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: a null new action only queries the current one.
            let queried = unsafe { libc::sigaction(signal, std::ptr::null(), &mut current) };
            if queried == 0 && current.sa_sigaction == libc::SIG_DFL {
                // SAFETY: the handler only makes async-signal-safe calls.
                unsafe { libc::signal(signal, on_signal as *const () as libc::sighandler_t) };
            }
        }
    }

    /// Registers `path` for removal on SIGINT/SIGTERM; `None` when the
    /// table is full or the path holds a NUL byte (then only `Drop` removes
    /// it).
    pub(super) fn remove_on_signal(path: &std::path::Path) -> Option<usize> {
        INSTALL.call_once(install);
        let c = CString::new(path.as_os_str().as_bytes()).ok()?.into_raw();
        for (i, slot) in PATHS.iter().enumerate() {
            if slot
                .compare_exchange(std::ptr::null_mut(), c, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some(i);
            }
        }
        // SAFETY: `c` came from `into_raw` above and was stored nowhere.
        drop(unsafe { CString::from_raw(c) });
        None
    }

    /// Takes `slot`'s path out of the table and frees it.
    pub(super) fn forget(slot: usize) {
        let p = PATHS[slot].swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: swapped out of the table, so this is the only owner of
            // the pointer `CString::into_raw` made.
            drop(unsafe { CString::from_raw(p) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{TempGguf, demo_model};

    #[test]
    fn a_temporary_model_is_removed_when_dropped() {
        let file = TempGguf::write(&demo_model(), "seam-demo-test").unwrap();
        let path = file.path().to_path_buf();
        assert!(seam::gguf::GgufModel::open(&path, Default::default()).is_ok());
        drop(file);
        assert!(!path.exists());
    }
}
