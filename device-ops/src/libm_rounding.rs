//! How the host's libm rounds `expf` and `logf`, for a device that computes
//! them otherwise.
//!
//! The CPU reference takes `expf` and `logf` from the C library, as
//! llama.cpp's CPU build does where ggml calls them (SiLU and the softmax
//! past the last whole 8, the sigmoid, softplus, the clamped SwiGLU). glibc's
//! (x86-64, 2.28 on) round to the nearest float but for arguments whose value
//! lies within a sliver of an ulp of a tie, where they give the other
//! neighbour. In a model that routes each token to 10 of 512 experts, one
//! such ulp can pick another expert and, steps later, another token.
//!
//! A device evaluates the function in f64 and rounds once: the correctly
//! rounded float. [`misrounded`] lists, sorted, the arguments (their f32
//! bits) at which glibc gives the neighbour on the exact value's side
//! instead, and [`rounded_as_libm`] is the rule a device applies with that
//! list. The lists are data, not code: `cargo xtask libm-rounding` writes
//! them ([`sweep`]) by asking this machine's libm for every finite float;
//! the tests here check them against the libm they run with.

use std::sync::OnceLock;

/// A libm function whose rounding [`misrounded`] lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LibmFn {
    /// `expf`.
    Expf,
    /// `logf`.
    Logf,
}

impl LibmFn {
    /// Both, in the order a device's tables take them.
    pub const ALL: [LibmFn; 2] = [LibmFn::Expf, LibmFn::Logf];

    /// The C name.
    pub fn name(self) -> &'static str {
        match self {
            LibmFn::Expf => "expf",
            LibmFn::Logf => "logf",
        }
    }

    /// The host libm's value (Rust's `f32::exp` and `f32::ln` call the C
    /// library's `expf` and `logf`).
    pub fn host(self, x: f32) -> f32 {
        match self {
            LibmFn::Expf => x.exp(),
            LibmFn::Logf => x.ln(),
        }
    }

    /// The value in f64, as a device computes it before rounding.
    pub fn exact(self, x: f32) -> f64 {
        match self {
            LibmFn::Expf => f64::from(x).exp(),
            LibmFn::Logf => f64::from(x).ln(),
        }
    }

    /// How far from a tie, in ulps of the result, a listed argument's
    /// value can lie: a device looks its argument up only nearer than this
    /// (glibc's `expf` is within 0.502 ulp, so its misrounded values lie
    /// within 0.002 ulp of a tie, 0.0017 the farthest; its `logf` is
    /// within 0.818 ulp, so a `logf` argument is always looked up). The
    /// tests check every listed argument against it.
    pub fn tie_window(self) -> f64 {
        match self {
            LibmFn::Expf => 1.0 / 512.0,
            LibmFn::Logf => 0.5,
        }
    }

    fn encoded(self) -> &'static [u8] {
        match self {
            LibmFn::Expf => include_bytes!("../data/libm_rounding/expf.bin"),
            LibmFn::Logf => include_bytes!("../data/libm_rounding/logf.bin"),
        }
    }

    /// Where `cargo xtask libm-rounding` writes the list, relative to this
    /// crate's directory.
    pub fn data_path(self) -> String {
        format!("data/libm_rounding/{}.bin", self.name())
    }
}

/// The arguments (f32 bits, ascending) at which the host's libm rounds `f`
/// to the other neighbour of the correctly rounded value: 170,648 for
/// `expf`, 416,909 for `logf` (glibc 2.36, x86-64).
pub fn misrounded(f: LibmFn) -> &'static [u32] {
    static LISTS: [OnceLock<Vec<u32>>; 2] = [OnceLock::new(), OnceLock::new()];
    LISTS[f as usize].get_or_init(|| decode(f.encoded()))
}

/// `f(x)` rounded as the host's libm rounds it, from its value `exact` in
/// f64: the nearest float, or, for an argument in `list` whose value lies
/// within `f`'s [`LibmFn::tie_window`] of a tie, the neighbour on the
/// exact value's side. What a device computes.
pub fn rounded_as_libm(f: LibmFn, x: f32, exact: f64, list: &[u32]) -> f32 {
    let nearest = exact as f32;
    if f64::from(nearest) == exact || !near_a_tie(f, nearest, exact) {
        return nearest;
    }
    if list.binary_search(&x.to_bits()).is_err() {
        return nearest;
    }
    next_toward(nearest, exact)
}

/// Whether `exact` lies within `f`'s tie window of a tie next to
/// `nearest` (its nearest float, distinct from it).
fn near_a_tie(f: LibmFn, nearest: f32, exact: f64) -> bool {
    // Infinity has no tie to be near; an overflowed result stays.
    if nearest.is_infinite() {
        return false;
    }
    let other = next_toward(nearest, exact);
    let ulp = (f64::from(other) - f64::from(nearest)).abs();
    // Past (0.5 - window) ulps from the nearest float is within the
    // window of the tie (a product, not a quotient: a device's test).
    (exact - f64::from(nearest)).abs() > (0.5 - f.tie_window()) * ulp
}

/// The float next to `v` in the direction of `toward`.
fn next_toward(v: f32, toward: f64) -> f32 {
    let up = toward > f64::from(v);
    if v == 0.0 {
        let tiny = f32::from_bits(1);
        return if up { tiny } else { -tiny };
    }
    let bits = v.to_bits();
    // Away from zero is one more in the magnitude's bits.
    let away = (v > 0.0) == up;
    f32::from_bits(if away { bits + 1 } else { bits - 1 })
}

/// Every finite argument at which the host's `f` differs from the
/// correctly rounded value (its f64 value rounded once), ascending: the
/// list [`misrounded`] holds, computed afresh over all 2^32 bit patterns
/// on every core.
pub fn sweep(f: LibmFn) -> Vec<u32> {
    let parts = std::thread::available_parallelism().map_or(1, usize::from);
    let span = (1u64 << 32).div_ceil(parts as u64);
    let found: Vec<Vec<u32>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..parts as u64)
            .map(|p| {
                s.spawn(move || {
                    let end = ((p + 1) * span).min(1 << 32);
                    (p * span..end)
                        .filter_map(|b| u32::try_from(b).ok())
                        .filter(|&b| {
                            let x = f32::from_bits(b);
                            let got = f.host(x);
                            // A NaN's sign bit is no rounding.
                            x.is_finite()
                                && !got.is_nan()
                                && got.to_bits() != (f.exact(x) as f32).to_bits()
                        })
                        .collect()
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_default())
            .collect()
    });
    found.concat()
}

/// `list` (ascending) as the data files hold it: each gap from the one
/// before (the first from 0) in LEB128.
pub fn encode(list: &[u32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len() * 2);
    let mut before = 0u32;
    for &b in list {
        let mut gap = b - before;
        before = b;
        loop {
            let low = (gap & 0x7f) as u8;
            gap >>= 7;
            if gap == 0 {
                out.push(low);
                break;
            }
            out.push(low | 0x80);
        }
    }
    out
}

/// The list [`encode`] wrote.
fn decode(bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(bytes.len() / 2);
    let (mut at, mut gap, mut shift) = (0u32, 0u32, 0u32);
    for &byte in bytes {
        gap |= u32::from(byte & 0x7f) << shift;
        shift += 7;
        if byte & 0x80 == 0 {
            at += gap;
            out.push(at);
            gap = 0;
            shift = 0;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lists_are_ascending_and_each_decodes_to_what_encodes_it() {
        for f in LibmFn::ALL {
            let list = misrounded(f);
            assert!(list.len() > 100_000, "{}: {}", f.name(), list.len());
            assert!(list.windows(2).all(|w| w[0] < w[1]), "{}", f.name());
            assert_eq!(encode(list), f.encoded(), "{}", f.name());
        }
        assert_eq!(
            decode(&encode(&[0, 1, 300, u32::MAX])),
            [0, 1, 300, u32::MAX]
        );
    }

    /// Every listed argument is one this machine's libm rounds otherwise,
    /// and the rule gives its value: the lists are this libm's.
    #[test]
    fn every_listed_argument_is_rounded_as_this_hosts_libm_rounds_it() {
        for f in LibmFn::ALL {
            let list = misrounded(f);
            for &b in list {
                let x = f32::from_bits(b);
                let (host, exact) = (f.host(x), f.exact(x));
                assert_ne!(
                    host.to_bits(),
                    (exact as f32).to_bits(),
                    "{} {x:e}",
                    f.name()
                );
                assert_eq!(
                    rounded_as_libm(f, x, exact, list).to_bits(),
                    host.to_bits(),
                    "{} {x:e}: the listed argument lies outside the tie window or past the neighbour",
                    f.name()
                );
            }
        }
    }

    /// Arguments spread over every binade (a prime stride through the bit
    /// patterns) and the neighbours of every listed one: the rule gives the
    /// host's value. The whole sweep is `cargo xtask libm-rounding --check`.
    #[test]
    fn the_rule_gives_this_hosts_libm_on_a_sample_of_every_float() {
        for f in LibmFn::ALL {
            let list = misrounded(f);
            let spread = (0..u32::MAX / 1021).map(|i| i * 1021);
            let beside = list
                .iter()
                .flat_map(|&b| [b.wrapping_sub(1), b.wrapping_add(1)]);
            let mut checked = 0;
            for b in spread.chain(beside) {
                let x = f32::from_bits(b);
                let host = f.host(x);
                if !x.is_finite() || host.is_nan() {
                    continue;
                }
                let got = rounded_as_libm(f, x, f.exact(x), list);
                assert_eq!(got.to_bits(), host.to_bits(), "{} {x:e}", f.name());
                checked += 1;
            }
            assert!(checked > 2_500_000, "{}: {checked}", f.name());
        }
    }

    #[test]
    fn the_rule_without_the_list_is_the_nearest_float() {
        let f = LibmFn::Expf;
        let x = f32::from_bits(misrounded(f)[1000]);
        let exact = f.exact(x);
        assert_eq!(rounded_as_libm(f, x, exact, &[]), exact as f32);
        assert_ne!(rounded_as_libm(f, x, exact, misrounded(f)), exact as f32);
    }

    #[test]
    fn next_toward_steps_one_float_either_way_through_zero() {
        assert_eq!(next_toward(1.0, 2.0), f32::from_bits(1.0f32.to_bits() + 1));
        assert_eq!(next_toward(1.0, 0.5), f32::from_bits(1.0f32.to_bits() - 1));
        assert_eq!(
            next_toward(-1.0, -2.0),
            f32::from_bits((-1.0f32).to_bits() + 1)
        );
        assert_eq!(
            next_toward(-1.0, 0.0),
            f32::from_bits((-1.0f32).to_bits() - 1)
        );
        assert_eq!(next_toward(0.0, 1.0), f32::from_bits(1));
        assert_eq!(next_toward(0.0, -1.0), -f32::from_bits(1));
    }
}
