//! How the ring reads a chunk of a file: buffered (`pread` through the page
//! cache) or direct (`O_DIRECT` into the pinned buffer, leaving the page
//! cache alone), and with `auto` which one, per chunk, from what of the
//! chunk the page cache already holds (`mincore` on the model's mapping).

use std::fmt;

use crate::knob::KnobValue;

/// A three-way knob: off, on, or decided per chunk (`auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Never.
    Off,
    /// Always (where the system allows it).
    On,
    /// Per chunk, from what the page cache holds.
    Auto,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Off => "off",
            Mode::On => "on",
            Mode::Auto => "auto",
        })
    }
}

impl KnobValue for Mode {
    const EXPECTED: &'static str = "on, off or auto (or 1/0, true/false, yes/no)";
    fn from_env(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Some(Mode::On),
            "0" | "false" | "off" | "no" => Some(Mode::Off),
            "auto" => Some(Mode::Auto),
            _ => None,
        }
    }
    fn from_json(value: &serde_json::Value) -> Option<Self> {
        match value {
            serde_json::Value::Bool(b) => Some(if *b { Mode::On } else { Mode::Off }),
            serde_json::Value::Number(n) => match n.as_u64() {
                Some(1) => Some(Mode::On),
                Some(0) => Some(Mode::Off),
                _ => None,
            },
            serde_json::Value::String(s) => Mode::from_env(s),
            _ => None,
        }
    }
}

/// With `auto`, a chunk is read directly when less than this share of its
/// pages is in the page cache (a mostly cached chunk is copied from the
/// cache faster than the disk could deliver it).
pub const AUTO_DIRECT_BELOW_RESIDENT: f64 = 0.5;

/// Whether a chunk is read with `O_DIRECT` under `mode`, given the share of
/// its pages in the page cache (`None`: unknown, read buffered).
pub fn reads_direct(mode: Mode, resident: Option<f64>) -> bool {
    match mode {
        Mode::Off => false,
        Mode::On => true,
        Mode::Auto => resident.is_some_and(|r| r < AUTO_DIRECT_BELOW_RESIDENT),
    }
}

/// The share (0..=1) of the pages under `bytes` (a range of a file
/// mapping) that the page cache holds, by `mincore`; `None` when the call
/// fails or the range is empty.
pub fn resident_share(bytes: &[u8]) -> Option<f64> {
    if bytes.is_empty() {
        return None;
    }
    let page = crate::borrow::page_size() as usize;
    let addr = bytes.as_ptr() as usize;
    let start = addr / page * page;
    let end = (addr + bytes.len()).div_ceil(page) * page;
    let pages = (end - start) / page;
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore only reads the page tables of `[start, end)`, the
    // page-aligned hull of `bytes` (mapped for as long as `bytes` lives),
    // and writes one byte per page into `vec`, which has exactly `pages`.
    let rc = unsafe {
        libc::mincore(
            start as *mut libc::c_void,
            end - start,
            vec.as_mut_ptr().cast(),
        )
    };
    (rc == 0).then(|| vec.iter().filter(|&&b| b & 1 == 1).count() as f64 / pages as f64)
}
