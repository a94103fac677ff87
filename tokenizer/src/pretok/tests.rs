//! Tests of the pre-tokenizers: every name llama.cpp knows builds and
//! splits; the collapsed patterns and the digit splitter's quirk. Equality
//! with llama.cpp for every name is `tests/llama_vocabs.rs`'s.

use super::*;

/// Every `tokenizer.ggml.pre` name of llama.cpp 0.3.36.
const NAMES: [&str; 91] = [
    "default",
    "minicpm5",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "spark2_5",
    "youtu",
    "falcon",
    "mpt",
    "starcoder",
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "jais-2",
    "gemma4",
    "granite-embed-multi-311m",
    "sarvam-moe",
    "jina-v1-en",
    "jina-v2-code",
    "roberta-bpe",
    "whitespace",
    "refact",
    "command-r",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "qwen35",
    "stablelm2",
    "olmo",
    "dbrx",
    "smaug-bpe",
    "poro-chat",
    "chatglm-bpe",
    "glm4",
    "glm5",
    "viking",
    "jais",
    "tekken",
    "smollm",
    "codeshell",
    "bloom",
    "gpt3-finnish",
    "exaone",
    "exaone4",
    "exaone-moe",
    "chameleon",
    "minerva-7b",
    "megrez",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "granite-embed-multi-97m",
    "tiny_aya",
    "cohere2moe",
    "superbpe",
    "trillion",
    "granite-docling",
    "bailingmoe",
    "bailingmoe2",
    "llada-moe",
    "seed-coder",
    "hunyuan",
    "hunyuan-dense",
    "hy_v4",
    "joyai-llm",
    "kimi-k2",
    "ufakzeka",
    "grok-2",
    "afmoe",
    "laguna",
    "minimax-m2",
    "solar-open",
    "mellum2",
];

fn words(pre: Pre, text: &str) -> Vec<String> {
    let mut p = PreTokenizer::new(pre);
    p.byte_encode = false;
    p.split(text).expect("splits")
}

#[test]
fn every_name_builds_and_splits_back_to_its_text() {
    let text = "Hello,  wörld! It's 1234567 \u{00A0}日本語 ́x\r\n\t<sentinel:12>";
    for name in NAMES {
        let (pre, _) = pre_for_name(name).unwrap_or_else(|| panic!("{name} is unknown"));
        let w = words(pre, text);
        assert_eq!(w.concat(), text, "{name}: {w:?}");
        assert!(w.iter().all(|w| !w.is_empty()), "{name}: {w:?}");
    }
    assert_eq!(pre_for_name("gpt-9"), None);
    assert_eq!(pre_for_name(""), None, "no name is not a name");
}

#[test]
fn the_common_patterns_split_as_their_regexes_say() {
    assert_eq!(
        words(Pre::Gpt2, "Hello world's  3.14!!\n"),
        ["Hello", " world", "'s", " ", " 3", ".", "14", "!!", "\n"]
    );
    assert_eq!(
        words(Pre::Llama3, "Hello WORLD'S 12345\n\n  x"),
        ["Hello", " WORLD", "'S", " ", "123", "45", "\n\n", " ", " x"]
    );
    assert_eq!(words(Pre::Qwen2, "ab12"), ["ab", "1", "2"]);
    // Combining marks join the word for Qwen 3.5, not for Qwen 2.
    assert_eq!(words(Pre::Qwen35, "e\u{301}t\u{301}"), ["e\u{301}t\u{301}"]);
    assert_eq!(words(Pre::Qwen2, "e\u{301}t"), ["e", "\u{301}t"]);
    assert_eq!(words(Pre::Gemma4, "a b\n\nc"), ["a b", "\n\n", "c"]);
}

#[test]
fn digit_groups_join_the_text_before_to_the_first_group_as_llama_cpp_does() {
    let mut lens = Vec::new();
    let f: Vec<Flags> = "ab1234x56789".chars().map(flags).collect();
    split_digit_groups(
        &f,
        &mut Out {
            lens: &mut lens,
            prev: 0,
        },
    );
    assert_eq!(lens, [3, 3, 3, 3], "ab1 234 x56 789");
}

#[test]
fn collapsed_patterns_stand_for_categories_and_their_ascii_members() {
    assert_eq!(collapse_pattern("\\p{L}+"), "[\\x{E0D2}A-Za-z]+");
    assert_eq!(
        collapse_pattern("[^\\s\\p{L}\\p{N}]"),
        "[^\\s\\x{E0D2}A-Za-z\\x{E0D1}0-9]"
    );
    assert_eq!(collapse_pattern("\\[\\p{M}\\]"), "\\[[\\x{E0D4}]\\]");
    // Non-ASCII letters are letters; non-ASCII white space is white space.
    assert_eq!(
        words(Pre::DeepseekCoder, "añb\u{3000}c"),
        ["añb", "\u{3000}c"]
    );
}
