//! Text for terminals: names and paths from a file or the command line may
//! hold control bytes (ESC, CR, NUL) that would move the cursor, rewrite a
//! line or recolour the terminal; they are shown escaped instead.

use std::borrow::Cow;
use std::path::Path;

/// `text` with every control character (C0, DEL, C1) written as a Rust
/// escape (`\u{1b}`, `\r`, `\0`); other text, non-ASCII included, as is.
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A path as [`terminal_safe`] text (bytes that are not UTF-8 are shown as
/// U+FFFD, as `Path::display` does).
pub fn path_safe(path: &Path) -> String {
    terminal_safe(&path.to_string_lossy()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::terminal_safe;

    #[test]
    fn control_bytes_are_escaped_and_other_text_kept() {
        assert_eq!(terminal_safe("blk.0.attn_q.weight"), "blk.0.attn_q.weight");
        assert_eq!(terminal_safe("π ü"), "π ü");
        assert_eq!(
            terminal_safe("a\u{1b}[31mred\rb\0c\u{7f}\u{85}"),
            "a\\u{1b}[31mred\\rb\\0c\\u{7f}\\u{85}"
        );
    }
}
