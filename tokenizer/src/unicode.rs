//! The Unicode facts the tokenizers read, as llama.cpp's `unicode.cpp`
//! has them: each code point's general category class, White_Space, its
//! simple lowercase and the first code point of its canonical
//! decomposition, and GPT-2's byte-to-character map.
//!
//! llama.cpp generates its tables from Unicode 15.1; Rust's crates carry a
//! later version. So the tables here are regex-syntax's (the classes `\p{L}`,
//! `\p{N}`, ...) and `unicode-normalization`'s, limited to the code points
//! Unicode 15.1 had assigned (`\p{Age=V15_1}`): a code point assigned later
//! is undefined, as it is to llama.cpp. (Checked once against llama.cpp's
//! generated `unicode-data.cpp` for every code point: categories, lowercase
//! and NFD all equal.)

use std::sync::OnceLock;

use regex_syntax::hir::{Class, HirKind};

/// A code point's flags, bit for bit llama.cpp's `unicode_cpt_flags`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags(u16);

impl Flags {
    pub(crate) const UNDEFINED: u16 = 0x0001;
    pub(crate) const NUMBER: u16 = 0x0002;
    pub(crate) const LETTER: u16 = 0x0004;
    pub(crate) const SEPARATOR: u16 = 0x0008;
    pub(crate) const MARK: u16 = 0x0010;
    pub(crate) const PUNCTUATION: u16 = 0x0020;
    pub(crate) const SYMBOL: u16 = 0x0040;
    pub(crate) const CONTROL: u16 = 0x0080;
    const CATEGORIES: u16 = 0x00FF;
    const WHITESPACE: u16 = 0x0100;

    /// No flag at all: what llama.cpp's splitters read past a chunk's end.
    pub(crate) const NONE: Flags = Flags(0);

    pub(crate) fn any(self) -> bool {
        self.0 != 0
    }
    pub(crate) fn category(self) -> u16 {
        self.0 & Self::CATEGORIES
    }
    pub(crate) fn number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub(crate) fn letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub(crate) fn mark(self) -> bool {
        self.0 & Self::MARK != 0
    }
    pub(crate) fn punctuation(self) -> bool {
        self.0 & Self::PUNCTUATION != 0
    }
    pub(crate) fn symbol(self) -> bool {
        self.0 & Self::SYMBOL != 0
    }
    pub(crate) fn control(self) -> bool {
        self.0 & Self::CONTROL != 0
    }
    pub(crate) fn whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
}

struct Tables {
    /// Sorted, disjoint `(first, last, category flag)`; a code point in
    /// none is undefined.
    categories: Vec<(u32, u32, u16)>,
    /// Sorted, disjoint White_Space ranges.
    whitespace: Vec<(u32, u32)>,
    /// Sorted, disjoint ranges of the code points Unicode 15.1 assigned.
    assigned: Vec<(u32, u32)>,
}

/// The ranges of a class that regex-syntax parses from `pattern`.
fn class_ranges(pattern: &str) -> Vec<(u32, u32)> {
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .unwrap_or_else(|e| panic!("the built-in class {pattern}: {e}"));
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => c
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        other => panic!("the built-in class {pattern} is {other:?}"),
    }
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut categories = Vec::new();
        for (class, flag) in [
            ("N", Flags::NUMBER),
            ("L", Flags::LETTER),
            ("Z", Flags::SEPARATOR),
            ("M", Flags::MARK),
            ("P", Flags::PUNCTUATION),
            ("S", Flags::SYMBOL),
            ("Cc", Flags::CONTROL),
            ("Cf", Flags::CONTROL),
            ("Co", Flags::CONTROL),
        ] {
            let pattern = format!(r"[\p{{{class}}}&&\p{{Age=V15_1}}]");
            categories.extend(
                class_ranges(&pattern)
                    .into_iter()
                    .map(|(a, b)| (a, b, flag)),
            );
        }
        // Surrogates (Cs) are control to llama.cpp; no `char` is one, but
        // the table stays whole.
        categories.push((0xD800, 0xDFFF, Flags::CONTROL));
        categories.sort_unstable();
        Tables {
            categories,
            whitespace: class_ranges(r"\p{White_Space}"),
            assigned: class_ranges(r"\p{Age=V15_1}"),
        }
    })
}

fn in_ranges(ranges: &[(u32, u32)], c: u32) -> bool {
    let i = ranges.partition_point(|&(first, _)| first <= c);
    i > 0 && c <= ranges[i - 1].1
}

/// The flags of code point `c` (llama.cpp's `unicode_cpt_flags_from_cpt`).
pub(crate) fn flags(c: char) -> Flags {
    let t = tables();
    let c = c as u32;
    let i = t.categories.partition_point(|&(first, _, _)| first <= c);
    let mut bits = match i.checked_sub(1).map(|i| t.categories[i]) {
        Some((_, last, flag)) if c <= last => flag,
        _ => Flags::UNDEFINED,
    };
    if in_ranges(&t.whitespace, c) {
        bits |= Flags::WHITESPACE;
    }
    Flags(bits)
}

/// Whether Unicode 15.1 assigned `c`.
fn assigned(c: char) -> bool {
    in_ranges(&tables().assigned, c as u32)
}

/// The simple lowercase of `c` (llama.cpp's `unicode_tolower`).
pub(crate) fn to_lower(c: char) -> char {
    if !assigned(c) {
        return c;
    }
    // The full mapping's first character is the simple mapping (U+0130's
    // full lowercase is "i\u{307}", its simple one 'i').
    c.to_lowercase().next().unwrap_or(c)
}

/// The first code point of `c`'s canonical decomposition (llama.cpp's
/// `unicode_cpts_normalize_nfd` keeps only that one).
pub(crate) fn nfd_first(c: char) -> char {
    if !assigned(c) {
        return c;
    }
    let mut first = None;
    unicode_normalization::char::decompose_canonical(c, |d| {
        first.get_or_insert(d);
    });
    first.unwrap_or(c)
}

/// CJK ideograph blocks, as llama.cpp's `unicode_cpt_is_han`.
pub(crate) fn is_han(c: char) -> bool {
    matches!(c as u32,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B820..=0x2CEAF
        | 0x2CEB0..=0x2EBEF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// GPT-2's byte-level alphabet: byte `b` as the character that stands for
/// it in a byte-level BPE vocabulary.
pub(crate) fn byte_to_char(b: u8) -> char {
    byte_table().0[b as usize]
}

/// The byte a byte-level character stands for, if it is one.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let t = byte_table();
    t.1.binary_search_by_key(&c, |&(ch, _)| ch)
        .ok()
        .map(|i| t.1[i].1)
}

#[allow(clippy::type_complexity)]
fn byte_table() -> &'static ([char; 256], Vec<(char, u8)>) {
    static TABLE: OnceLock<([char; 256], Vec<(char, u8)>)> = OnceLock::new();
    TABLE.get_or_init(|| {
        // Printable Latin-1 stands for itself; the other 68 bytes map, in
        // order, to U+0100 and up.
        let printable = |b: u32| {
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
        };
        let mut chars = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..256u32 {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            chars[b as usize] = char::from_u32(c).unwrap_or('\u{FFFD}');
        }
        let mut reverse: Vec<(char, u8)> = (0..=255u8).map(|b| (chars[b as usize], b)).collect();
        reverse.sort_unstable();
        (chars, reverse)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_unicode_15_1s() {
        assert!(flags('a').letter() && flags('7').number() && flags('٣').number());
        assert!(flags(' ').whitespace() && flags('\u{3000}').whitespace());
        assert!(flags('\u{0301}').mark() && flags('!').punctuation() && flags('$').symbol());
        // U+2FFC: added in 15.1 (a symbol); U+1C89: added in 16.0, so
        // undefined to llama.cpp.
        assert!(flags('\u{2FFC}').symbol());
        assert_eq!(flags('\u{1C89}'), Flags(Flags::UNDEFINED));
        assert!(flags('\u{E000}').control());
        assert_eq!(to_lower('\u{1C89}'), '\u{1C89}');
        assert_eq!(to_lower('\u{130}'), 'i');
        assert_eq!(to_lower('Ä'), 'ä');
        assert_eq!(nfd_first('é'), 'e');
        assert_eq!(nfd_first('가'), '\u{1100}');
    }

    #[test]
    fn the_byte_alphabet_is_gpt2s() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('中'), None);
    }
}
