//! `glm_moe_dsa [FILE.gguf] [--device ...] [--tokens 1,2,3] [--steps N]
//! [--json] [--dump-logits PATH] [--write-fixture PATH]`: the kit's driver
//! (`family_kit::driver`) over the glm-dsa family.

fn main() -> std::process::ExitCode {
    family_kit::driver::run_family::<glm_moe_dsa::GlmMoeDsaFamily>()
}
