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

/// An output that could not be written whole.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {}: {why}", path_safe(path))]
pub struct WriteError {
    /// The flag that named the path.
    pub flag: &'static str,
    /// The path.
    pub path: PathBuf,
    /// Why not, in words.
    pub why: String,
}

/// The partial file an output is written to before it is complete: a
/// hidden sibling of `path` (`.NAME.partial-PID`), so the rename is
/// within one folder and one file system.
fn partial_of(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// Writes the output `path` (named by `flag`) through `write`, which
/// writes a whole file at the path it is given: first a partial file
/// beside `path`, renamed to `path` once `write` returned. An interrupted
/// or failed write (a full disk, a killed process) never leaves a
/// truncated file under the output's name, where a rerun would take it
/// for a finished model; a failed one removes its partial file. Returns
/// what `write` returned.
///
/// # Errors
///
/// `write` failed (its error in words), or the rename did.
pub fn write_whole<E: std::fmt::Display>(
    flag: &'static str,
    path: &Path,
    write: impl FnOnce(&Path) -> Result<u64, E>,
) -> Result<u64, WriteError> {
    let err = |why: String| WriteError {
        flag,
        path: path.to_path_buf(),
        why,
    };
    let partial = partial_of(path);
    let written = write(&partial).map_err(|e| e.to_string());
    let done = written.and_then(|n| {
        std::fs::rename(&partial, path)
            .map(|()| n)
            .map_err(|e| format!("renaming {} into place: {e}", path_safe(&partial)))
    });
    if done.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    done.map_err(err)
}

#[cfg(test)]
mod tests {
    use super::{check_output, partial_of, write_whole};

    #[test]
    fn an_output_appears_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("model.gguf");
        let n = write_whole("--write-generated", &out, |p| {
            assert_eq!(p, partial_of(&out));
            std::fs::write(p, b"whole").map(|()| 5)
        })
        .unwrap();
        assert_eq!((n, std::fs::read(&out).unwrap()), (5, b"whole".to_vec()));

        // A failing writer leaves the earlier file and no partial one.
        let e = write_whole("--write-generated", &out, |p| {
            std::fs::write(p, b"trunc").unwrap();
            Err::<u64, _>("No space left on device")
        })
        .unwrap_err();
        assert_eq!(e.why, "No space left on device");
        assert!(e.to_string().starts_with("--write-generated "), "{e}");
        assert_eq!(std::fs::read(&out).unwrap(), b"whole");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("model.gguf")]);
    }

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
