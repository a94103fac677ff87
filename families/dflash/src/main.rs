//! `dflash [DRAFT.gguf] [--device ...] [--tokens 1,2,3] [--steps N]
//! [--json] [--dump-logits PATH] [--write-fixture PATH]
//! [--target TARGET.gguf]`: the kit's driver (`family_kit::driver`) over
//! a dflash draft and its qwen4exp target (with no files, the built-in
//! tiny draft over the qwen4_exp built-in tiny target). The decode is the
//! target's greedy pass (`--dump-logits`: the target's logits, which verify
//! every token); speculation with the draft follows and must give the same
//! tokens.

fn main() -> std::process::ExitCode {
    family_kit::driver::run_family::<dflash::DflashFamily>()
}
