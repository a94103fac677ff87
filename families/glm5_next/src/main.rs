//! `glm5_next [FILE.gguf] [--device ...] [--tokens 1,2,3] [--steps N]
//! [--json] [--dump-logits PATH] [--write-fixture PATH]`: the kit's driver
//! (`family_kit::driver`) over the glm5-next family.

fn main() -> std::process::ExitCode {
    family_kit::driver::run_family::<glm5_next::Glm5NextFamily>()
}
