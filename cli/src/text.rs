//! `seam tokenize` and `seam detokenize`: text to token ids and back with
//! a GGUF file's own tokenizer (`seam-tokenizer`), as llama.cpp's
//! `llama_tokenize` and `llama_detokenize` do.

use std::path::{Path, PathBuf};

use seam::borrow::MapOptions;
use seam::gguf::GgufModel;
use seam::text::path_safe;
use seam_tokenizer::Tokenizer;

use crate::{Failure, print};

/// The tokenizer of `file`.
fn open(file: &Path) -> Result<Tokenizer, Failure> {
    let model = GgufModel::open(file, MapOptions::default())?;
    Ok(Tokenizer::from_gguf(&model)?)
}

/// What `seam tokenize` was asked.
pub(crate) struct TokenizeArgs {
    pub(crate) file: PathBuf,
    pub(crate) text: Option<String>,
    pub(crate) text_file: Option<PathBuf>,
    pub(crate) add_special: bool,
    pub(crate) parse_special: bool,
    pub(crate) json: bool,
}

/// `seam tokenize`: ids one per line, or `{"tokens": [...], "pieces":
/// [...]}` (each piece the token's text as it decodes, special tokens
/// included; bytes that are not UTF-8 on their own as U+FFFD).
pub(crate) fn tokenize(args: TokenizeArgs) -> Result<(), Failure> {
    let text = match (&args.text, &args.text_file) {
        (Some(t), None) => t.clone(),
        (None, Some(p)) => {
            let bytes =
                std::fs::read(p).map_err(|e| Failure(format!("--file {}: {e}", path_safe(p))))?;
            String::from_utf8(bytes).map_err(|e| {
                Failure(format!(
                    "--file {}: not UTF-8 (byte {} starts an invalid sequence)",
                    path_safe(p),
                    e.utf8_error().valid_up_to()
                ))
            })?
        }
        _ => return Err(Failure("give the text, or --file PATH, not both".into())),
    };
    let tok = open(&args.file)?;
    let ids = tok.encode(&text, args.add_special, args.parse_special)?;
    if args.json {
        let pieces = ids
            .iter()
            .map(|&id| {
                tok.piece(id, true)
                    .map(|p| String::from_utf8_lossy(p).into_owned())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut s = serde_json::to_string(&serde_json::json!({"tokens": ids, "pieces": pieces}))?;
        s.push('\n');
        print(&s);
    } else {
        print(&ids.iter().map(|id| format!("{id}\n")).collect::<String>());
    }
    Ok(())
}

/// Parses `--tokens 1,2,3`.
pub(crate) fn parse_ids(text: &str) -> Result<Vec<u32>, Failure> {
    let ids: Result<Vec<u32>, _> = text.split(',').map(|t| t.trim().parse::<u32>()).collect();
    match ids {
        Ok(ids) if !ids.is_empty() => Ok(ids),
        _ => Err(Failure(format!(
            "--tokens {text:?}: expected comma-separated token ids, e.g. 1,2,3"
        ))),
    }
}

/// `seam detokenize`: the text of `ids` and a newline; control tokens
/// render their text only with `special`.
pub(crate) fn detokenize(file: &Path, ids: &str, special: bool) -> Result<(), Failure> {
    let ids = parse_ids(ids)?;
    let tok = open(file)?;
    let mut text = tok
        .decode(&ids, false, special)
        .map_err(|e| Failure(format!("--tokens: {e}")))?;
    text.push(b'\n');
    crate::print_bytes(&text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_or_name_the_flag() {
        assert_eq!(parse_ids("1, 2,3").ok().unwrap(), [1, 2, 3]);
        for bad in ["", "1,,2", "x", "-1", "4294967296"] {
            let Err(Failure(e)) = parse_ids(bad) else {
                panic!("{bad:?} parsed")
            };
            assert!(e.starts_with("--tokens"), "{e}");
        }
    }
}
