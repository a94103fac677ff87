//! CUBINs kept on disk between processes: compiling every kernel with
//! NVRTC takes seconds (the product kernels are templates over 26 types),
//! and a binary pays it before its first token. A CUBIN is filed under the
//! sha256 of what made it (the source, the options, the architecture), so
//! a changed kernel or another GPU never meets an old image; a file that
//! is not an ELF image is compiled again and replaced. Writes go to a
//! temporary file renamed into place, so two processes never read half an
//! image. A folder that cannot be written leaves the compile as it was.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The folder of kept CUBINs; `off` keeps none. Default:
/// `$XDG_CACHE_HOME/seam/kernels`, else `$HOME/.cache/seam/kernels`.
pub const KERNEL_CACHE_ENV: &str = "SEAM_KERNEL_CACHE";

/// Where a CUBIN came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CubinOrigin {
    /// Read from the cache folder.
    Cache,
    /// Compiled by NVRTC now (and kept, where the folder allows).
    Compiled,
}

/// The cache folder the environment names, or `None` for `off` or no
/// home.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_in(&|k| std::env::var_os(k))
}

/// [`cache_dir`] over the environment `env`.
fn cache_dir_in(env: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let env = |k: &str| env(k).filter(|v| !v.is_empty());
    match env(KERNEL_CACHE_ENV) {
        Some(v) if v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => env("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("seam").join("kernels")),
    }
}

/// The file a CUBIN of `source` compiled with `options` for `arch` is kept
/// in, under `dir`.
pub fn cubin_path(dir: &Path, source: &str, options: &[&str], arch: &str) -> PathBuf {
    let mut h = Sha256::new();
    for part in [source, arch].into_iter().chain(options.iter().copied()) {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    dir.join(format!("{arch}-{hex}.cubin"))
}

/// Whether `bytes` look like a CUBIN (an ELF image).
fn is_elf(bytes: &[u8]) -> bool {
    bytes.len() > 64 && bytes.starts_with(b"\x7fELF")
}

/// The CUBIN of `source` for `arch`: the one kept under `dir` (when given
/// and present), else `compile()`'s, kept there for the next process.
///
/// # Errors
///
/// `compile()`'s error (a cache that cannot be read or written is not an
/// error: the compile runs, and its image is not kept).
pub fn cached(
    dir: Option<&Path>,
    source: &str,
    options: &[&str],
    arch: &str,
    compile: impl FnOnce() -> Result<Vec<u8>, String>,
) -> Result<(Vec<u8>, CubinOrigin), String> {
    let Some(dir) = dir else {
        return compile().map(|c| (c, CubinOrigin::Compiled));
    };
    let path = cubin_path(dir, source, options, arch);
    if let Ok(bytes) = std::fs::read(&path)
        && is_elf(&bytes)
    {
        return Ok((bytes, CubinOrigin::Cache));
    }
    let cubin = compile()?;
    let _ = keep(dir, &path, &cubin);
    Ok((cubin, CubinOrigin::Compiled))
}

/// Writes `cubin` to `path` through a temporary file in `dir`.
fn keep(dir: &Path, path: &Path, cubin: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(cubin)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(tag: u8) -> Vec<u8> {
        let mut v = b"\x7fELF".to_vec();
        v.resize(100, tag);
        v
    }

    #[test]
    fn the_folder_is_the_knob_then_xdg_then_home_and_off_keeps_none() {
        let dir = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            cache_dir_in(&move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.into()))
        };
        let all = [
            (KERNEL_CACHE_ENV, "/k"),
            ("XDG_CACHE_HOME", "/x"),
            ("HOME", "/h"),
        ];
        assert_eq!(dir(&all), Some(PathBuf::from("/k")));
        assert_eq!(dir(&all[1..]), Some(PathBuf::from("/x/seam/kernels")));
        assert_eq!(
            dir(&all[2..]),
            Some(PathBuf::from("/h/.cache/seam/kernels"))
        );
        assert_eq!(dir(&[(KERNEL_CACHE_ENV, "off"), ("HOME", "/h")]), None);
        assert_eq!(
            dir(&[(KERNEL_CACHE_ENV, ""), ("HOME", "/h")]),
            Some(PathBuf::from("/h/.cache/seam/kernels"))
        );
        assert_eq!(dir(&[]), None);
    }

    #[test]
    fn a_compiled_image_is_kept_and_read_back_by_the_next_process() {
        let dir = tempfile::tempdir().unwrap();
        let (first, origin) =
            cached(Some(dir.path()), "src", &["-a"], "sm_90", || Ok(image(1))).unwrap();
        assert_eq!(origin, CubinOrigin::Compiled);
        let (again, origin) = cached(Some(dir.path()), "src", &["-a"], "sm_90", || {
            panic!("compiled twice")
        })
        .unwrap();
        assert_eq!((again, origin), (first, CubinOrigin::Cache));
    }

    #[test]
    fn another_source_option_or_architecture_is_another_file() {
        let dir = Path::new("/c");
        let base = cubin_path(dir, "src", &["-a"], "sm_90");
        assert_ne!(base, cubin_path(dir, "src2", &["-a"], "sm_90"));
        assert_ne!(base, cubin_path(dir, "src", &["-b"], "sm_90"));
        assert_ne!(base, cubin_path(dir, "src", &["-a"], "sm_80"));
        // Parts are length-prefixed: moving a byte between them moves the
        // name.
        assert_ne!(
            cubin_path(dir, "ab", &["c"], "sm_90"),
            cubin_path(dir, "a", &["bc"], "sm_90")
        );
        assert!(
            base.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("sm_90-")
        );
    }

    #[test]
    fn a_file_that_is_no_image_is_compiled_again_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = cubin_path(dir.path(), "src", &[], "sm_90");
        std::fs::write(&path, b"not an image").unwrap();
        let (got, origin) = cached(Some(dir.path()), "src", &[], "sm_90", || Ok(image(2))).unwrap();
        assert_eq!((got.clone(), origin), (image(2), CubinOrigin::Compiled));
        assert_eq!(std::fs::read(&path).unwrap(), got);
    }

    #[test]
    fn an_unwritable_folder_or_none_still_compiles_and_a_failure_is_the_compiles() {
        let file = tempfile::NamedTempFile::new().unwrap();
        // A folder under a regular file can be neither made nor written.
        let dir = file.path().join("kernels");
        let (got, origin) = cached(Some(&dir), "s", &[], "sm_90", || Ok(image(3))).unwrap();
        assert_eq!((got, origin), (image(3), CubinOrigin::Compiled));
        let (got, origin) = cached(None, "s", &[], "sm_90", || Ok(image(4))).unwrap();
        assert_eq!((got, origin), (image(4), CubinOrigin::Compiled));
        let err = cached(None, "s", &[], "sm_90", || Err("no nvrtc".into())).unwrap_err();
        assert_eq!(err, "no nvrtc");
    }
}
