//! What the `muse_glimmer` binary adds to the kit's driver
//! ([`family_kit::driver`]): `--mmproj PROJECTOR.gguf`, opened through the
//! run's session and checked against its own manifest and the model's
//! width; after the decode it is staged and encodes a synthetic image, with
//! its own census and stage counts. And the family's part of the report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use family_kit::FixtureSpec;
use family_kit::blocks::attention::DeviceWeights;
use family_kit::driver::{Failure, FamilyBinary, FamilyReport, Files, Run};
use family_kit::{LoadedWeights, Manifest, WeightReader};
use seam::session::LoadError as SessionError;
use seam::text::path_safe;
use serde_json::json;

use crate::family::{MuseGlimmerDecoder, ProjectorFile};
use crate::mmproj::{Image, Projector, explain_open_error};
use crate::{MuseGlimmer, MuseGlimmerFamily};

/// muse_glimmer's own flags.
#[derive(Debug, clap::Args)]
pub struct MuseGlimmerFlags {
    /// The multimodal projector GGUF (clip.projector_type muse-glimmer).
    #[arg(long, value_name = "FILE")]
    pub mmproj: Option<PathBuf>,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// Per route: tensors, file bytes, and how many have a device copy.
fn routes(manifest: &Manifest, weights: &LoadedWeights) -> serde_json::Value {
    let mut out: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for (spec, w) in manifest.tensors.iter().zip(weights.all()) {
        let e = out.entry(spec.route.name()).or_default();
        e.0 += 1;
        e.1 += w.host().len();
        e.2 += u64::from(w.device_copy().is_some());
    }
    out.into_iter()
        .map(|(r, (tensors, bytes, staged))| {
            (
                r.to_owned(),
                json!({"tensors": tensors, "bytes": bytes, "staged": staged}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

impl FamilyBinary for MuseGlimmerFamily {
    type Flags = MuseGlimmerFlags;
    const ABOUT: &'static str = "muse-glimmer: check a file (and its projector) against the manifest and decode through the seam";

    fn inputs(flags: &MuseGlimmerFlags) -> Vec<&Path> {
        flags.mmproj.iter().map(PathBuf::as_path).collect()
    }

    /// Opens and checks the projector (one line naming the tensor or key
    /// on refusal).
    fn generated(layers: u64) -> Option<FixtureSpec> {
        Some(crate::fixture::quantized(
            &crate::fixture::Shape::checkpoint(layers),
        ))
    }

    fn companion(
        flags: &MuseGlimmerFlags,
        files: &mut Files<'_, '_>,
    ) -> Result<Option<ProjectorFile>, Failure> {
        let Some(path) = &flags.mmproj else {
            return Ok(None);
        };
        let gguf = files.session().open(path).map_err(|e| match &e {
            SessionError::Gguf(g) => {
                Failure(explain_open_error(g).unwrap_or_else(|| e.to_string()))
            }
            _ => Failure(e.to_string()),
        })?;
        let projector =
            Projector::load(&gguf).map_err(|e| Failure(format!("{}: {e}", path_safe(path))))?;
        Ok(Some(ProjectorFile {
            path: path.clone(),
            gguf,
            projector,
        }))
    }

    fn accept(
        _: &MuseGlimmerFlags,
        model: &MuseGlimmer,
        companion: &Option<ProjectorFile>,
    ) -> Result<(), Failure> {
        match companion {
            Some(p) => p
                .projector
                .check_text_width(model.hparams().n_embd)
                .map_err(|e| Failure(format!("{}: {e}", path_safe(&p.path)))),
            None => Ok(()),
        }
    }

    fn report(
        _: &MuseGlimmerFlags,
        run: &Run<'_, '_>,
        model: &MuseGlimmer,
        companion: &Option<ProjectorFile>,
        decoder: &MuseGlimmerDecoder<'_>,
    ) -> Result<FamilyReport, Failure> {
        let (platform, queue) = (run.session.platform(), run.session.queue());
        let text_seam = platform.stage_counters().snapshot();
        let mm_report = match companion {
            None => serde_json::Value::Null,
            Some(ProjectorFile {
                path: p,
                gguf: g,
                projector: proj,
            }) => {
                let hp = proj.hparams();
                let side = hp.pos_grid * hp.patch_size * hp.merge;
                let image = Image::synthetic(side, side);
                let staged = proj.stage(platform, queue);
                g.check_unchanged()?;
                let staged = staged.map_err(|e| Failure(format!("{}: {e}", path_safe(p))))?;
                // Where the text model decodes: on the device's op layer
                // (the weights read where the seam staged them), else on
                // the host.
                let (embd, encoded_on, weights_back) = match decoder {
                    MuseGlimmerDecoder::Device(d) => {
                        let dw = DeviceWeights::new(d.shared_ops(), platform, queue);
                        let before = dw.ops().counters().weight_read_back_bytes;
                        let embd = proj.encode_on_device(&dw, &image);
                        let back = dw.ops().counters().weight_read_back_bytes - before;
                        (embd, dw.ops().device_name(), back)
                    }
                    MuseGlimmerDecoder::Host(_) => {
                        let reader = WeightReader::new(platform, queue);
                        let embd = proj.encode(&reader, &image);
                        (
                            embd,
                            "host".to_owned(),
                            reader.traffic().weight_read_back_bytes,
                        )
                    }
                };
                g.check_unchanged()?;
                let embd = embd.map_err(|e| Failure(format!("{}: {e}", path_safe(p))))?;
                let after = platform.stage_counters().snapshot();
                json!({
                    "file": p,
                    "projector_type": crate::mmproj::PROJECTOR_TYPE,
                    "hparams": hp,
                    "census": proj.census(),
                    "routes": routes(proj.manifest(), proj.weights()),
                    "staged_at_load": staged,
                    "image": [side, side],
                    "encoded_on": encoded_on,
                    "weight_read_back_bytes": weights_back,
                    "tokens": embd.len(),
                    "token_width": embd.first().map_or(0, Vec::len),
                    "seam": {
                        "uploads": after.uploads - text_seam.uploads,
                        "uploaded_bytes": after.uploaded_bytes - text_seam.uploaded_bytes,
                        "releases": after.releases - text_seam.releases,
                        "released_page_bytes": after.released_page_bytes - text_seam.released_page_bytes,
                    },
                })
            }
        };
        let hp = model.hparams();
        let census = model.census();
        let mut text = format!(
            "muse-glimmer, {} layers ({} sliding-window), E {}, vocab {}; {} tensors claimed ({:.2} MiB), {} dropped by name\n",
            hp.n_layer,
            hp.is_swa.iter().filter(|&&s| s).count(),
            hp.n_embd,
            hp.n_vocab,
            census.claimed_tensors,
            mib(census.claimed_bytes),
            census.dropped.len(),
        );
        if !mm_report.is_null() {
            text.push_str(&format!(
                "projector {}: {} tensors, {} image tokens of {} encoded on {}; seam: {} uploads, {} releases\n",
                mm_report["file"].as_str().unwrap_or(""),
                mm_report["census"]["claimed_tensors"],
                mm_report["tokens"],
                mm_report["token_width"],
                mm_report["encoded_on"].as_str().unwrap_or(""),
                mm_report["seam"]["uploads"],
                mm_report["seam"]["releases"],
            ));
        }
        let json = json!({
            "model": hp,
            "census": census,
            "drop_rules": model.manifest().drop_rules(),
            "routes": routes(model.manifest(), model.weights()),
            "weights": {
                "claimed": model.manifest().tensors.len(),
                "staged": model.weights().staged(),
                "kept_dequantized": decoder.kept(),
            },
            "text_seam": text_seam,
            "mmproj": mm_report,
        });
        Ok(FamilyReport::new(json, text))
    }
}
