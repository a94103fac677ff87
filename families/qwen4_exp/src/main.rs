//! `qwen4_exp [FILE.gguf] [--device ...] [--tokens 1,2,3] [--steps N]
//! [--json] [--dump-logits PATH] [--write-fixture PATH]
//! [--write-generated PATH [--layers N]]`: the kit's driver
//! (`family_kit::driver`) over the qwen4exp family.

fn main() -> std::process::ExitCode {
    family_kit::driver::run_family::<qwen4_exp::Qwen4ExpFamily>()
}
