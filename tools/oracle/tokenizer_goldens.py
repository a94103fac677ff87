#!/usr/bin/env python3
"""Write the tokenizer goldens of tests/data/tokenizer/ from llama.cpp
(llama-cpp-python 0.3.36's CPU build, `tools/oracle/build_llama.sh`), each
vocabulary loaded with `vocab_only=True`:

  llama-decode.json   for every models/ggml-vocab-*.gguf with an .inp/.out
                      pair: each test text (read as test-tokenizer-0 reads
                      them) -> llama_detokenize(ids, remove_special=False,
                      unparse_special=True) of llama.cpp's own ids of it
                      (llama_tokenize(text, add_special=False,
                      parse_special=False)), as UTF-8 with invalid bytes
                      as U+FFFD (the Rust test compares lossily too).
  pre-tokenizers.json one BPE vocabulary (Llama 3's: its numbers of up to
                      three digits tell the digit rules apart) relabeled
                      with each tokenizer.ggml.pre name llama.cpp knows (a
                      copy with that one key changed): name -> the ids of
                      every test text of that vocabulary.
  kinds.json          two small vocabularies written here, of the kinds
                      the sdist has no test file for, committed beside
                      the golden: ugm-small.gguf (t5: Viterbi over scored
                      pieces, a user-defined token, unknowns in a row
                      merged, space prefix, extra spaces removed) and
                      rwkv-small.gguf (escaped byte tokens, longest match):
                      texts -> ids with add_special False and True, and
                      their llama_detokenize.
  prompts.json        the --prompt goldens of the family binaries' tests:
                      for each (vocabulary, pre relabel) a few texts ->
                      llama_tokenize(text, add_special=True,
                      parse_special=True), as llama.cpp's generation
                      tokenizes a prompt, plus the gemma-3-270m file's
                      own tokenizer for a few texts with each flag pair.

    PYTHONPATH=$LCP/vendor/llama.cpp/gguf-py python3 tools/oracle/tokenizer_goldens.py \\
        VOCAB_DIR GEMMA.gguf tests/data/tokenizer

VOCAB_DIR is where `cargo xtask fetch-models` extracts the vocabularies
(~/.cache/seam/llama-vocabs-0.3.36).
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import tempfile

import gguf
import llama_cpp

SEP = "\n__ggml_vocab_test__\n"

# Every tokenizer.ggml.pre name llama.cpp 0.3.36 knows (src/llama-vocab.cpp),
# but "whitespace": on a gpt2 model it leaves spaces in raw UTF-8 words, and
# llama.cpp aborts on a merge pair with a space (find_bpe_rank's assert).
# (Only tokenizer.ggml.model "whitespace" drops the spaces first.)
PRE_NAMES = [
    "default", "minicpm5", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
    "pixtral", "midm-2.0", "lfm2", "jina-v5-nano", "deepseek-llm", "deepseek-coder",
    "deepseek-v3", "spark2_5", "youtu", "falcon", "mpt", "starcoder", "gpt-2", "phi-2",
    "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum",
    "modern-bert", "jais-2", "gemma4", "granite-embed-multi-311m", "sarvam-moe",
    "jina-v1-en", "jina-v2-code", "roberta-bpe", "refact", "command-r",
    "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "qwen35", "stablelm2", "olmo", "dbrx",
    "smaug-bpe", "poro-chat", "chatglm-bpe", "glm4", "glm5", "viking", "jais", "tekken",
    "smollm", "codeshell", "bloom", "gpt3-finnish", "exaone", "exaone4", "exaone-moe",
    "chameleon", "minerva-7b", "megrez", "gpt-4o", "llama4", "kanana2", "talkie",
    "granite-embed-multi-97m", "tiny_aya", "cohere2moe", "superbpe", "trillion",
    "granite-docling", "bailingmoe", "bailingmoe2", "llada-moe", "seed-coder", "hunyuan",
    "hunyuan-dense", "hy_v4", "joyai-llm", "kimi-k2", "ufakzeka", "grok-2", "afmoe",
    "laguna", "minimax-m2", "solar-open", "mellum2",
]

# (golden key, vocabulary file, tokenizer.ggml.pre relabel or None, texts)
PROMPT_TEXTS = [
    "Hello, world! The quick brown fox jumps over 13 lazy dogs.",
    "  Äpfel und Birnen,\n\tnicht wahr? 3.14159 ... 😶‍🌫️ 我想在apple工作",
    "I've been 'told he's there, 'RE you sure? <|endoftext|> <s> </s>",
]
PROMPTS = [
    ("qwen35", "ggml-vocab-qwen35.gguf", None),
    ("llama-bpe-as-glm5", "ggml-vocab-llama-bpe.gguf", "glm5"),
    ("gpt-2", "ggml-vocab-gpt-2.gguf", None),
]


def load(path):
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), params)
    if not model:
        raise SystemExit(f"llama.cpp refused {path}")
    return model, llama_cpp.llama_model_get_vocab(model)


def tokenize(vocab, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
    n = len(text) + 16
    buf = (llama_cpp.llama_token * n)()
    got = llama_cpp.llama_tokenize(vocab, text, len(text), buf, n, add_special, parse_special)
    if got < 0:
        n = -got
        buf = (llama_cpp.llama_token * n)()
        got = llama_cpp.llama_tokenize(vocab, text, len(text), buf, n, add_special, parse_special)
    return list(buf[:got])


def detokenize(vocab, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    n = 64 + 32 * len(ids)
    buf = ctypes.create_string_buffer(n)
    got = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, n, remove_special, unparse_special)
    if got < 0:
        n = -got
        buf = ctypes.create_string_buffer(n)
        got = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, n, remove_special, unparse_special)
    return buf.raw[:got]


def cases(path):
    raw = open(path + ".inp", encoding="utf-8").read()
    texts = raw.split(SEP)
    if texts and texts[-1] == "":
        texts.pop()
    # test-tokenizer-0 keeps them in a map: a text given twice is one test.
    return sorted(set(texts))


METADATA_END: dict[str, int] = {}


def relabel(src, pre, out):
    """A copy of src with the value of tokenizer.ggml.pre replaced by pre,
    byte for byte otherwise (vocabulary files have no tensors: the metadata
    ends the file, padded to the alignment)."""
    if src not in METADATA_END:
        r = gguf.GGUFReader(src)  # slow on 150k strings: once per file
        assert len(r.tensors) == 0, f"{src} has tensors"
        METADATA_END[src] = max(f.offset + sum(p.nbytes for p in f.parts) for f in r.fields.values())
    data = open(src, "rb").read()[:METADATA_END[src]]
    key = b"tokenizer.ggml.pre"
    at = data.index(len(key).to_bytes(8, "little") + key) + 8 + len(key)
    assert int.from_bytes(data[at:at + 4], "little") == 8, "a string"
    n = int.from_bytes(data[at + 4:at + 12], "little")
    new = pre.encode()
    body = data[:at + 4] + len(new).to_bytes(8, "little") + new + data[at + 12 + n:]
    body += b"\0" * (-len(body) % 32)
    open(out, "wb").write(body)


KIND_TEXTS = [
    "the cat sat on the mat",
    "  the   cats\tsat   ",
    "thé cat <extra_id_0>sat xyz! on",
    "a\nb\\c\td\x01 the cathat",
    "",
]


def small_vocab(out, model, tokens, types, scores, extra):
    """A vocabulary-only GGUF: llama-spm's architecture keys, this tokenizer."""
    r = gguf.GGUFReader(SPM_BASE)
    w = gguf.GGUFWriter(out, "llama")
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k.startswith("tokenizer.") or k == "general.architecture":
            continue
        w.add_key_value(k, f.contents(), f.types[0])
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if scores is not None:
        w.add_token_scores(scores)
    for key, value, vtype in extra:
        w.add_key_value(key, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def ugm_small(out):
    N, C, U, UD = 1, 3, 2, 4
    pieces = [
        ("<pad>", C, 0.0), ("</s>", C, 0.0), ("<unk>", U, 0.0),
        ("\u2581", N, -2.0), ("\u2581the", N, -3.0), ("\u2581cat", N, -4.0),
        ("\u2581ca", N, -5.0), ("t", N, -3.5), ("s", N, -3.0), ("\u2581sat", N, -4.5),
        ("\u2581on", N, -4.0), ("\u2581mat", N, -5.0), ("at", N, -4.0), ("h", N, -4.2),
        ("e", N, -3.9), ("a", N, -4.1), ("c", N, -4.3), ("\u2581c", N, -6.0),
        ("hat", N, -6.5), ("\u2581t", N, -5.5), ("é", N, -7.0), ("<extra_id_0>", UD, 0.0),
        ("o", N, -4.4), ("n", N, -4.6), ("m", N, -4.8), ("!", N, -5.0),
    ]
    B = gguf.GGUFValueType.BOOL
    U32 = gguf.GGUFValueType.UINT32
    small_vocab(out, "t5", [p[0] for p in pieces], [p[1] for p in pieces], [p[2] for p in pieces], [
        ("tokenizer.ggml.add_space_prefix", True, B),
        ("tokenizer.ggml.remove_extra_whitespaces", True, B),
        ("tokenizer.ggml.eos_token_id", 1, U32),
        ("tokenizer.ggml.unknown_token_id", 2, U32),
        ("tokenizer.ggml.padding_token_id", 0, U32),
    ])


def rwkv_small(out):
    tokens = ["<s>"]
    for b in range(256):
        c = chr(b)
        if c == "\\":
            tokens.append("\\\\")
        elif c == "\n":
            tokens.append("\\n")
        elif c == "\t":
            tokens.append("\\t")
        elif 0x20 <= b < 0x7F:
            tokens.append(c)
        else:
            tokens.append(f"\\x{b:02x}")
    tokens += ["the", " the", "cat", " cat", "at", "hat", " sat", "\\n\\t", "\\xe2\\x96"]
    small_vocab(out, "rwkv", tokens, [1] * len(tokens), None, [])


def main() -> int:
    global SPM_BASE
    vocab_dir, gemma, out_dir = sys.argv[1:4]
    os.makedirs(out_dir, exist_ok=True)
    SPM_BASE = os.path.join(vocab_dir, "ggml-vocab-llama-spm.gguf")

    kinds = {"texts": KIND_TEXTS}
    for name, build in (("ugm-small.gguf", ugm_small), ("rwkv-small.gguf", rwkv_small)):
        path = os.path.join(out_dir, name)
        build(path)
        _, vocab = load(path)
        entry = {}
        for add in (False, True):
            ids = [tokenize(vocab, t.encode(), add, False) for t in KIND_TEXTS]
            entry[f"ids-{str(add).lower()}"] = ids
            entry[f"decode-{str(add).lower()}"] = [
                detokenize(vocab, i, False, True).decode("utf-8", "replace") for i in ids
            ]
        kinds[name] = entry
    with open(os.path.join(out_dir, "kinds.json"), "w", encoding="utf-8") as f:
        json.dump(kinds, f, ensure_ascii=False, indent=1)
        f.write("\n")
    names = sorted(f for f in os.listdir(vocab_dir) if f.endswith(".gguf") and os.path.exists(os.path.join(vocab_dir, f + ".inp")))

    decoded = {}
    for name in names:
        path = os.path.join(vocab_dir, name)
        _, vocab = load(path)
        decoded[name] = {}
        for text in cases(path):
            ids = tokenize(vocab, text.encode(), False, False)
            decoded[name][text] = detokenize(vocab, ids, False, True).decode("utf-8", "replace")
    with open(os.path.join(out_dir, "llama-decode.json"), "w", encoding="utf-8") as f:
        json.dump(decoded, f, ensure_ascii=False, indent=0, sort_keys=True)
        f.write("\n")

    base = os.path.join(vocab_dir, "ggml-vocab-llama-bpe.gguf")
    texts = cases(base)
    pres = {"texts": texts, "ids": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_NAMES:
            p = os.path.join(tmp, f"{pre}.gguf")
            relabel(base, pre, p)
            _, vocab = load(p)
            pres["ids"][pre] = [tokenize(vocab, t.encode(), False, False) for t in texts]
        with open(os.path.join(out_dir, "pre-tokenizers.json"), "w", encoding="utf-8") as f:
            json.dump(pres, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")

        prompts = {"texts": PROMPT_TEXTS, "vocabularies": {}}
        for key, file, pre in PROMPTS:
            path = os.path.join(vocab_dir, file)
            if pre:
                path2 = os.path.join(tmp, f"{key}.gguf")
                relabel(path, pre, path2)
                path = path2
            _, vocab = load(path)
            prompts["vocabularies"][key] = {
                "file": file,
                "pre": pre,
                "ids": [tokenize(vocab, t.encode(), True, True) for t in PROMPT_TEXTS],
            }
        _, vocab = load(gemma)
        prompts["gemma-3-270m"] = {
            f"{str(a).lower()}-{str(p).lower()}": [tokenize(vocab, t.encode(), a, p) for t in PROMPT_TEXTS]
            for a in (False, True) for p in (False, True)
        }
        with open(os.path.join(out_dir, "prompts.json"), "w", encoding="utf-8") as f:
            json.dump(prompts, f, ensure_ascii=False, indent=1)
            f.write("\n")
    print(f"wrote {out_dir}: {len(decoded)} vocabularies, {len(PRE_NAMES)} pre-tokenizers, {len(PROMPTS)} prompt vocabularies")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
