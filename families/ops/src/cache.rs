//! The element type of an attention cache: what llama.cpp rounds a key
//! or a value to when its cache stores it (its `--cache-type-k/-v`), the
//! same rounding wherever a cache is kept (the host's caches, a device's).

use std::fmt;
use std::str::FromStr;

use seam::policy::KnobValue;

/// The element type of an attention cache (K or V): what a value is
/// rounded to when the cache stores it, before attention reads it back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CacheType {
    /// f32: stored as computed.
    F32,
    /// f16, round to nearest even (llama.cpp's default).
    #[default]
    F16,
    /// bf16, round to nearest even.
    Bf16,
}

impl CacheType {
    /// Every cache type, in the order `--help` lists them.
    pub const ALL: [CacheType; 3] = [CacheType::F16, CacheType::Bf16, CacheType::F32];

    /// The word llama.cpp's `--cache-type-k` takes for it.
    pub fn word(self) -> &'static str {
        match self {
            CacheType::F32 => "f32",
            CacheType::F16 => "f16",
            CacheType::Bf16 => "bf16",
        }
    }

    /// `x` as the cache stores it, widened back to f32 as attention
    /// reads it (exact for every value the type holds).
    pub fn stored(self, x: f32) -> f32 {
        match self {
            CacheType::F32 => x,
            CacheType::F16 => half::f16::from_f32(x).to_f32(),
            CacheType::Bf16 => half::bf16::from_f32(x).to_f32(),
        }
    }

    /// Rounds `xs` in place as the cache stores them ([`CacheType::stored`]).
    pub fn store_in_place(self, xs: &mut [f32]) {
        if self != CacheType::F32 {
            xs.iter_mut().for_each(|x| *x = self.stored(*x));
        }
    }
}

impl fmt::Display for CacheType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.word())
    }
}

impl FromStr for CacheType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let want = s.trim().to_ascii_lowercase();
        CacheType::ALL
            .into_iter()
            .find(|t| t.word() == want)
            .ok_or_else(|| {
                let words: Vec<&str> = CacheType::ALL.iter().map(|t| t.word()).collect();
                format!("{s:?} is not a cache type ({})", words.join(", "))
            })
    }
}

impl KnobValue for CacheType {
    const EXPECTED: &'static str = "a cache type (f16, bf16, f32)";
    fn from_env(text: &str) -> Option<Self> {
        text.parse().ok()
    }
    fn from_json(value: &serde_json::Value) -> Option<Self> {
        value.as_str().and_then(|s| s.parse().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_types_round_as_they_store_and_parse_their_words() {
        let third = 1.0f32 / 3.0;
        assert_eq!(CacheType::F32.stored(third), third);
        assert_eq!(
            CacheType::F16.stored(third),
            half::f16::from_f32(third).to_f32()
        );
        assert_eq!(
            CacheType::Bf16.stored(third),
            half::bf16::from_f32(third).to_f32()
        );
        assert_ne!(CacheType::F16.stored(third), third);
        assert_ne!(CacheType::Bf16.stored(third), CacheType::F16.stored(third));
        // Nearest even: 1 + 2^-11 is halfway between two halves.
        assert_eq!(CacheType::F16.stored(1.0 + 2f32.powi(-11)), 1.0);
        let mut xs = [third, -third];
        CacheType::F16.store_in_place(&mut xs);
        assert_eq!(
            xs,
            [CacheType::F16.stored(third), CacheType::F16.stored(-third)]
        );
        let mut same = [third];
        CacheType::F32.store_in_place(&mut same);
        assert_eq!(same, [third]);
        for t in CacheType::ALL {
            assert_eq!(t.word().parse::<CacheType>(), Ok(t));
            assert_eq!(CacheType::from_env(t.word()), Some(t));
            assert_eq!(CacheType::from_json(&t.word().into()), Some(t));
        }
        assert_eq!(" F16".parse::<CacheType>(), Ok(CacheType::F16));
        assert!(
            "q8_0"
                .parse::<CacheType>()
                .unwrap_err()
                .contains("f16, bf16, f32")
        );
        assert_eq!(CacheType::from_json(&serde_json::json!(16)), None);
        assert_eq!(CacheType::default(), CacheType::F16);
    }
}
