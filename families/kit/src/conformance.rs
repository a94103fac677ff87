//! The conformance test set every family runs with one line:
//!
//! ```text
//! family_kit::conformance_tests!(qwen4_exp::Qwen4ExpFamily);
//! ```
//!
//! It checks, on the family's own fixture: refusals by name (a missing, an
//! extra, a wrongly shaped and a wrongly typed tensor; a missing key); on
//! the fake staging device, that decoding stages each weight once and
//! releases as many as it uploads; and that the model mapping's resident
//! bytes do not climb back during decode once the seam has released the
//! staged weights' pages (the seed engine's forward faulted its 21 GB back).
//! Each family's binary test calls `the_binary_loads_through_a_session`:
//! `VT_*` knobs reach its load session and the ring carries its weights.
//!
//! A family implements [`FamilyUnderTest`] in its library (a few lines over
//! its load and decode); the test functions need the `conformance` feature
//! (the fake device), so families enable it in their dev-dependencies.

use seam::gguf::GgufModel;
use seam::platform::{Platform, Queue};

use crate::error::LoadError;
use crate::fixture::FixtureSpec;

/// What the conformance tests need of a family.
pub trait FamilyUnderTest {
    /// A tensor of the fixture whose type rule is F32 only (a norm gamma).
    const F32_TENSOR: &'static str;
    /// A metadata key the family requires (full name).
    const REQUIRED_KEY: &'static str;
    /// The family's built-in fixture.
    fn fixture() -> FixtureSpec;
    /// Loads `model` with the family's manifest check (nothing staged).
    ///
    /// # Errors
    ///
    /// The family refuses the file.
    fn check(model: &GgufModel) -> Result<(), LoadError>;
    /// Loads `model` and decodes `steps` tokens greedily through the seam
    /// on `platform`, calling `after_step` after each step.
    ///
    /// # Errors
    ///
    /// The family refuses the file or the seam fails.
    fn decode(
        model: &GgufModel,
        platform: &dyn Platform,
        queue: &dyn Queue,
        steps: usize,
        after_step: &mut dyn FnMut(),
    ) -> Result<(), LoadError>;
}

#[cfg(feature = "conformance")]
pub use tests::*;

#[cfg(feature = "conformance")]
mod tests {
    use std::collections::BTreeMap;

    use platform_fake::{Event, FakeConfig, FakePlatform};
    use seam::borrow::MapOptions;
    use seam::gguf::{GgmlType, GgufModel};
    use seam::platform::Platform;

    use super::FamilyUnderTest;
    use crate::fixture::FixtureSpec;

    /// The fixture written to a temporary file and opened.
    fn open(spec: &FixtureSpec) -> (tempfile::TempDir, GgufModel) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("conformance.gguf");
        spec.write_file(&path).expect("write fixture");
        let model = GgufModel::open(&path, MapOptions { prefault: false }).expect("open fixture");
        (dir, model)
    }

    #[track_caller]
    fn refused<F: FamilyUnderTest>(spec: &FixtureSpec, names: &str) {
        let (_dir, model) = open(spec);
        match F::check(&model) {
            Ok(()) => panic!("a fixture with {names} wrong was accepted"),
            Err(e) => assert!(e.to_string().contains(names), "{e} does not name {names}"),
        }
    }

    /// The fixture itself is accepted (so each refusal below is the edit's).
    pub fn accepts_its_fixture<F: FamilyUnderTest>() {
        let (_dir, model) = open(&F::fixture());
        F::check(&model).expect("the family's own fixture");
    }

    /// A claimed tensor removed: refused, naming it.
    pub fn refuses_a_missing_tensor<F: FamilyUnderTest>() {
        let mut spec = F::fixture();
        let name = spec.tensors[0].name.clone();
        spec.remove_tensor(&name);
        refused::<F>(&spec, &name);
    }

    /// A tensor the manifest neither claims nor drops: refused, naming it.
    pub fn refuses_an_extra_tensor<F: FamilyUnderTest>() {
        let mut spec = F::fixture();
        let name = "blk.0.conformance_surplus.weight";
        spec.add_tensor(name, GgmlType::F32, &[32]);
        refused::<F>(&spec, name);
    }

    /// A claimed tensor twice as wide: refused, naming it.
    pub fn refuses_a_wrong_shape<F: FamilyUnderTest>() {
        let mut spec = F::fixture();
        let t = &mut spec.tensors[0];
        t.dims[0] *= 2;
        let name = t.name.clone();
        refused::<F>(&spec, &name);
    }

    /// An F32-only tensor stored F16: refused, naming it.
    pub fn refuses_a_wrong_type<F: FamilyUnderTest>() {
        let mut spec = F::fixture();
        spec.tensor_mut(F::F32_TENSOR)
            .expect("F32_TENSOR is in the fixture")
            .ggml_type = GgmlType::F16;
        refused::<F>(&spec, F::F32_TENSOR);
    }

    /// A required key removed: refused, naming it.
    pub fn refuses_a_missing_key<F: FamilyUnderTest>() {
        let mut spec = F::fixture();
        assert!(
            spec.remove_key(F::REQUIRED_KEY),
            "REQUIRED_KEY is in the fixture"
        );
        refused::<F>(&spec, F::REQUIRED_KEY);
    }

    /// Decoding on the fake device stages each weight once: every release
    /// names a different weight, and uploads = releases = device
    /// allocations.
    pub fn stages_each_weight_once_and_releases_what_it_uploads<F: FamilyUnderTest>() {
        let (_dir, model) = open(&F::fixture());
        let platform = FakePlatform::new(FakeConfig::default());
        let queue = platform.backend().create_queue().expect("queue");
        F::decode(&model, &platform, &*queue, 3, &mut || {}).expect("decode");
        let mut per_weight: BTreeMap<String, usize> = BTreeMap::new();
        for e in platform.events() {
            if let Event::Release {
                weight,
                pending_copies,
                ..
            } = e
            {
                assert_eq!(
                    pending_copies, 0,
                    "{weight} released before its copy landed"
                );
                *per_weight.entry(weight).or_default() += 1;
            }
        }
        let twice: Vec<_> = per_weight.iter().filter(|(_, n)| **n != 1).collect();
        assert!(twice.is_empty(), "released more than once: {twice:?}");
        let seam = platform.stage_counters().snapshot();
        let fake = platform.counters();
        assert!(seam.uploads > 0, "decoding staged nothing");
        assert_eq!(seam.releases, seam.uploads, "{seam:?}");
        assert_eq!(per_weight.len() as u64, seam.uploads, "{seam:?}");
        assert_eq!(fake.allocs, seam.uploads, "{fake:?} {seam:?}");
    }

    /// The kernel's fault-around window (`fault_around_bytes`, 64 KiB by
    /// default): a read fault also maps the cached pages of its aligned
    /// window, so a read of one tensor may map a neighbour's pages in the
    /// same window, never a page in a window it did not touch.
    const FAULT_AROUND: usize = 64 << 10;

    /// Writes `spec` so that no two tensors share a fault-around window:
    /// tensors start `2 * FAULT_AROUND` apart (the GGUF alignment), and the
    /// file goes out in page-sized writes, so the page cache holds single
    /// pages (a kernel may map a whole large folio on one fault, neighbours'
    /// pages included).
    fn write_spaced(spec: &FixtureSpec, path: &std::path::Path) {
        struct PageWrites(std::fs::File);
        impl std::io::Write for PageWrites {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.write(&buf[..buf.len().min(4096)])
            }
            fn flush(&mut self) -> std::io::Result<()> {
                self.0.flush()
            }
        }
        let mut writer = spec.writer();
        writer
            .set_alignment(2 * FAULT_AROUND as u32)
            .expect("alignment");
        let mut out = PageWrites(std::fs::File::create(path).expect("create fixture"));
        writer.write_to(&mut out).expect("write fixture");
    }

    fn overlaps(a: &std::ops::Range<usize>, b: &std::ops::Range<usize>) -> bool {
        a.start < b.end && b.start < a.end
    }

    /// The page-aligned interior of `bytes` (what a release gives back), cut
    /// into its parts per fault-around window, keeping the parts whose window
    /// holds no byte of `others`: a page there is mapped only if `bytes`
    /// itself was read.
    fn pages_only_a_read_maps<'b>(
        bytes: &'b [u8],
        others: &[std::ops::Range<usize>],
    ) -> Vec<&'b [u8]> {
        let page = seam::borrow::page_size() as usize;
        let base = bytes.as_ptr() as usize;
        let start = base.div_ceil(page) * page;
        let end = (base + bytes.len()) / page * page;
        let mut parts = Vec::new();
        let mut window = start / FAULT_AROUND * FAULT_AROUND;
        while window < end {
            let span = window..window + FAULT_AROUND;
            if !others.iter().any(|o| overlaps(o, &span)) {
                let (lo, hi) = (start.max(span.start), end.min(span.end));
                parts.push(&bytes[lo - base..hi - base]);
            }
            window += FAULT_AROUND;
        }
        parts
    }

    /// A family binary as a child process, knobs in its environment: `bin`
    /// is its `env!("CARGO_BIN_EXE_...")`, `args` make it decode on the
    /// fake device and print its `--json` report. The report's policy line
    /// names the prefault and the ring's buffer size as the environment
    /// set them, and every upload went through the session's ring (a
    /// binary that mapped or staged by hand would show neither). Returns
    /// the report for the family's own checks.
    pub fn the_binary_loads_through_a_session(bin: &str, args: &[&str]) -> serde_json::Value {
        let out = std::process::Command::new(bin)
            .args(args)
            .env("VT_GGUF_PREFAULT", "on")
            .env("VT_PINNED_H2D_MIB", "1")
            .env("VT_PINNED_H2D_DIRECT_BELOW", "0")
            .output()
            .expect("the binary runs");
        assert!(
            out.status.success(),
            "{bin}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
        let policy = r["policy"].as_str().expect("a policy line");
        for knob in [
            "prefault=on (env VT_GGUF_PREFAULT)",
            "pinned_h2d_mib=1 (env VT_PINNED_H2D_MIB)",
        ] {
            assert!(policy.contains(knob), "{knob} not in {policy}");
        }
        let transfers = r["ring"]["transfers"].as_u64().expect("ring transfers");
        assert!(transfers > 0, "{}", r["ring"]);
        assert_eq!(
            Some(transfers),
            r["seam"]["uploads"].as_u64(),
            "{}",
            r["ring"]
        );
        r
    }

    /// On the fake device, no decode step reads a released weight back from
    /// the mapping. After every step, every page given back by a release is
    /// checked in `/proc/self/pagemap`, except where the kernel may map it
    /// for a neighbour's read (a fault-around window shared with another
    /// tensor or the header; the fixture is written so that tensors share
    /// none): a mapped one was read after its release. The forward reads
    /// device copies; what it reads from the mapping (small weights,
    /// lazy-table rows) it reads in its own windows.
    pub fn the_mapping_stays_released_during_decode<F: FamilyUnderTest>() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("conformance.gguf");
        write_spaced(&F::fixture(), &path);
        let model = GgufModel::open(&path, MapOptions { prefault: false }).expect("open fixture");
        // Each tensor's bytes, by (name, file offset, length): a release
        // names all three, so another file's weight of the same name (a
        // draft's target) is not taken for one of this file's.
        let mut tensors = BTreeMap::new();
        let mut ranges = Vec::new();
        for t in model.tensors() {
            let borrow = model.tensor_borrow(t).expect("borrow");
            let at = borrow.bytes().as_ptr() as usize;
            ranges.push(at..at + borrow.bytes().len());
            tensors.insert((t.name.clone(), borrow.offset(), borrow.len()), borrow);
        }
        // The header and metadata, read while parsing, count as a tensor.
        let first = tensors.values().next().expect("a tensor");
        let file_start = first.bytes().as_ptr() as usize - first.offset() as usize;
        let data_start = ranges.iter().map(|r| r.start).min().expect("a tensor");
        ranges.push(file_start..data_start);
        let platform = FakePlatform::new(FakeConfig::default());
        let queue = platform.backend().create_queue().expect("queue");
        let mut steps = 0;
        let mut pages_checked = 0;
        let mut read_back = Vec::new();
        F::decode(&model, &platform, &*queue, 4, &mut || {
            for e in platform.events() {
                let Event::Release {
                    weight,
                    borrowed: true,
                    offset,
                    len,
                    ..
                } = e
                else {
                    continue;
                };
                let Some(borrow) = tensors.get(&(weight.clone(), offset, len)) else {
                    continue;
                };
                let own = borrow.bytes().as_ptr() as usize;
                let others: Vec<_> = ranges.iter().filter(|r| r.start != own).cloned().collect();
                for part in pages_only_a_read_maps(borrow.bytes(), &others) {
                    pages_checked += part.len() as u64 / seam::borrow::page_size();
                    let mapped = seam::residency::mapped_pages(part).expect("pagemap");
                    if mapped > 0 {
                        read_back.push(format!("step {steps}: {weight}: {mapped} pages"));
                    }
                }
            }
            steps += 1;
        })
        .expect("decode");
        assert!(steps >= 2, "decode ran {steps} steps");
        assert!(
            pages_checked > 0,
            "no page of a released weight was checked: the decode released nothing"
        );
        assert!(
            read_back.is_empty(),
            "released weights were read back from the mapping ({} times): {:?}",
            read_back.len(),
            &read_back[..read_back.len().min(8)]
        );
    }
}

/// The conformance tests of family `$family` (a [`FamilyUnderTest`]), one
/// `#[test]` each.
#[macro_export]
macro_rules! conformance_tests {
    ($family:ty) => {
        mod conformance {
            #[test]
            fn accepts_its_fixture() {
                $crate::conformance::accepts_its_fixture::<$family>();
            }
            #[test]
            fn refuses_a_missing_tensor_by_name() {
                $crate::conformance::refuses_a_missing_tensor::<$family>();
            }
            #[test]
            fn refuses_an_extra_tensor_by_name() {
                $crate::conformance::refuses_an_extra_tensor::<$family>();
            }
            #[test]
            fn refuses_a_wrong_shape_by_name() {
                $crate::conformance::refuses_a_wrong_shape::<$family>();
            }
            #[test]
            fn refuses_a_wrong_type_by_name() {
                $crate::conformance::refuses_a_wrong_type::<$family>();
            }
            #[test]
            fn refuses_a_missing_key_by_name() {
                $crate::conformance::refuses_a_missing_key::<$family>();
            }
            #[test]
            fn stages_each_weight_once_and_releases_what_it_uploads() {
                $crate::conformance::stages_each_weight_once_and_releases_what_it_uploads::<$family>();
            }
            #[test]
            fn the_mapping_stays_released_during_decode() {
                $crate::conformance::the_mapping_stays_released_during_decode::<$family>();
            }
        }
    };
}
