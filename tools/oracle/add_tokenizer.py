#!/usr/bin/env python3
"""Copy a GGUF adding the tokenizer keys of another file (its first n_vocab
tokens), so that llama.cpp loads a family's built-in fixture, which the
Rust side writes without a tokenizer (no forward-pass number depends on it).
Tensors and every other key are copied unchanged (checked: same bytes).

    PYTHONPATH=$LCP/vendor/llama.cpp/gguf-py python3 tools/oracle/add_tokenizer.py \
        FIXTURE.gguf TOKENIZER_SOURCE.gguf OUT.gguf

Used for muse_glimmer's built-in fixture (tests/data/muse_glimmer/README.md):
    muse_glimmer --write-fixture /tmp/f.gguf
    add_tokenizer.py /tmp/f.gguf tests/data/muse_glimmer/s7-d05-softcap.gguf /tmp/f-tok.gguf
    llama_goldens.py /tmp/f-tok.gguf tests/data/muse_glimmer/fixture.golden.json \\
        --tokens 5,15,25,50,44,37,18,33,13,33,52,41 --steps 6 --incremental --note "built-in fixture"
"""
from __future__ import annotations

import sys

import numpy as np
import gguf


def main() -> int:
    src_path, tok_path, out_path = sys.argv[1:4]
    r = gguf.GGUFReader(src_path)
    tok = gguf.GGUFReader(tok_path)
    arch = r.fields["general.architecture"].contents()
    n_vocab = next(int(t.shape[1]) for t in r.tensors if t.name == "token_embd.weight")
    w = gguf.GGUFWriter(out_path, arch)
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_array(k, f.contents())
        else:
            w.add_key_value(k, f.contents(), f.types[0])
    tf = tok.fields
    w.add_tokenizer_model(tf["tokenizer.ggml.model"].contents())
    w.add_token_list(tf["tokenizer.ggml.tokens"].contents()[:n_vocab])
    w.add_token_types(tf["tokenizer.ggml.token_type"].contents()[:n_vocab])
    w.add_token_scores(tf["tokenizer.ggml.scores"].contents()[:n_vocab])
    floats = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
    for t in r.tensors:
        shape = [int(x) for x in reversed(list(t.shape))] if t.tensor_type in floats else None
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = {t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(out_path).tensors}
    same = all(out[t.name] == np.asarray(t.data).tobytes() for t in r.tensors)
    print(f"wrote {out_path}: {len(out)} tensors, {n_vocab} tokens, tensors unchanged: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
