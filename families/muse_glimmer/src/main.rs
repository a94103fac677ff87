//! `muse_glimmer [FILE.gguf] [--device ...] [--tokens 1,2,3] [--steps N]
//! [--json] [--dump-logits PATH] [--write-fixture PATH]
//! [--mmproj PROJECTOR.gguf]`: the kit's driver (`family_kit::driver`)
//! over the muse-glimmer family.

fn main() -> std::process::ExitCode {
    family_kit::driver::run_family::<muse_glimmer::MuseGlimmerFamily>()
}
