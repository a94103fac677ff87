//! Borrows: zero-copy, read-only views of a memory-mapped file.
//!
//! A [`MappedFile`] owns one read-only shared mapping of a whole file and,
//! for file-backed mappings, the open file and its identity (device and
//! inode: what the seed engine called `mmap_fd`). A [`Borrow`] is a byte
//! range of one mapping that keeps the mapping alive; cloning it or taking a
//! sub-span (one expert's rows of a stacked tensor) never copies bytes.
//!
//! # Safety of the mapping
//!
//! A mapping is only sound while nobody truncates or rewrites the file under
//! it; that is the one assumption of this module, as of every mmap-based
//! loader. Model files are written once and read many times. Deleting the
//! file is fine: the mapping keeps the inode alive. Since an operator (or
//! an adversary) can break the assumption, it is checked where it can be:
//! only regular files are mapped (a FIFO, a device, a directory or a procfs
//! file is refused before anything reads it), [`MappedFile::check_unchanged`]
//! tells whether the file's size, times or inode moved since it was opened
//! (callers run it after every read pass), and a read that faults because
//! the file was truncated becomes one line and exit 2 in binaries that opt
//! in ([`fault`]).
//!
//! Dropping resident pages (`MappedFile::drop_resident_pages`, the seam's own) never makes
//! a borrow invalid: the mapping is shared and read-only, so the next read
//! faults identical bytes back in from the file.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions};

pub mod fault;

/// The identity of a mapped file: device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    /// `st_dev` of the file.
    pub dev: u64,
    /// `st_ino` of the file.
    pub ino: u64,
}

/// What a file looked like when it was opened: what
/// [`MappedFile::check_unchanged`] compares with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    /// Device and inode.
    pub identity: FileIdentity,
    /// Size in bytes.
    pub len: u64,
    /// Last modification (seconds, nanoseconds).
    pub modified: (i64, i64),
    /// Last status change (seconds, nanoseconds): a write, a truncation, a
    /// `touch` that sets the modification time back all move it.
    pub changed: (i64, i64),
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            identity: FileIdentity {
                dev: meta.dev(),
                ino: meta.ino(),
            },
            len: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
            changed: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// What differs from `then` to `self`, in words; `None` when nothing
    /// does.
    fn changes_since(&self, then: &FileStamp) -> Option<String> {
        let mut what = Vec::new();
        if self.identity != then.identity {
            what.push(format!(
                "the path now names another file (inode {} -> {})",
                then.identity.ino, self.identity.ino
            ));
        }
        if self.len != then.len {
            what.push(format!("size {} -> {} bytes", then.len, self.len));
        }
        if self.modified != then.modified {
            what.push("modification time moved".to_owned());
        }
        if self.changed != then.changed && self.len == then.len && self.modified == then.modified {
            what.push("status change time moved".to_owned());
        }
        (!what.is_empty()).then(|| what.join(", "))
    }
}

/// How to map a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapOptions {
    /// Prefault: `MAP_POPULATE` plus advisory `madvise(WILLNEED)` over the
    /// whole mapping. Never a loop that touches pages (the brief's prefault
    /// policy): the kernel reads ahead, the process does not fault twice.
    pub prefault: bool,
}

/// One read-only shared mapping of a whole file (or, in tests, of an
/// anonymous region that has no file behind it).
pub struct MappedFile {
    path: PathBuf,
    file: Option<Arc<File>>,
    identity: Option<FileIdentity>,
    stamp: Option<FileStamp>,
    /// The mapping's entry in the fault registry; declared before `map` so
    /// that it is dropped (unregistered) before the mapping goes.
    _fault: Option<fault::Registration>,
    map: Option<Mmap>,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedFile")
            .field("path", &self.path)
            .field("identity", &self.identity)
            .field("len", &self.len())
            .finish()
    }
}

/// An error from creating a borrow or dropping its pages.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BorrowError {
    /// The range does not lie inside the mapping (or its span).
    #[error("{}: range [{start}, +{len}) is outside [0, {limit})", path.display())]
    OutOfRange {
        /// The mapped file.
        path: PathBuf,
        /// Requested start.
        start: u64,
        /// Requested length.
        len: u64,
        /// The size of what it must fit in.
        limit: u64,
    },
    /// The path is not a regular file (a FIFO, a device, a directory, a
    /// file of procfs or sysfs, whose size is not its content).
    #[error("{}: {kind}, not a regular file", crate::text::path_safe(path))]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is instead ("a directory", "a FIFO (named pipe)", ...).
        kind: &'static str,
    },
    /// The file changed since it was opened.
    #[error(
        "{}: the file changed while it was being read: {what}",
        crate::text::path_safe(path)
    )]
    Changed {
        /// The file.
        path: PathBuf,
        /// What changed, in words.
        what: String,
    },
    /// An operating-system call failed.
    #[error("{}: {op}: {source}", path.display())]
    Os {
        /// The mapped file.
        path: PathBuf,
        /// The call (`mmap`, `madvise`, `posix_fadvise`).
        op: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

/// What `file` is when it is not a regular file that holds its bytes: a
/// kind named for people. Files of procfs and sysfs are regular files to
/// `stat`, but their size is 0 or a page whatever they hold.
fn not_regular(file: &File, meta: &std::fs::Metadata) -> Option<&'static str> {
    let ty = meta.file_type();
    let kind = if ty.is_dir() {
        "a directory"
    } else if ty.is_fifo() {
        "a FIFO (named pipe)"
    } else if ty.is_char_device() {
        "a character device"
    } else if ty.is_block_device() {
        "a block device"
    } else if ty.is_socket() {
        "a socket"
    } else if !ty.is_file() {
        "not a file"
    } else {
        return pseudo_file_system(file);
    };
    Some(kind)
}

/// "a file of procfs" or "a file of sysfs" when `file` lives there.
fn pseudo_file_system(file: &File) -> Option<&'static str> {
    use std::os::fd::AsRawFd;
    const PROC_SUPER_MAGIC: i64 = 0x9fa0;
    const SYSFS_MAGIC: i64 = 0x6265_6572;
    // SAFETY: a zeroed statfs is a valid value for fstatfs to fill.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: the descriptor is open for the call (borrowed from `file`)
    // and `fs` is a live statfs.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)]
    match fs.f_type as i64 {
        PROC_SUPER_MAGIC => Some("a file of procfs (its size is not its content)"),
        SYSFS_MAGIC => Some("a file of sysfs (its size is not its content)"),
        _ => None,
    }
}

/// The system page size.
pub fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions; it reads a constant of the system.
    page_size_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
}

/// The page size `sysconf` answered, or 4096 where it answered nothing
/// usable (-1 on error, or 0).
fn page_size_from(sysconf: libc::c_long) -> u64 {
    u64::try_from(sysconf)
        .ok()
        .filter(|s| *s > 0)
        .unwrap_or(4096)
}

impl MappedFile {
    /// Maps `path` read-only and shared.
    ///
    /// # Errors
    ///
    /// The file cannot be opened, stat'ed or mapped.
    pub fn open(path: &Path, options: MapOptions) -> Result<Arc<MappedFile>, BorrowError> {
        let os = |op, source| BorrowError::Os {
            path: path.to_path_buf(),
            op,
            source,
        };
        // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
        // writer forever, before the kind check below could refuse it. It
        // changes nothing for a regular file.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| os("open", e))?;
        let meta = file.metadata().map_err(|e| os("stat", e))?;
        if let Some(kind) = not_regular(&file, &meta) {
            return Err(BorrowError::NotRegular {
                path: path.to_path_buf(),
                kind,
            });
        }
        let stamp = FileStamp::of(&meta);
        let identity = stamp.identity;
        let map = if meta.len() == 0 {
            // mmap(2) refuses a zero-length mapping; an empty file has no
            // bytes to borrow and the parser reports it as truncated.
            None
        } else {
            let mut opts = MmapOptions::new();
            if options.prefault {
                opts.populate();
            }
            // SAFETY: the mapping is read-only and shared; the module docs
            // state the one assumption (nobody rewrites a model file while it
            // is mapped). The length comes from the file itself.
            let map = unsafe { opts.map(&file) }.map_err(|e| os("mmap", e))?;
            if options.prefault {
                map.advise(memmap2::Advice::WillNeed)
                    .map_err(|e| os("madvise(WILLNEED)", e))?;
            }
            Some(map)
        };
        let fault = map
            .as_ref()
            .map(|m| fault::Registration::new(m.as_ptr(), m.len(), &crate::text::path_safe(path)));
        Ok(Arc::new(MappedFile {
            path: path.to_path_buf(),
            file: Some(Arc::new(file)),
            identity: Some(identity),
            stamp: Some(stamp),
            _fault: fault,
            map,
        }))
    }

    /// What the file looked like when it was opened; `None` for an
    /// anonymous mapping.
    pub fn stamp(&self) -> Option<FileStamp> {
        self.stamp
    }

    /// Checks that the file is still the one that was mapped: same size,
    /// same modification and status-change times (through the open file),
    /// and the path still names the same inode. Run it after every pass
    /// that reads the file: a change means what was read may be neither the
    /// old file nor the new one.
    ///
    /// # Errors
    ///
    /// [`BorrowError::Changed`] naming what changed, or a `stat` failed.
    pub fn check_unchanged(&self) -> Result<(), BorrowError> {
        let (Some(then), Some(file)) = (self.stamp, self.file.as_ref()) else {
            return Ok(());
        };
        let os = |op, source| BorrowError::Os {
            path: self.path.clone(),
            op,
            source,
        };
        let mut now = FileStamp::of(&file.metadata().map_err(|e| os("stat", e))?);
        // The path may have been renamed over or removed: the open file is
        // what was read, the path is what a later run would read.
        match std::fs::metadata(&self.path) {
            Ok(meta) => {
                now.identity = FileStamp::of(&meta).identity;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(os("stat", e)),
        }
        match now.changes_since(&then) {
            None => Ok(()),
            Some(what) => Err(BorrowError::Changed {
                path: self.path.clone(),
                what,
            }),
        }
    }

    /// An anonymous read-only mapping holding a copy of `bytes`: a mapping
    /// with no file behind it (its pages cannot be re-read from a file, so
    /// the seam never releases them). For tests and generated data.
    ///
    /// # Errors
    ///
    /// The anonymous mapping cannot be created.
    pub fn anonymous(name: &str, bytes: &[u8]) -> Result<Arc<MappedFile>, BorrowError> {
        let path = PathBuf::from(name);
        let map = if bytes.is_empty() {
            None
        } else {
            let mut map = MmapOptions::new()
                .len(bytes.len())
                .map_anon()
                .map_err(|source| BorrowError::Os {
                    path: path.clone(),
                    op: "mmap(anonymous)",
                    source,
                })?;
            map.copy_from_slice(bytes);
            Some(map.make_read_only().map_err(|source| BorrowError::Os {
                path: path.clone(),
                op: "mprotect",
                source,
            })?)
        };
        Ok(Arc::new(MappedFile {
            path,
            file: None,
            identity: None,
            stamp: None,
            _fault: None,
            map,
        }))
    }

    /// The path the file was opened from (a label for anonymous mappings).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Device and inode of the file; `None` for an anonymous mapping.
    pub fn identity(&self) -> Option<FileIdentity> {
        self.identity
    }

    /// Whether the mapping has a file behind it (its pages can be dropped
    /// and faulted back in from the file).
    pub fn is_file_backed(&self) -> bool {
        self.identity.is_some()
    }

    /// The open file, for positional reads and `posix_fadvise`.
    pub fn file(&self) -> Option<&File> {
        self.file.as_deref()
    }

    /// The mapped bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }

    /// The length of the mapping in bytes.
    pub fn len(&self) -> u64 {
        self.bytes().len() as u64
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops this process's resident pages of the page-aligned interior of
    /// `[offset, offset + len)` with `madvise(MADV_DONTNEED)`; bytes of the
    /// partial pages at either end are left alone, since they belong to the
    /// neighbours too. With `drop_page_cache`, also asks the kernel to drop
    /// the file's page cache for the range (`posix_fadvise(DONTNEED)`,
    /// handed to a background thread: [`crate::page_cache::flush`] waits for
    /// it), which takes effect once no mapping holds those pages.
    ///
    /// Returns the number of bytes whose pages were dropped (0 when the
    /// range holds no whole page). Reading the range afterwards faults
    /// identical bytes back in.
    ///
    /// # Errors
    ///
    /// The range is outside the mapping, or a system call fails.
    ///
    /// Private to the seam: only the release of a staged weight and
    /// [`Borrow::read_releasing`] give pages back.
    ///
    /// ```compile_fail,E0624
    /// fn drop_early(b: &seam::borrow::Borrow) {
    ///     let _ = b.file().drop_resident_pages(b.offset(), b.len(), true);
    /// }
    /// ```
    pub(crate) fn drop_resident_pages(
        &self,
        offset: u64,
        len: u64,
        drop_page_cache: bool,
    ) -> Result<u64, BorrowError> {
        self.check_range(offset, len)?;
        let page = page_size();
        let start = offset.div_ceil(page) * page;
        let end = (offset + len) / page * page;
        if end <= start {
            return Ok(0);
        }
        let Some(map) = self.map.as_ref() else {
            return Ok(0);
        };
        // An anonymous mapping's dropped pages would read back as zeros:
        // only file-backed pages may be given back.
        if !self.is_file_backed() {
            return Ok(0);
        }
        let os = |op, source| BorrowError::Os {
            path: self.path.clone(),
            op,
            source,
        };
        // The mapping starts at file offset 0, so it is page-aligned and
        // `start`/`end` are page-aligned addresses inside it (checked above).
        let (start_usize, span) = (start as usize, (end - start) as usize);
        // SAFETY: MADV_DONTNEED on a shared read-only file mapping discards
        // this process's page-table entries; the next access faults the same
        // bytes in from the file, so no Rust reference to the bytes ever sees
        // different contents. For an anonymous mapping the pages would read
        // back as zeros, so anonymous ones are refused just above.
        unsafe {
            map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start_usize, span)
        }
        .map_err(|e| os("madvise(DONTNEED)", e))?;
        if drop_page_cache && let Some(file) = self.file.as_ref() {
            // Off the staging path: see `page_cache`.
            crate::page_cache::drop_later(Arc::clone(file), start, end);
        }
        Ok(end - start)
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), BorrowError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(BorrowError::OutOfRange {
                path: self.path.clone(),
                start: offset,
                len,
                limit: self.len(),
            }),
        }
    }
}

/// A read-only view of a byte range of a mapped file; keeps the mapping
/// alive. The brief's Borrow: it knows its file, its offset and its length.
#[derive(Clone)]
pub struct Borrow {
    file: Arc<MappedFile>,
    offset: u64,
    len: u64,
}

impl std::fmt::Debug for Borrow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Borrow")
            .field("path", &self.file.path)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl Borrow {
    /// Reads the bytes once, in chunks of `chunk` bytes (at least one
    /// page), handing each to `visit` and then giving its whole pages back
    /// (the file's page cache is kept): hashing or checking a borrow larger
    /// than memory keeps this process small. The borrow stays readable.
    ///
    /// ```
    /// # let dir = tempfile::tempdir()?;
    /// # let path = dir.path().join("m.bin");
    /// # std::fs::write(&path, vec![7u8; 1 << 20])?;
    /// use seam::borrow::{Borrow, MapOptions, MappedFile};
    /// let file = MappedFile::open(&path, MapOptions::default())?;
    /// let borrow = Borrow::new(file, 0, 1 << 20)?;
    /// let mut sum = 0u64;
    /// borrow.read_releasing(64 << 10, |chunk| sum += chunk.iter().map(|&b| u64::from(b)).sum::<u64>());
    /// assert_eq!(sum, 7 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn read_releasing(&self, chunk: usize, mut visit: impl FnMut(&[u8])) {
        let chunk = chunk.max(page_size() as usize);
        for (i, bytes) in self.bytes().chunks(chunk).enumerate() {
            visit(bytes);
            // Giving pages back only saves memory; a failure leaves the
            // bytes as they are.
            let _ = self.file.drop_resident_pages(
                self.offset + (i * chunk) as u64,
                bytes.len() as u64,
                false,
            );
        }
    }

    /// A borrow of `[offset, offset + len)` of `file`.
    ///
    /// # Errors
    ///
    /// The range does not lie inside the mapping.
    pub fn new(file: Arc<MappedFile>, offset: u64, len: u64) -> Result<Borrow, BorrowError> {
        file.check_range(offset, len)?;
        Ok(Borrow { file, offset, len })
    }

    /// A narrower borrow of the same file: `[start, start + len)` relative to
    /// this borrow (one expert's rows of a stacked tensor). No bytes move.
    ///
    /// # Errors
    ///
    /// The range does not lie inside this borrow.
    pub fn sub_span(&self, start: u64, len: u64) -> Result<Borrow, BorrowError> {
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(Borrow {
                file: Arc::clone(&self.file),
                offset: self.offset + start,
                len,
            }),
            _ => Err(BorrowError::OutOfRange {
                path: self.file.path.clone(),
                start,
                len,
                limit: self.len,
            }),
        }
    }

    /// The bytes. After a release they fault back in from the file.
    pub fn bytes(&self) -> &[u8] {
        // In range by construction (checked in `new` and `sub_span`).
        &self.file.bytes()[self.offset as usize..(self.offset + self.len) as usize]
    }

    /// The mapping this borrow views.
    pub fn file(&self) -> &Arc<MappedFile> {
        &self.file
    }

    /// The absolute byte offset in the file.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the borrow is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file's identity; `None` when the mapping has no file behind it.
    pub fn file_identity(&self) -> Option<FileIdentity> {
        self.file.identity()
    }
}

#[cfg(test)]
mod tests;
