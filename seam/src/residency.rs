//! This process's memory figures, read from `/proc`, as numbers a test or a
//! load report can assert on.
//!
//! `VmHWM` (peak RSS), `VmRSS`, `RssFile` and `RssAnon` come from
//! `/proc/self/status`; the resident bytes of one mapping come from
//! `/proc/self/smaps`. (mincore is not used: it reports page-cache state, not
//! this process's residency.)

use std::io;

/// Memory figures of this process, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Residency {
    /// Peak resident set size (`VmHWM`).
    pub peak: u64,
    /// Resident set size now (`VmRSS`).
    pub rss: u64,
    /// Resident file-backed pages (`RssFile`).
    pub rss_file: u64,
    /// Resident anonymous pages (`RssAnon`).
    pub rss_anon: u64,
}

fn field_kib(text: &str, name: &str) -> io::Result<u64> {
    text.lines()
        .find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse::<u64>().ok()
        })
        .map(|kib| kib * 1024)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no {name} in /proc status"),
            )
        })
}

/// Parses the text of a `/proc/PID/status` file.
///
/// # Errors
///
/// A field is missing.
pub fn parse_status(text: &str) -> io::Result<Residency> {
    Ok(Residency {
        peak: field_kib(text, "VmHWM")?,
        rss: field_kib(text, "VmRSS")?,
        rss_file: field_kib(text, "RssFile")?,
        rss_anon: field_kib(text, "RssAnon")?,
    })
}

/// This process's figures now.
///
/// # Errors
///
/// `/proc/self/status` cannot be read (not Linux).
pub fn current() -> io::Result<Residency> {
    parse_status(&std::fs::read_to_string("/proc/self/status")?)
}

/// Resets the peak (`VmHWM`) to the current RSS, so a later reading of the
/// peak measures only what follows (writes 5 to `/proc/self/clear_refs`).
///
/// # Errors
///
/// The kernel refuses the write.
pub fn reset_peak() -> io::Result<()> {
    std::fs::write("/proc/self/clear_refs", "5")
}

/// The resident bytes (`Rss`) of the mapping that contains `addr`, from
/// `/proc/self/smaps`; `None` when no mapping contains it.
///
/// # Errors
///
/// `/proc/self/smaps` cannot be read.
pub fn mapping_rss(addr: *const u8) -> io::Result<Option<u64>> {
    let text = std::fs::read_to_string("/proc/self/smaps")?;
    Ok(parse_smaps_rss(&text, addr as usize))
}

/// Finds the `Rss` of the mapping containing `addr` in smaps text.
pub fn parse_smaps_rss(text: &str, addr: usize) -> Option<u64> {
    let mut inside = false;
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            inside = (lo..hi).contains(&addr);
            continue;
        }
        if inside && let Some(rest) = line.strip_prefix("Rss:") {
            return rest
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
                .map(|k| k * 1024);
        }
    }
    None
}

/// How many of the pages that `bytes` touches are mapped in this process's
/// page tables now, from `/proc/self/pagemap` (bit 63 of each page's entry,
/// readable without privileges). Finer than [`mapping_rss`]: it tells which
/// part of a mapping is resident, not only how much.
///
/// # Errors
///
/// `/proc/self/pagemap` cannot be read.
pub fn mapped_pages(bytes: &[u8]) -> io::Result<u64> {
    use std::io::{Read, Seek, SeekFrom};
    if bytes.is_empty() {
        return Ok(0);
    }
    let page = crate::borrow::page_size() as usize;
    let start = bytes.as_ptr() as usize / page;
    let end = (bytes.as_ptr() as usize + bytes.len()).div_ceil(page);
    let mut pagemap = std::fs::File::open("/proc/self/pagemap")?;
    pagemap.seek(SeekFrom::Start(start as u64 * 8))?;
    let mut entries = vec![0u8; (end - start) * 8];
    pagemap.read_exact(&mut entries)?;
    Ok(count_present(&entries))
}

/// Counts the pagemap entries (8 bytes each, little-endian) whose present
/// bit (63) is set.
fn count_present(entries: &[u8]) -> u64 {
    entries.chunks_exact(8).filter(|e| e[7] & 0x80 != 0).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn present_entries_are_counted_by_bit_63_only() {
        let present = (1u64 << 63).to_le_bytes();
        let swapped = (1u64 << 62).to_le_bytes();
        let pfn_only = 0x0000_0000_00ff_ffffu64.to_le_bytes();
        let entries = [present, swapped, pfn_only, present].concat();
        assert_eq!(count_present(&entries), 2);
        assert_eq!(count_present(&[]), 0);
    }

    #[test]
    fn written_pages_are_mapped_and_untouched_ones_are_not() {
        let page = crate::borrow::page_size() as usize;
        // Anonymous and smaller than a huge page: only written pages are
        // backed (no fault-around, no THP).
        let mut map = memmap2::MmapMut::map_anon(4 * page).unwrap();
        assert_eq!(mapped_pages(&map).unwrap(), 0);
        map[page + 1] = 1;
        map[3 * page] = 1;
        assert_eq!(mapped_pages(&map).unwrap(), 2);
        assert_eq!(mapped_pages(&map[..page]).unwrap(), 0);
        assert_eq!(mapped_pages(&map[page + 1..page + 2]).unwrap(), 1);
        assert_eq!(mapped_pages(&map[page - 1..page + 1]).unwrap(), 1);
        assert_eq!(mapped_pages(&map[..0]).unwrap(), 0);
    }

    #[test]
    fn parses_status_fields() {
        let text = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\nRssAnon:\t  512 kB\nRssFile:\t  256 kB\n";
        assert_eq!(
            parse_status(text).unwrap(),
            Residency {
                peak: 2048 << 10,
                rss: 1024 << 10,
                rss_file: 256 << 10,
                rss_anon: 512 << 10
            }
        );
        assert!(parse_status("VmRSS: 1 kB\n").is_err());
    }

    #[test]
    fn parses_smaps_rss_of_the_right_mapping() {
        let text = "1000-2000 r--s 00000000 08:01 5 /a\nSize: 4 kB\nRss: 4 kB\n\
                    2000-6000 r--s 00000000 08:01 6 /b\nSize: 16 kB\nRss: 12 kB\n";
        assert_eq!(parse_smaps_rss(text, 0x1800), Some(4096));
        assert_eq!(parse_smaps_rss(text, 0x2000), Some(12 << 10));
        assert_eq!(parse_smaps_rss(text, 0x6000), None);
    }

    #[test]
    fn current_reads_this_process() {
        let r = current().unwrap();
        assert!(r.rss > 0 && r.peak >= r.rss);
    }
}
