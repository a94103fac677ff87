//! Tests of borrows: ranges and their errors, anonymous versus file-backed
//! mappings, dropping resident pages (measured in `/proc/self/smaps`, and
//! only ever the whole pages inside a span), borrows that outlive their
//! file's name, and empty files.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::{Borrow, BorrowError, MapOptions, MappedFile, page_size, page_size_from};
use crate::gguf::{GgufErrorKind, GgufFile};

/// Deterministic bytes that differ from page to page.
fn pattern(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i as u64 * 2_654_435_761) >> 7) as u8)
        .collect()
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Writes `bytes` to `dir/name`, flushed to disk so its page cache is clean
/// (and can really be dropped).
fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
    path
}

/// Checks that `result` is an out-of-range error for `start`, `len` and
/// `limit`.
#[track_caller]
fn check_out_of_range<T: std::fmt::Debug>(
    result: Result<T, BorrowError>,
    start: u64,
    len: u64,
    limit: u64,
) {
    match result {
        Err(BorrowError::OutOfRange {
            start: s,
            len: l,
            limit: m,
            ..
        }) => assert_eq!((s, l, m), (start, len, limit)),
        other => panic!("expected OutOfRange [{start}, +{len}) of {limit}, got {other:?}"),
    }
}

/// The resident kB of the mapping that contains `addr`, from
/// `/proc/self/smaps`: residency of this one mapping, whatever other tests
/// in this process do.
fn mapping_rss_kib(addr: *const u8) -> u64 {
    let addr = addr as usize;
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((start, end)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            )
        {
            inside = (start..end).contains(&addr);
            continue;
        }
        if inside && let Some(rest) = line.strip_prefix("Rss:") {
            return rest.trim().trim_end_matches("kB").trim().parse().unwrap();
        }
    }
    panic!("no mapping contains {addr:#x}");
}

#[test]
fn sub_span_ranges_and_errors() {
    let bytes = pattern(100);
    let m = MappedFile::anonymous("anon", &bytes).unwrap();
    let b = Borrow::new(Arc::clone(&m), 10, 80).unwrap();
    assert_eq!(b.bytes(), &bytes[10..90]);

    let s = b.sub_span(5, 20).unwrap();
    assert_eq!((s.offset(), s.len()), (15, 20));
    assert_eq!(s.bytes(), &bytes[15..35]);
    // A sub-span of a sub-span is relative to its parent.
    let ss = s.sub_span(19, 1).unwrap();
    assert_eq!((ss.offset(), ss.bytes()), (34, &bytes[34..35]));
    // The whole span, and empty spans at either end.
    assert_eq!(b.sub_span(0, 80).unwrap().bytes(), b.bytes());
    assert!(b.sub_span(0, 0).unwrap().is_empty());
    assert!(b.sub_span(80, 0).unwrap().is_empty());
    // No bytes move: the sub-span points into the same mapping.
    assert_eq!(s.bytes().as_ptr(), b.bytes()[5..].as_ptr());
    assert!(Arc::ptr_eq(s.file(), &m));

    check_out_of_range(b.sub_span(81, 0), 81, 0, 80);
    check_out_of_range(b.sub_span(0, 81), 0, 81, 80);
    check_out_of_range(b.sub_span(70, 11), 70, 11, 80);
    check_out_of_range(b.sub_span(u64::MAX, 2), u64::MAX, 2, 80);
    check_out_of_range(b.sub_span(2, u64::MAX), 2, u64::MAX, 80);
    check_out_of_range(s.sub_span(1, 20), 1, 20, 20);
}

#[test]
fn borrow_new_out_of_range() {
    let m = MappedFile::anonymous("anon", &pattern(64)).unwrap();
    assert_eq!(Borrow::new(Arc::clone(&m), 64, 0).unwrap().len(), 0);
    assert_eq!(Borrow::new(Arc::clone(&m), 0, 64).unwrap().len(), 64);
    check_out_of_range(Borrow::new(Arc::clone(&m), 0, 65), 0, 65, 64);
    check_out_of_range(Borrow::new(Arc::clone(&m), 65, 0), 65, 0, 64);
    check_out_of_range(Borrow::new(Arc::clone(&m), 1, u64::MAX), 1, u64::MAX, 64);
    check_out_of_range(Borrow::new(Arc::clone(&m), u64::MAX, 1), u64::MAX, 1, 64);
    check_out_of_range(m.drop_resident_pages(60, 5, false), 60, 5, 64);
    check_out_of_range(m.drop_resident_pages(u64::MAX, 1, false), u64::MAX, 1, 64);
}

#[test]
fn anonymous_mappings_are_never_released() {
    let page = page_size() as usize;
    let bytes = pattern(8 * page);
    let m = MappedFile::anonymous("anon", &bytes).unwrap();
    assert!(!m.is_file_backed());
    assert_eq!(m.identity(), None);
    assert!(m.file().is_none());
    let b = Borrow::new(Arc::clone(&m), 0, m.len()).unwrap();
    assert_eq!(b.file_identity(), None);
    // Its dropped pages would read back as zeros, so none are dropped.
    assert_eq!(m.drop_resident_pages(0, m.len(), false).unwrap(), 0);
    assert_eq!(m.drop_resident_pages(0, m.len(), true).unwrap(), 0);
    assert_eq!(b.bytes(), &bytes[..]);
    // Empty anonymous mappings have no map at all.
    let empty = MappedFile::anonymous("empty", &[]).unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.drop_resident_pages(0, 0, false).unwrap(), 0);
}

/// `n` bytes (a multiple of 4096) that differ from page to page, made by
/// copying (fast in unoptimized test builds too).
fn big_pattern(n: usize) -> Vec<u8> {
    let block = pattern(4096);
    let mut out = Vec::with_capacity(n);
    for i in 0..n / 4096 {
        out.extend_from_slice(&block);
        out[i * 4096..i * 4096 + 8].copy_from_slice(&(i as u64).to_le_bytes());
    }
    out
}

/// A 64 MiB file: read it, drop its pages (the mapping's Rss falls to
/// nothing), read it again (the same bytes fault back in).
#[test]
fn dropped_pages_leave_residency_and_fault_back_identical() {
    const LEN: usize = 64 << 20;
    const LEN_KIB: u64 = (LEN >> 10) as u64;
    let dir = tempfile::tempdir().unwrap();
    let bytes = big_pattern(LEN);
    let path = write_file(dir.path(), "big.bin", &bytes);

    let m = MappedFile::open(&path, MapOptions::default()).unwrap();
    assert!(m.is_file_backed());
    let meta = std::fs::metadata(&path).unwrap();
    let id = m.identity().unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((id.dev, id.ino), (meta.dev(), meta.ino()));
    let b = Borrow::new(Arc::clone(&m), 0, m.len()).unwrap();
    assert_eq!(b.file_identity(), Some(id));
    let addr = b.bytes().as_ptr();

    assert!(b.bytes() == &bytes[..]);
    let read_kib = mapping_rss_kib(addr);
    assert!(
        read_kib >= LEN_KIB * 9 / 10,
        "after reading, only {read_kib} kB resident"
    );

    assert_eq!(
        m.drop_resident_pages(b.offset(), b.len(), false).unwrap(),
        LEN as u64
    );
    let dropped_kib = mapping_rss_kib(addr);
    assert!(
        dropped_kib < 1024,
        "after dropping, {dropped_kib} kB still resident (was {read_kib})"
    );

    assert!(b.bytes() == &bytes[..]);
    assert!(mapping_rss_kib(addr) >= LEN_KIB * 9 / 10);

    // Dropping the page cache too: the bytes come back from the disk.
    assert_eq!(
        m.drop_resident_pages(0, LEN as u64, true).unwrap(),
        LEN as u64
    );
    assert!(mapping_rss_kib(addr) < 1024);
    assert!(b.bytes() == &bytes[..]);
}

#[test]
fn a_borrow_outlives_its_files_name() {
    let page = page_size() as usize;
    let dir = tempfile::tempdir().unwrap();
    let bytes = pattern(4 * page + 123);
    let path = write_file(dir.path(), "gone.bin", &bytes);
    let b = {
        let m = MappedFile::open(&path, MapOptions { prefault: true }).unwrap();
        Borrow::new(m, 100, bytes.len() as u64 - 100).unwrap()
    };
    std::fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    assert_eq!(b.bytes(), &bytes[100..]);
    // Its pages still come back from the (unlinked) inode.
    let dropped = b
        .file()
        .drop_resident_pages(0, b.file().len(), true)
        .unwrap();
    assert_eq!(dropped, 4 * page as u64);
    assert_eq!(b.bytes(), &bytes[100..]);
    assert_eq!(b.sub_span(1, 2).unwrap().bytes(), &bytes[101..103]);
}

#[test]
fn only_whole_pages_inside_a_span_are_dropped() {
    let p = page_size();
    let dir = tempfile::tempdir().unwrap();
    let bytes = pattern(8 * p as usize);
    let path = write_file(dir.path(), "pages.bin", &bytes);
    let m = MappedFile::open(&path, MapOptions::default()).unwrap();
    let check = |offset: u64, len: u64, pages: u64| {
        let _ = sha256(m.bytes()); // make every page resident again
        let dropped = m.drop_resident_pages(offset, len, false).unwrap();
        assert_eq!(dropped, pages * p, "[{offset}, +{len})");
        assert_eq!(m.bytes(), &bytes[..], "[{offset}, +{len})");
    };
    // Smaller than a page: inside one page, or across a page boundary.
    check(10, p / 2, 0);
    check(p - 10, 20, 0);
    check(0, p - 1, 0);
    check(0, 0, 0);
    // 3.5 pages from a page boundary: the 3 whole pages.
    check(0, 7 * p / 2, 3);
    // 3.5 pages from the middle of a page: [p/2, 4p) holds pages 1..4.
    check(p / 2, 7 * p / 2, 3);
    // 3.5 pages from a quarter page: [p/4, 3.75p) holds pages 1 and 2.
    check(p / 4, 7 * p / 2, 2);
    // Exactly one page; the whole file.
    check(p, p, 1);
    check(0, 8 * p, 8);
}

#[test]
fn an_empty_file_maps_to_nothing_and_parses_as_truncated_magic() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "empty.gguf", &[]);
    let m = MappedFile::open(&path, MapOptions { prefault: true }).unwrap();
    assert!(m.is_empty());
    assert!(m.bytes().is_empty());
    assert!(m.is_file_backed());
    assert!(Borrow::new(Arc::clone(&m), 0, 0).unwrap().is_empty());
    check_out_of_range(Borrow::new(Arc::clone(&m), 0, 1), 0, 1, 0);
    assert_eq!(m.drop_resident_pages(0, 0, true).unwrap(), 0);

    let err = GgufFile::open(&path, MapOptions::default(), 0).unwrap_err();
    assert_eq!((err.offset, err.field.as_str()), (0, "magic"));
    assert!(
        matches!(err.kind, GgufErrorKind::Truncated { need: 4, have: 0 }),
        "{err}"
    );
}

/// Pages of the file that are in the page cache, by `mincore` on a fresh
/// mapping (mincore reports page-cache state, which is what this asks).
fn page_cache_pages(path: &std::path::Path) -> usize {
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: a read-only shared mapping of a file this test owns and does
    // not modify while it is mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let pages = map.len().div_ceil(page_size() as usize);
    let mut vec = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `map.len()` bytes at a page-aligned
    // address; `vec` has one byte per page of it.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr() as *mut libc::c_void,
            map.len(),
            vec.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().filter(|&&b| b & 1 == 1).count()
}

#[test]
fn dropped_page_cache_leaves_the_cache_after_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache.bin");
    let bytes = seam_tools::demo::pseudo_random_bytes(9, 8 << 20);
    std::fs::write(&path, &bytes).unwrap();
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    let mapped = MappedFile::open(&path, MapOptions::default()).unwrap();
    assert_eq!(mapped.bytes(), &bytes[..]);
    let pages = (8 << 20) / page_size() as usize;
    assert!(
        page_cache_pages(&path) > pages / 2,
        "the file should be cached after reading it"
    );

    // Without the page-cache drop, the cache stays.
    mapped.drop_resident_pages(0, 8 << 20, false).unwrap();
    crate::page_cache::flush().unwrap();
    assert!(page_cache_pages(&path) > pages / 2);

    // With it, the flush returns once the kernel was told to drop them.
    let _ = mapped.bytes().iter().map(|&b| u64::from(b)).sum::<u64>();
    mapped.drop_resident_pages(0, 8 << 20, true).unwrap();
    crate::page_cache::flush().unwrap();
    let left = page_cache_pages(&path);
    assert!(left < pages / 8, "{left} of {pages} pages still cached");
    assert_eq!(
        mapped.bytes(),
        &bytes[..],
        "the borrow still reads the file"
    );
}

#[test]
fn the_page_size_is_what_sysconf_says_or_4096() {
    assert_eq!(page_size_from(16384), 16384);
    assert_eq!(page_size_from(1), 1);
    assert_eq!(page_size_from(0), 4096, "zero is no page size");
    assert_eq!(page_size_from(-1), 4096, "sysconf failed");
    assert!(page_size().is_power_of_two() && page_size() >= 4096);
}

/// A file-backed mapping has its open file (reading it gives the mapped
/// bytes); an anonymous one has none. Emptiness is the length's.
#[test]
fn a_mapping_knows_its_file_and_whether_it_is_empty() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let bytes = pattern(10_000);
    let path = write_file(dir.path(), "f.bin", &bytes);
    let m = MappedFile::open(&path, MapOptions::default()).unwrap();
    let mut back = vec![0u8; 100];
    m.file()
        .expect("a file-backed mapping has its file")
        .read_exact_at(&mut back, 5000)
        .unwrap();
    assert_eq!(back, bytes[5000..5100]);
    assert!(!m.is_empty());
    let anon = MappedFile::anonymous("anon", &bytes).unwrap();
    assert!(anon.file().is_none());
    assert!(!anon.is_empty());
    let empty_path = write_file(dir.path(), "empty.bin", &[]);
    let empty = MappedFile::open(&empty_path, MapOptions::default()).unwrap();
    assert!(empty.is_empty());
    assert!(empty.file().is_some());
    let b = Borrow::new(Arc::clone(&m), 10, 20).unwrap();
    assert!(!b.is_empty());
    assert!(Borrow::new(m, 10, 0).unwrap().is_empty());
}

/// `read_releasing` hands every byte over once, in order, and gives the
/// whole pages of each chunk back: after it, the span is (nearly) not
/// resident, whatever its offset.
#[test]
fn read_releasing_visits_every_byte_and_gives_the_pages_back() {
    const LEN: usize = 8 << 20;
    let dir = tempfile::tempdir().unwrap();
    let bytes = big_pattern(LEN);
    let path = write_file(dir.path(), "r.bin", &bytes);
    let m = MappedFile::open(&path, MapOptions::default()).unwrap();
    let (offset, len) = (1_000_100u64, 5 << 20);
    let b = Borrow::new(Arc::clone(&m), offset, len).unwrap();
    let mut seen = Vec::with_capacity(len as usize);
    let mut chunks = 0;
    b.read_releasing(1 << 20, |chunk| {
        seen.extend_from_slice(chunk);
        chunks += 1;
    });
    assert_eq!(chunks, 5);
    assert!(seen == bytes[offset as usize..(offset + len) as usize]);
    // Two partial pages per chunk may stay.
    let rss = mapping_rss_kib(m.bytes().as_ptr());
    assert!(rss <= 2 * 5 * page_size() / 1024, "{rss} KiB resident");
    // A chunk under a page is read a page at a time.
    let mut small = (0, 0);
    b.read_releasing(1, |chunk| {
        small = (small.0 + 1, small.1 + chunk.len());
    });
    assert_eq!(small, (len.div_ceil(page_size()) as usize, len as usize));
}

/// Debug output names the file and the span (what a log of a failed load
/// needs), never the bytes.
#[test]
fn debug_output_names_the_file_and_span() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "named.bin", &pattern(8192));
    let m = MappedFile::open(&path, MapOptions::default()).unwrap();
    let mapped = format!("{m:?}");
    assert!(
        mapped.starts_with("MappedFile") && mapped.contains("named.bin") && mapped.contains("8192"),
        "{mapped}"
    );
    let b = Borrow::new(m, 100, 200).unwrap();
    let borrow = format!("{b:?}");
    assert!(
        borrow.starts_with("Borrow")
            && borrow.contains("named.bin")
            && borrow.contains("offset: 100"),
        "{borrow}"
    );
    assert!(borrow.contains("len: 200"), "{borrow}");
}

/// What `changes_since` says for each field that moved, and nothing when
/// none did. A status-change time that moved alone is a change (a rewrite
/// that restored size and modification time); with the size or the
/// modification time it is not named again.
#[test]
fn a_stamp_names_what_changed_since_another() {
    use super::{FileIdentity, FileStamp};
    let then = FileStamp {
        identity: FileIdentity { dev: 1, ino: 10 },
        len: 100,
        modified: (5, 0),
        changed: (5, 0),
    };
    let changed = |f: &dyn Fn(&mut FileStamp)| {
        let mut now = then;
        f(&mut now);
        now.changes_since(&then)
    };
    assert_eq!(then.changes_since(&then), None);
    assert_eq!(
        changed(&|s| s.identity.ino = 11).as_deref(),
        Some("the path now names another file (inode 10 -> 11)")
    );
    assert_eq!(
        changed(&|s| s.identity.dev = 2).as_deref(),
        Some("the path now names another file (inode 10 -> 10)")
    );
    assert_eq!(
        changed(&|s| s.len = 99).as_deref(),
        Some("size 100 -> 99 bytes")
    );
    assert_eq!(
        changed(&|s| s.modified = (5, 1)).as_deref(),
        Some("modification time moved")
    );
    assert_eq!(
        changed(&|s| s.changed = (6, 0)).as_deref(),
        Some("status change time moved")
    );
    assert_eq!(
        changed(&|s| {
            s.changed = (6, 0);
            s.len = 200;
        })
        .as_deref(),
        Some("size 100 -> 200 bytes")
    );
    assert_eq!(
        changed(&|s| {
            s.changed = (6, 0);
            s.modified = (6, 0);
        })
        .as_deref(),
        Some("modification time moved")
    );
    assert_eq!(
        changed(&|s| {
            s.identity.ino = 12;
            s.len = 1;
        })
        .as_deref(),
        Some("the path now names another file (inode 10 -> 12), size 100 -> 1 bytes")
    );
}

/// A mapped file's stamp is its `stat` at open; an anonymous mapping has
/// none. `check_unchanged` passes until the file is written, and names the
/// change after.
#[test]
fn a_mapped_file_notices_a_write_after_it_was_opened() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "f.bin", &pattern(10_000));
    let m = MappedFile::open(&path, MapOptions::default()).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    let stamp = m.stamp().expect("a file-backed mapping has a stamp");
    assert_eq!(
        (stamp.identity.dev, stamp.identity.ino, stamp.len),
        (meta.dev(), meta.ino(), 10_000)
    );
    assert_eq!(stamp.modified, (meta.mtime(), meta.mtime_nsec()));
    assert!(
        MappedFile::anonymous("anon", &[1, 2])
            .unwrap()
            .stamp()
            .is_none()
    );
    m.check_unchanged().unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"more")
        .unwrap();
    match m.check_unchanged() {
        Err(BorrowError::Changed { path: p, what }) => {
            assert_eq!(p, path);
            assert!(what.contains("size 10000 -> 10004 bytes"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    // The path removed: the open file is what was read, so the answer is
    // about it, not a failed `stat` of the path. Unlinking moves its
    // status-change time, unless within the clock's granularity.
    let gone = write_file(dir.path(), "gone.bin", &pattern(5000));
    let m = MappedFile::open(&gone, MapOptions::default()).unwrap();
    std::fs::remove_file(&gone).unwrap();
    match m.check_unchanged() {
        Ok(()) => {}
        Err(BorrowError::Changed { what, .. }) => {
            assert_eq!(what, "status change time moved");
        }
        Err(other) => panic!("{other:?}"),
    }
    // The path cannot be looked up (its folder is now a file): an error
    // naming the failed `stat`, not a pass.
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let inner = write_file(&dir.path().join("sub"), "f.bin", &pattern(5000));
    let m = MappedFile::open(&inner, MapOptions::default()).unwrap();
    std::fs::rename(dir.path().join("sub"), dir.path().join("moved")).unwrap();
    write_file(dir.path(), "sub", b"not a folder");
    match m.check_unchanged() {
        Err(BorrowError::Os {
            op: "stat", path, ..
        }) => assert_eq!(path, inner),
        other => panic!("{other:?}"),
    }
    // Another file renamed over the path: what a later run would read.
    let old = write_file(dir.path(), "old.bin", &pattern(5000));
    let m = MappedFile::open(&old, MapOptions::default()).unwrap();
    let new = write_file(dir.path(), "new.bin", &pattern(5000));
    std::fs::rename(&new, &old).unwrap();
    match m.check_unchanged() {
        Err(BorrowError::Changed { what, .. }) => {
            assert!(
                what.starts_with("the path now names another file"),
                "{what}"
            );
        }
        other => panic!("{other:?}"),
    }
}

/// Directories and the files of procfs and sysfs (regular to `stat`, but
/// their size is not their content) are refused at open, naming what they
/// are.
#[test]
fn special_files_are_refused_at_open_naming_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = std::fs::read_dir("/sys/kernel")
        .expect("sysfs is mounted")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.is_file() && std::fs::File::open(p).is_ok())
        .expect("a readable file in /sys/kernel");
    for (path, kind) in [
        (dir.path().to_path_buf(), "a directory"),
        ("/proc/self/status".into(), "a file of procfs"),
        (sysfs, "a file of sysfs"),
    ] {
        match MappedFile::open(&path, MapOptions::default()) {
            Err(BorrowError::NotRegular { path: p, kind: k }) => {
                assert_eq!(p, path);
                assert!(k.starts_with(kind), "{}: {k}", path.display());
            }
            Err(e) => panic!("{}: {e}", path.display()),
            Ok(_) => panic!("{}: mapped", path.display()),
        }
    }
}
