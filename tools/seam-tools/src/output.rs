//! Output files of the binaries (`--plot`, `--trace`, `--dump-logits`,
//! `--write-fixture`): checked before any work starts, so a typo costs a
//! line and not a whole load, and never the model itself.
//!
//! An output must not be one of the inputs (same device and inode: a hard
//! link or a symbolic link to the model counts), must not be a directory,
//! and must be writable: an existing file opens for writing (without
//! truncating it), a new one's folder exists and is writable.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use seam::text::path_safe;

/// Why an output path cannot be written.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {}: {why}", path_safe(path))]
pub struct OutputError {
    /// The flag that named the path (`--plot`).
    pub flag: &'static str,
    /// The path.
    pub path: PathBuf,
    /// Why not, in words.
    pub why: String,
}

/// Checks that `path`, given with `flag`, can be written and is none of
/// `inputs`. Nothing is created or truncated.
///
/// # Errors
///
/// The path is an input, a directory, or cannot be written.
pub fn check_output(flag: &'static str, path: &Path, inputs: &[&Path]) -> Result<(), OutputError> {
    let err = |why: String| OutputError {
        flag,
        path: path.to_path_buf(),
        why,
    };
    match std::fs::metadata(path) {
        Ok(meta) => {
            for input in inputs {
                if let Ok(m) = std::fs::metadata(input)
                    && (m.dev(), m.ino()) == (meta.dev(), meta.ino())
                {
                    return Err(err(format!(
                        "is the input {} (the same file); refusing to overwrite it",
                        path_safe(input)
                    )));
                }
            }
            if meta.is_dir() {
                return Err(err("is a directory".into()));
            }
            std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map(drop)
                .map_err(|e| err(format!("cannot be written: {e}")))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            match std::fs::metadata(parent) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(err(format!("{} is not a directory", path_safe(parent)))),
                Err(e) => return Err(err(format!("folder {}: {e}", path_safe(parent)))),
            }
            let c_parent = std::ffi::CString::new(parent.as_os_str().as_bytes())
                .map_err(|_| err("the path holds a NUL byte".into()))?;
            // SAFETY: `c_parent` is a NUL-terminated string that lives for
            // the call; access(2) only reads it.
            if unsafe { libc::access(c_parent.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
                return Err(err(format!(
                    "folder {} is not writable: {}",
                    path_safe(parent),
                    std::io::Error::last_os_error()
                )));
            }
            Ok(())
        }
        Err(e) => Err(err(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::check_output;

    #[test]
    fn inputs_directories_and_missing_folders_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"GGUF").unwrap();
        let link = dir.path().join("link.gguf");
        std::fs::hard_link(&model, &link).unwrap();
        let why = |p: &std::path::Path| check_output("--plot", p, &[&model]).unwrap_err().why;

        assert!(why(&model).starts_with("is the input"), "{}", why(&model));
        assert!(why(&link).starts_with("is the input"), "{}", why(&link));
        assert_eq!(why(dir.path()), "is a directory");
        let missing = dir.path().join("no/such/folder/t.csv");
        assert!(
            why(&missing).contains("no/such/folder"),
            "{}",
            why(&missing)
        );
        let e = check_output("--trace", &missing, &[&model]).unwrap_err();
        assert!(e.to_string().starts_with("--trace "), "{e}");

        check_output("--plot", &dir.path().join("new.svg"), &[&model]).unwrap();
        assert!(
            !dir.path().join("new.svg").exists(),
            "the check created the file"
        );
        let existing = dir.path().join("old.svg");
        std::fs::write(&existing, b"keep").unwrap();
        check_output("--plot", &existing, &[&model]).unwrap();
        assert_eq!(std::fs::read(&existing).unwrap(), b"keep");
    }
}
