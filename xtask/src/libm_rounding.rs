//! `cargo xtask libm-rounding [--check]`: the lists of arguments at which
//! this machine's `expf` and `logf` round to the other neighbour of the
//! correctly rounded value (`device_ops::libm_rounding`), swept over every
//! finite float. Without `--check` it writes them into device-ops' data;
//! with it, it fails if they differ from what is committed.

use anyhow::{Result, bail};
use device_ops::libm_rounding::{LibmFn, encode, misrounded, sweep};

pub fn run(args: &[String]) -> Result<()> {
    let check = match args {
        [] => false,
        [flag] if flag == "--check" => true,
        _ => bail!("usage: cargo xtask libm-rounding [--check]"),
    };
    let crate_dir = crate::workspace_root().join("device-ops");
    let mut differ = Vec::new();
    for f in LibmFn::ALL {
        let list = sweep(f);
        let path = crate_dir.join(f.data_path());
        if check {
            let committed = misrounded(f);
            if list != committed {
                let extra = list
                    .iter()
                    .filter(|b| committed.binary_search(b).is_err())
                    .count();
                let gone = committed
                    .iter()
                    .filter(|b| list.binary_search(b).is_err())
                    .count();
                differ.push(format!(
                    "{}: this libm misrounds {} arguments, {} of them unlisted; {} listed ones it rounds right",
                    f.name(),
                    list.len(),
                    extra,
                    gone
                ));
            } else {
                println!("{}: {} arguments, as committed", f.name(), list.len());
            }
        } else {
            std::fs::write(&path, encode(&list))?;
            println!(
                "{}: {} arguments -> {}",
                f.name(),
                list.len(),
                path.display()
            );
        }
    }
    if !differ.is_empty() {
        bail!(
            "this machine's libm is not the committed one: {}",
            differ.join("; ")
        );
    }
    Ok(())
}
