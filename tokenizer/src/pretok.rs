//! BPE pre-tokenizers: each `tokenizer.ggml.pre` name llama.cpp knows,
//! its flags, and the split of a text into words before the merges.
//!
//! A name maps to one of llama.cpp's pre-tokenizer types ([`Pre`]); a type
//! to its list of split patterns (each applied to the pieces the one before
//! left). llama.cpp runs a few common patterns with its own hand-written
//! splitters and the rest with `std::regex` over a "collapsed" text (each
//! non-ASCII code point replaced by one byte standing for its category, each
//! `\p{..}` class of the pattern by that byte plus its ASCII members), and so
//! does this module: the same splitters, written here from their patterns,
//! and `fancy-regex` over the same collapsed text (the category bytes are
//! private-use code points here, so that `\w`, `\d` and `\s` see what
//! `std::regex` sees in them). Patterns without a `\p{..}` class run over
//! the text itself, non-ASCII white space replaced by U+000B as llama.cpp
//! does.

use crate::unicode::{Flags, byte_to_char, flags, is_han, to_lower};

/// llama.cpp's BPE pre-tokenizer types (`llama_vocab_pre_type`).
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pre {
    Default,
    Afmoe,
    Bailingmoe,
    Bloom,
    Chameleon,
    Chatglm4,
    Codeshell,
    CommandR,
    Dbrx,
    Deepseek3Llm,
    DeepseekCoder,
    DeepseekLlm,
    Exaone,
    ExaoneMoe,
    Falcon,
    Gemma4,
    Gpt2,
    Gpt3Finnish,
    Gpt4o,
    GraniteDocling,
    GraniteEmbMulti,
    Grok2,
    Hunyuan,
    HunyuanDense,
    HyV4,
    Jais,
    Jais2,
    JoyaiLlm,
    KimiK2,
    Laguna,
    Llama3,
    Mellum2,
    Minerva,
    Minicpm5,
    MinimaxM2,
    Mpt,
    Olmo,
    Poro,
    Qwen2,
    Qwen35,
    Refact,
    SarvamMoe,
    SeedCoder,
    Smaug,
    Smollm,
    SolarOpen,
    Spark25,
    Stablelm2,
    Starcoder,
    Superbpe,
    Tekken,
    TinyAya,
    Trillion,
    Ufakzeka,
    Viking,
    Whitespace,
    Youtu,
}

/// What a `tokenizer.ggml.pre` name sets besides its type, over a BPE
/// vocabulary's defaults (no space prefix, no whitespace escape, spaces
/// cleaned on decode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PreFlags {
    pub(crate) ignore_merges: bool,
    pub(crate) add_bos: bool,
    pub(crate) keep_spaces: bool,
    pub(crate) escape_whitespaces: bool,
    pub(crate) add_sep: bool,
    pub(crate) no_bos_token: bool,
}

/// The type and flags llama.cpp gives the pre-tokenizer `name`; `None` for
/// a name llama.cpp refuses.
pub(crate) fn pre_for_name(name: &str) -> Option<(Pre, PreFlags)> {
    let f = PreFlags::default();
    let keep = PreFlags {
        keep_spaces: true,
        ..f
    };
    Some(match name {
        "default" => (Pre::Default, f),
        "minicpm5" => (
            Pre::Minicpm5,
            PreFlags {
                ignore_merges: true,
                ..f
            },
        ),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => (
            Pre::Llama3,
            PreFlags {
                ignore_merges: true,
                add_bos: true,
                ..f
            },
        ),
        "deepseek-llm" => (Pre::DeepseekLlm, keep),
        "deepseek-coder" => (Pre::DeepseekCoder, keep),
        "deepseek-v3" => (Pre::Deepseek3Llm, keep),
        "spark2_5" => (Pre::Spark25, keep),
        "youtu" => (
            Pre::Youtu,
            PreFlags {
                ignore_merges: true,
                ..keep
            },
        ),
        "falcon" => (Pre::Falcon, f),
        "mpt" => (Pre::Mpt, f),
        "starcoder" => (Pre::Starcoder, f),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" => (Pre::Gpt2, f),
        "jais-2" => (Pre::Jais2, f),
        "gemma4" | "granite-embed-multi-311m" => (
            Pre::Gemma4,
            PreFlags {
                escape_whitespaces: true,
                ..f
            },
        ),
        "sarvam-moe" => (
            Pre::SarvamMoe,
            PreFlags {
                escape_whitespaces: true,
                ..keep
            },
        ),
        "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => {
            (Pre::Gpt2, PreFlags { add_sep: true, ..f })
        }
        "whitespace" => (Pre::Whitespace, f),
        "refact" => (Pre::Refact, f),
        "command-r" => (Pre::CommandR, keep),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => (Pre::Qwen2, keep),
        "qwen35" => (Pre::Qwen35, keep),
        "stablelm2" => (Pre::Stablelm2, f),
        "olmo" => (Pre::Olmo, f),
        "dbrx" => (Pre::Dbrx, f),
        "smaug-bpe" => (Pre::Smaug, f),
        "poro-chat" => (Pre::Poro, keep),
        "chatglm-bpe" => (
            Pre::Chatglm4,
            PreFlags {
                no_bos_token: true,
                ..f
            },
        ),
        "glm4" | "glm5" => (
            Pre::Chatglm4,
            PreFlags {
                no_bos_token: true,
                ignore_merges: true,
                ..f
            },
        ),
        "viking" => (Pre::Viking, keep),
        "jais" => (Pre::Jais, f),
        "tekken" => (
            Pre::Tekken,
            PreFlags {
                ignore_merges: true,
                add_bos: true,
                ..keep
            },
        ),
        "smollm" => (Pre::Smollm, keep),
        "codeshell" => (Pre::Codeshell, f),
        "bloom" => (Pre::Bloom, f),
        "gpt3-finnish" => (Pre::Gpt3Finnish, f),
        "exaone" => (Pre::Exaone, f),
        "exaone-moe" => (Pre::ExaoneMoe, f),
        "chameleon" => (
            Pre::Chameleon,
            PreFlags {
                add_bos: true,
                ..keep
            },
        ),
        "minerva-7b" => (Pre::Minerva, f),
        "megrez" => (Pre::Qwen2, f),
        "gpt-4o" | "llama4" | "kanana2" | "talkie" => (Pre::Gpt4o, keep),
        "granite-embed-multi-97m" => (
            Pre::GraniteEmbMulti,
            PreFlags {
                ignore_merges: true,
                ..keep
            },
        ),
        "tiny_aya" | "cohere2moe" => (Pre::TinyAya, keep),
        "superbpe" => (Pre::Superbpe, keep),
        "trillion" => (Pre::Trillion, keep),
        "granite-docling" => (Pre::GraniteDocling, keep),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => (Pre::Bailingmoe, keep),
        "seed-coder" => (Pre::SeedCoder, keep),
        "hunyuan" => (Pre::Hunyuan, keep),
        "hunyuan-dense" => (Pre::HunyuanDense, keep),
        "hy_v4" => (Pre::HyV4, keep),
        "joyai-llm" => (Pre::JoyaiLlm, keep),
        "kimi-k2" => (Pre::KimiK2, keep),
        "ufakzeka" => (Pre::Ufakzeka, keep),
        "grok-2" => (Pre::Grok2, keep),
        "afmoe" => (Pre::Afmoe, keep),
        "laguna" => (Pre::Laguna, keep),
        "minimax-m2" => (Pre::MinimaxM2, keep),
        "solar-open" => (Pre::SolarOpen, keep),
        "mellum2" => (Pre::Mellum2, f),
        _ => return None,
    })
}

/// Whether `pre`'s words are byte-level encoded (GPT-2's alphabet) before
/// the merges; the SPM-style ones merge raw UTF-8.
fn byte_encodes(pre: Pre) -> bool {
    !matches!(pre, Pre::Gemma4 | Pre::SarvamMoe | Pre::Whitespace)
}

/// `pre`'s split patterns, in order (llama.cpp's `regex_exprs`).
fn patterns(pre: Pre) -> &'static [&'static str] {
    match pre {
        Pre::Llama3 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Jais2 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",
        ],
        Pre::Dbrx | Pre::Smaug => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::DeepseekLlm => &[
            "[\r\n]",
            "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
            "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
            "\\s+$",
            "[一-龥ࠀ-一가-퟿]+",
            "\\p{N}+",
        ],
        Pre::Deepseek3Llm | Pre::HunyuanDense | Pre::JoyaiLlm | Pre::HyV4 => &[
            "\\p{N}{1,3}",
            "[一-龥぀-ゟ゠-ヿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Spark25 => &[
            "\\p{N}{1,3}",
            "[一-龥぀-ゟ゠-ヿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
            "\\p{N}",
        ],
        Pre::Youtu => &[
            "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
            "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::DeepseekCoder => &[
            "[\r\n]",
            "\\s?\\p{L}+",
            "\\s?\\p{P}+",
            "[一-龥ࠀ-一가-퟿]+",
            "\\p{N}",
        ],
        Pre::Falcon => &[
            "[\\p{P}\\$\\+<=>\\^~\\|`]+",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
            "[0-9][0-9][0-9]",
        ],
        Pre::Starcoder
        | Pre::Refact
        | Pre::CommandR
        | Pre::Smollm
        | Pre::Codeshell
        | Pre::Exaone
        | Pre::Minerva
        | Pre::Mellum2 => &[
            "\\p{N}",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        ],
        Pre::Gpt2 | Pre::Mpt | Pre::Olmo | Pre::Jais | Pre::Trillion | Pre::GraniteDocling => {
            &["'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"]
        }
        Pre::Stablelm2 | Pre::Qwen2 | Pre::Hunyuan | Pre::SolarOpen => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Qwen35 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Poro | Pre::Bloom | Pre::Gpt3Finnish => &[" ?[^(\\s|.,!?…。，、।۔،)]+"],
        Pre::Chatglm4 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Viking => &[" ?[^(\\s|.,!?…。，、।۔،)]+", "\\p{N}"],
        Pre::Tekken => &[
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Chameleon => &[
            "<sentinel:[0-9]+>",
            "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
            "([\\t\\n]|    |  )",
            "\\p{N}",
            "[\\p{P}!-/:-@\\[-`{-~]",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        ],
        Pre::Gpt4o | Pre::MinimaxM2 => &[
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::GraniteEmbMulti => &[
            "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::TinyAya => &[
            "\\d{1,3}(?=(?:\\d{3})*\\b)",
            "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::KimiK2 => &["\\p{Han}+"],
        Pre::Superbpe => &["\\p{N}+", "(?=(\\d{3})+(?!\\d))"],
        Pre::Bailingmoe => &[
            "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
        ],
        Pre::SeedCoder => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Ufakzeka => &[
            "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Grok2 => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Afmoe => &[
            "\\p{AFMoE_digits}",
            "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Laguna => &[
            "[^\\n]+|[\\n]+",
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::ExaoneMoe => &[
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
        ],
        Pre::Gemma4 => &["[^\\n]+|[\\n]+"],
        Pre::SarvamMoe => &["[^\\n]+|[\\n]+"],
        Pre::Minicpm5 => &[
            "\\p{N}{1,3}",
            "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        ],
        Pre::Whitespace => &["\\S+"],
        Pre::Default => &[
            "[\\p{P}\\$\\+<=>\\^~\\|]+",
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
            "\\p{N}+",
            "[0-9][0-9][0-9]",
        ],
    }
}

/// GPT-2's pattern, run by [`split_gpt2`].
const GPT2: &str = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
/// Llama 3's pattern with its case-insensitive group spelled out, run by
/// [`split_llama3`] with three-digit numbers.
const LLAMA3: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/// Qwen 2's: Llama 3's with one-digit numbers.
const QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/// Qwen 3.5's: Qwen 2's with combining marks in words.
const QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/// Kimi K2's first pattern stands for its whole set ([`split_kimi_k2`]).
const KIMI_K2: &str = "\\p{Han}+";
/// AFMoE's digit grouping ([`split_digit_groups`]).
const AFMOE_DIGITS: &str = "\\p{AFMoE_digits}";
/// Tiny Aya's digit grouping, which llama.cpp runs as AFMoE's.
const TINY_AYA_DIGITS: &str = "\\d{1,3}(?=(?:\\d{3})*\\b)";
/// Runs of newlines and of everything else ([`split_newlines`]).
const NEWLINES: &str = "[^\\n]+|[\\n]+";

/// The `\p{..}` classes llama.cpp collapses, with the category each stands
/// for.
const COLLAPSED_CLASSES: [(&str, u16); 10] = [
    ("\\p{N}", Flags::NUMBER),
    ("\\p{L}", Flags::LETTER),
    ("\\p{P}", Flags::PUNCTUATION),
    ("\\p{M}", Flags::MARK),
    ("\\p{S}", Flags::SYMBOL),
    ("\\p{Lu}", Flags::LETTER),
    ("\\p{Ll}", Flags::LETTER),
    ("\\p{Lt}", Flags::LETTER),
    ("\\p{Lm}", Flags::LETTER),
    ("\\p{Lo}", Flags::LETTER),
];

/// The code point that stands for a non-ASCII code point of category
/// `category` in a collapsed text (llama.cpp uses the bytes 0xD0-0xD5).
fn collapsed_marker(category: u16) -> char {
    match category {
        Flags::NUMBER => '\u{E0D1}',
        Flags::LETTER => '\u{E0D2}',
        Flags::PUNCTUATION => '\u{E0D3}',
        Flags::MARK => '\u{E0D4}',
        Flags::SYMBOL => '\u{E0D5}',
        _ => '\u{E0D0}',
    }
}

/// A collapsed class's members: its marker and its ASCII code points.
fn collapsed_members(category: u16) -> String {
    let ascii = match category {
        Flags::NUMBER => "0-9",
        Flags::LETTER => "A-Za-z",
        Flags::PUNCTUATION => "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}",
        Flags::SYMBOL => "\\$\\+<->\\^`\\|~",
        _ => "",
    };
    format!("\\x{{{:X}}}{ascii}", collapsed_marker(category) as u32)
}

/// `pattern` with each collapsed class replaced by its members (in
/// brackets unless already inside a bracket expression), as llama.cpp
/// rewrites it.
fn collapse_pattern(pattern: &str) -> String {
    let b = pattern.as_bytes();
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let escaped = i > 0 && b[i - 1] == b'\\';
        if b[i] == b'[' && !escaped {
            out.push('[');
            inside = true;
            i += 1;
            continue;
        }
        if inside && b[i] == b']' && !escaped {
            out.push(']');
            inside = false;
            i += 1;
            continue;
        }
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1] == b'p' && b[i + 2] == b'{' {
            let close = pattern[i + 3..].find('}').map(|c| c + i + 3);
            if let Some(close) = close.filter(|&c| c <= i + 10) {
                let class = &pattern[i..=close];
                if let Some(&(_, category)) = COLLAPSED_CLASSES.iter().find(|(n, _)| *n == class) {
                    if !inside {
                        out.push('[');
                    }
                    out.push_str(&collapsed_members(category));
                    if !inside {
                        out.push(']');
                    }
                    i = close + 1;
                    continue;
                }
            }
        }
        // The pattern is ASCII here (checked when compiled).
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// One split pattern, compiled.
enum Step {
    Gpt2,
    /// Llama 3's shape: numbers of at most `max_digits`, marks in words.
    Llama3 {
        max_digits: usize,
        marks: bool,
    },
    KimiK2,
    DigitGroups,
    Newlines,
    Regex {
        regex: fancy_regex::Regex,
        collapsed: bool,
    },
}

impl Step {
    fn new(pattern: &str) -> Step {
        match pattern {
            GPT2 => Step::Gpt2,
            LLAMA3 => Step::Llama3 {
                max_digits: 3,
                marks: false,
            },
            QWEN2 => Step::Llama3 {
                max_digits: 1,
                marks: false,
            },
            QWEN35 => Step::Llama3 {
                max_digits: 1,
                marks: true,
            },
            KIMI_K2 => Step::KimiK2,
            AFMOE_DIGITS | TINY_AYA_DIGITS => Step::DigitGroups,
            NEWLINES => Step::Newlines,
            _ => {
                let collapsed = COLLAPSED_CLASSES.iter().any(|(c, _)| pattern.contains(c));
                assert!(
                    !collapsed || pattern.is_ascii(),
                    "a built-in pattern with a category class is ASCII: {pattern}"
                );
                let source = if collapsed {
                    collapse_pattern(pattern)
                } else {
                    // std::wregex's \d is 0-9 only.
                    pattern.replace("\\d", "[0-9]")
                };
                let regex = fancy_regex::Regex::new(&source)
                    .unwrap_or_else(|e| panic!("the built-in pattern {pattern}: {e}"));
                Step::Regex { regex, collapsed }
            }
        }
    }
}

/// A BPE vocabulary's pre-tokenizer: its split patterns, and whether the
/// words are byte-level encoded.
pub(crate) struct PreTokenizer {
    steps: Vec<Step>,
    byte_encode: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer of type `pre`.
    pub(crate) fn new(pre: Pre) -> PreTokenizer {
        PreTokenizer {
            steps: patterns(pre).iter().map(|p| Step::new(p)).collect(),
            byte_encode: byte_encodes(pre),
        }
    }

    /// Whether words are byte-level encoded.
    pub(crate) fn byte_encodes(&self) -> bool {
        self.byte_encode
    }

    /// `text` split into words (llama.cpp's `unicode_regex_split`), each
    /// byte-level encoded where the vocabulary is.
    ///
    /// # Errors
    ///
    /// A split pattern gave up (`fancy-regex`'s backtracking limit).
    pub(crate) fn split(&self, text: &str) -> Result<Vec<String>, fancy_regex::Error> {
        let cpts: Vec<char> = text.chars().collect();
        let fl: Vec<Flags> = cpts.iter().map(|&c| flags(c)).collect();
        let mut lens = vec![cpts.len()];
        let mut collapsed: Option<Vec<char>> = None;
        let mut wide: Option<Vec<char>> = None;
        for step in &self.steps {
            let mut next = Vec::with_capacity(lens.len());
            let mut start = 0;
            for &len in &lens {
                let (c, f) = (&cpts[start..start + len], &fl[start..start + len]);
                let mut out = Out {
                    lens: &mut next,
                    prev: 0,
                };
                match step {
                    Step::Gpt2 => split_gpt2(c, f, &mut out),
                    Step::Llama3 { max_digits, marks } => {
                        split_llama3(c, f, *max_digits, *marks, &mut out)
                    }
                    Step::KimiK2 => split_kimi_k2(c, f, &mut out),
                    Step::DigitGroups => split_digit_groups(f, &mut out),
                    Step::Newlines => split_newlines(c, &mut out),
                    Step::Regex {
                        regex,
                        collapsed: true,
                    } => {
                        let text = collapsed.get_or_insert_with(|| collapse_text(&cpts, &fl));
                        split_regex(regex, &text[start..start + len], &mut out)?
                    }
                    Step::Regex { regex, .. } => {
                        let text = wide.get_or_insert_with(|| wide_text(&cpts, &fl));
                        split_regex(regex, &text[start..start + len], &mut out)?
                    }
                }
                start += len;
            }
            lens = next;
        }
        let mut words = Vec::with_capacity(lens.len());
        let mut start = 0;
        for len in lens {
            let word = &cpts[start..start + len];
            start += len;
            if self.byte_encode {
                let mut buf = [0u8; 4];
                words.push(
                    word.iter()
                        .flat_map(|c| c.encode_utf8(&mut buf).bytes().collect::<Vec<_>>())
                        .map(byte_to_char)
                        .collect(),
                );
            } else {
                words.push(word.iter().collect());
            }
        }
        Ok(words)
    }
}

/// The collapsed text: ASCII kept, other white space as U+000B, every other
/// code point as its category's marker.
fn collapse_text(cpts: &[char], fl: &[Flags]) -> Vec<char> {
    cpts.iter()
        .zip(fl)
        .map(|(&c, f)| match c {
            c if c.is_ascii() => c,
            _ if f.whitespace() => '\u{0B}',
            _ => collapsed_marker(f.category()),
        })
        .collect()
}

/// The text with non-ASCII white space as U+000B (std::wregex's `\s` sees
/// only ASCII white space).
fn wide_text(cpts: &[char], fl: &[Flags]) -> Vec<char> {
    cpts.iter()
        .zip(fl)
        .map(|(&c, f)| {
            if !c.is_ascii() && f.whitespace() {
                '\u{0B}'
            } else {
                c
            }
        })
        .collect()
}

/// The word lengths (in code points) one chunk splits into.
struct Out<'a> {
    lens: &'a mut Vec<usize>,
    prev: usize,
}

impl Out<'_> {
    /// Ends a word at `end` (chunk-relative); an empty one is dropped.
    fn add(&mut self, end: usize) {
        if end > self.prev {
            self.lens.push(end - self.prev);
        }
        self.prev = end;
    }
}

/// A pattern over a chunk: each match a word, and the text between
/// matches a word too (`std::regex_iterator`'s walk in llama.cpp).
fn split_regex(
    regex: &fancy_regex::Regex,
    chunk: &[char],
    out: &mut Out<'_>,
) -> Result<(), fancy_regex::Error> {
    let text: String = chunk.iter().collect();
    // Byte offset -> code point index, walked forward with the matches.
    let (mut byte, mut cp) = (0usize, 0usize);
    let mut to_cp = |target: usize| {
        while byte < target {
            byte += text[byte..].chars().next().map_or(1, char::len_utf8);
            cp += 1;
        }
        cp
    };
    for m in regex.find_iter(&text) {
        let m = m?;
        let start = to_cp(m.start());
        out.add(start);
        let end = to_cp(m.end());
        out.add(end);
    }
    out.add(chunk.len());
    Ok(())
}

fn flag_at(f: &[Flags], i: usize) -> Flags {
    f.get(i).copied().unwrap_or(Flags::NONE)
}

/// `'s|'t|'m|'d` or `'re|'ve|'ll` at `pos` (lowercased first where
/// `fold`): its length.
fn contraction(c: &[char], pos: usize, fold: bool) -> Option<usize> {
    let at = |i: usize| c.get(i).map(|&ch| if fold { to_lower(ch) } else { ch });
    if c.get(pos) != Some(&'\'') || pos + 1 >= c.len() {
        return None;
    }
    match at(pos + 1)? {
        's' | 't' | 'm' | 'd' => Some(2),
        n if pos + 2 < c.len() => {
            matches!((n, at(pos + 2)?), ('r', 'e') | ('v', 'e') | ('l', 'l')).then_some(3)
        }
        _ => None,
    }
}

/// White space at `pos`: how many, and the end of the last `\r`/`\n` in
/// it (0 for none).
fn whitespace_run(c: &[char], f: &[Flags], pos: usize) -> (usize, usize) {
    let (mut n, mut last_newline) = (0, 0);
    while flag_at(f, pos + n).whitespace() {
        if matches!(c[pos + n], '\r' | '\n') {
            last_newline = pos + n + 1;
        }
        n += 1;
    }
    (n, last_newline)
}

/// `\s+(?!\S)|\s+` at `pos`, given the run there: the end of the word.
fn trailing_whitespace(len: usize, pos: usize, n_ws: usize) -> Option<usize> {
    if n_ws > 1 && pos + n_ws < len {
        Some(pos + n_ws - 1)
    } else if n_ws > 0 {
        Some(pos + n_ws)
    } else {
        None
    }
}

/// GPT-2's pattern (llama.cpp's `unicode_regex_split_custom_gpt2`).
fn split_gpt2(c: &[char], f: &[Flags], out: &mut Out<'_>) {
    let n = c.len();
    let mut pos = 0;
    while pos < n {
        let (cp, fl) = (c[pos], f[pos]);
        if let Some(len) = contraction(c, pos, false) {
            pos += len;
            out.add(pos);
            continue;
        }
        let space = cp == ' ';
        let mut f2 = if space { flag_at(f, pos + 1) } else { fl };
        let other = |x: Flags| !(x.whitespace() || x.letter() || x.number()) && x.any();
        for class in [Flags::letter as fn(Flags) -> bool, Flags::number, other] {
            if class(f2) {
                pos += usize::from(space);
                while class(f2) {
                    pos += 1;
                    f2 = flag_at(f, pos);
                }
                break;
            }
        }
        if pos > out.prev {
            out.add(pos);
            continue;
        }
        let (n_ws, _) = whitespace_run(c, f, pos);
        pos = trailing_whitespace(n, pos, n_ws).unwrap_or(pos + 1);
        out.add(pos);
    }
}

/// Llama 3's pattern and its Qwen variants (llama.cpp's
/// `unicode_regex_split_custom_llama3`, `_qwen2`, `_qwen35`).
fn split_llama3(c: &[char], f: &[Flags], max_digits: usize, marks: bool, out: &mut Out<'_>) {
    let n = c.len();
    let word = |x: Flags| x.letter() || (marks && x.mark());
    let other = |x: Flags| !(x.whitespace() || x.letter() || (marks && x.mark()) || x.number());
    let mut pos = 0;
    while pos < n {
        let (cp, fl) = (c[pos], f[pos]);
        if let Some(len) = contraction(c, pos, true) {
            pos += len;
            out.add(pos);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !(cp == '\r' || cp == '\n' || fl.number()) && (word(fl) || word(flag_at(f, pos + 1))) {
            pos += 1;
            while word(flag_at(f, pos)) {
                pos += 1;
            }
            out.add(pos);
            continue;
        }
        // \p{N}{1,max_digits}
        if fl.number() {
            let mut first = pos;
            while flag_at(f, pos).number() {
                pos += 1;
                if pos - first >= max_digits {
                    out.add(pos);
                    first = pos;
                }
            }
            out.add(pos);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*': llama.cpp tests the first code
        // point's own flags for "any", not the one after the space.
        let space = cp == ' ';
        let mut f2 = if space { flag_at(f, pos + 1) } else { fl };
        if other(f2) && fl.any() {
            pos += usize::from(space);
            while other(f2) && f2.any() {
                pos += 1;
                f2 = flag_at(f, pos);
            }
            while matches!(c.get(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            out.add(pos);
            continue;
        }
        let (n_ws, last_newline) = whitespace_run(c, f, pos);
        pos = if last_newline > 0 {
            last_newline
        } else {
            trailing_whitespace(n, pos, n_ws).unwrap_or(pos + 1)
        };
        out.add(pos);
    }
}

/// Kimi K2's patterns (llama.cpp's `unicode_regex_split_custom_kimi_k2`):
/// Han runs, words of other letters with a contraction, numbers of up to
/// three digits, then Llama 3's tail.
fn split_kimi_k2(c: &[char], f: &[Flags], out: &mut Out<'_>) {
    let n = c.len();
    let han = |i: usize| c.get(i).is_some_and(|&ch| is_han(ch));
    let letter = |i: usize| flag_at(f, i).letter() && !han(i);
    let mut pos = 0;
    while pos < n {
        let (cp, fl) = (c[pos], f[pos]);
        if is_han(cp) {
            while han(pos) {
                pos += 1;
            }
            out.add(pos);
            continue;
        }
        let leading = !(cp == '\r' || cp == '\n' || fl.letter() || fl.number());
        if letter(pos) || (leading && letter(pos + 1)) {
            if leading {
                pos += 1;
            }
            let mut has_letters = false;
            while letter(pos) {
                has_letters = true;
                pos += 1;
            }
            if has_letters || (!leading && letter(pos)) {
                if !has_letters {
                    pos += 1;
                }
                while letter(pos) {
                    pos += 1;
                }
                if let Some(len) = contraction(c, pos, true) {
                    pos += len;
                }
                out.add(pos);
                continue;
            } else if leading {
                pos -= 1;
            }
        }
        if fl.number() {
            let mut first = pos;
            while flag_at(f, pos).number() {
                pos += 1;
                if pos - first >= 3 {
                    out.add(pos);
                    first = pos;
                }
            }
            out.add(pos);
            continue;
        }
        let space = cp == ' ';
        let mut f2 = if space { flag_at(f, pos + 1) } else { fl };
        let other = |x: Flags| !(x.whitespace() || x.letter() || x.number()) && x.any();
        if other(f2) {
            pos += usize::from(space);
            while other(f2) {
                pos += 1;
                f2 = flag_at(f, pos);
            }
            while matches!(c.get(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            out.add(pos);
            continue;
        }
        let (n_ws, last_newline) = whitespace_run(c, f, pos);
        pos = if last_newline > 0 {
            last_newline
        } else {
            trailing_whitespace(n, pos, n_ws).unwrap_or(pos + 1)
        };
        out.add(pos);
    }
}

/// Digit runs in groups of three from the right (llama.cpp's
/// `unicode_regex_split_custom_afmoe`). As there, the text before a run
/// joins the run's first group.
fn split_digit_groups(f: &[Flags], out: &mut Out<'_>) {
    let n = f.len();
    let mut pos = 0;
    while pos < n {
        if f[pos].number() {
            let first = pos;
            while pos < n && f[pos].number() {
                pos += 1;
            }
            let count = pos - first;
            let mut at = first + count % 3;
            if at > first {
                out.add(at);
            }
            while at < first + count {
                at += 3;
                out.add(at);
            }
            continue;
        }
        pos += 1;
    }
    out.add(n);
}

/// Runs of `\n` and runs of anything else.
fn split_newlines(c: &[char], out: &mut Out<'_>) {
    let mut pos = 0;
    while pos < c.len() {
        let newline = c[pos] == '\n';
        while pos < c.len() && (c[pos] == '\n') == newline {
            pos += 1;
        }
        out.add(pos);
    }
}

#[cfg(test)]
mod tests;
