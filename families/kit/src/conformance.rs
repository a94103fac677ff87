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

    /// Bytes a decode step may fault back into the mapping without reading
    /// a staged weight: lazy-table rows and the page edges of the weights it
    /// stages for the first time.
    const SLACK: u64 = 256 << 10;

    /// On the fake device, the model mapping's resident bytes stay where
    /// the first step left them (staged weights released) through every
    /// later step: the forward reads device copies, not the mapping.
    pub fn the_mapping_stays_released_during_decode<F: FamilyUnderTest>() {
        let (_dir, model) = open(&F::fixture());
        let first = model.tensors().first().expect("a tensor");
        let borrow = model.tensor_borrow(first).expect("borrow");
        let addr = borrow.bytes().as_ptr();
        let platform = FakePlatform::new(FakeConfig::default());
        let queue = platform.backend().create_queue().expect("queue");
        let mut after = Vec::new();
        F::decode(&model, &platform, &*queue, 4, &mut || {
            let rss = seam::residency::mapping_rss(addr)
                .expect("smaps")
                .expect("the mapping");
            after.push(rss);
        })
        .expect("decode");
        let released = platform.stage_counters().snapshot().released_page_bytes;
        assert!(
            released > 0,
            "nothing was released: nothing to stay released"
        );
        assert!(after.len() >= 2, "{after:?}");
        let floor = after[0];
        for (step, &rss) in after.iter().enumerate() {
            assert!(
                rss <= floor + SLACK,
                "step {step}: the mapping holds {rss} bytes, {floor} after the first step: staged weights were read back from the file"
            );
        }
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
