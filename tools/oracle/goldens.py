#!/usr/bin/env python3
"""Logit goldens for a GGUF (any architecture llama.cpp runs; written for
qwen4exp and glm-dsa) from the llama.cpp oracle.

The oracle is llama.cpp as vendored by PyPI llama-cpp-python==0.3.36, built
from source on CPU (tools/oracle/build_llama.sh). This script only runs it and
writes a small JSON; CI reads the JSON and needs no Python.

    python3 tools/oracle/goldens.py MODEL.gguf OUT.json \
        --tokens 1,5,9,3 --steps 8 [--all-prefill-logits] [--incremental]

What it records (see docs/families/qwen4_exp.md and glm_moe_dsa.md, "Goldens"):
  prompt           the token ids fed in one prefill batch
  greedy           N greedy continuation tokens (argmax of the last logits;
                   ties -> lowest id, as numpy.argmax)
  step_logits      N rows: row 0 = logits at the last prompt position (they
                   predict greedy[0]); row i = logits after feeding greedy[i-1]
                   as a single-token decode
  prefill_logits   (with --all-prefill-logits) logits of every prompt position
  incremental      (with --incremental) the same prompt fed one token per
                   decode call in a fresh context: its per-position logits and
                   the max abs difference to the batched prefill. llama.cpp
                   runs different code for 1-token and n-token ubatches (fused
                   GDN autoregressive vs chunked, QSA cache reads), so this is
                   the oracle's own self-consistency bound.
  qsa_exact        (qwen4exp) per position (prompt + steps): whether the QSA
                   top-k selection at that query is free of ties (see the
                   doc); logits at a position marked false depend on the tie
                   order of ggml's CPU top_k (libstdc++ std::partial_sort),
                   which qwen4exp_ref.py's libstdcxx_top_k reproduces exactly
  indexer_dense    (glm-dsa) per position: true where p + 1 <= indexer top_k,
                   i.e. the lightning indexer selects every visible token and
                   the layer is dense attention; false rows are sparse and
                   may depend on the same tie order (score ties, e.g. 0 after
                   the ReLU)
  config           the context settings that affect numbers

Numerics pinned here, on purpose:
  * KV cache (and the QSA indexer cache) in F32, not the default F16
    (type_k/type_v = GGML_TYPE_F32), so cached K/V are not rounded.
  * flash attention off (its CPU path casts K/V and the mask to F16).
  * n_batch = n_ubatch >= prompt length, so the prompt is one ubatch.
  Weights are whatever the GGUF holds; ggml's CPU matmul quantizes the
  activations for quantized weights (Q8_0/Q8_K) and converts them to F16 for
  F16 weights, so a Rust f32 reference differs from the oracle by that much.

Floats are written with Python repr of the f32 value widened to f64 (exact).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from pathlib import Path

GGML_TYPE_F32 = 0


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_meta(path: Path) -> dict:
    """The architecture's own keys, through gguf-py if present (for the
    record and for the per-architecture flags)."""
    try:
        import gguf  # PyPI gguf; any version reads the generic container
    except Exception:
        return {}
    r = gguf.GGUFReader(str(path))
    arch_field = r.fields.get("general.architecture")
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode() if arch_field else ""
    out = {}
    for name, field in r.fields.items():
        if not (name.startswith(arch + ".") or name == "general.architecture"):
            continue
        try:
            if len(field.types) == 1 and field.types[0] == gguf.GGUFValueType.STRING:
                out[name] = bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
            elif field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
                out[name] = [x.item() if hasattr(x, "item") else x
                             for x in (field.parts[i][0] for i in field.data)]
            else:
                v = field.parts[field.data[0]][0]
                out[name] = v.item() if hasattr(v, "item") else v
        except Exception:
            pass
    return out


def qsa_exact_flags(n_pos: int, top_k: int | None, ratios: list[int]) -> list[bool]:
    """True where every QSA layer's selection is tie-free for the query at q.

    width = min(n_kv, top_k + r - 1) cells. Visible cells = q + 1 (the n_kv
    padding only adds -inf cells). Tail t = (q+1) % r cells always win; the
    rest R = width - t come from whole blocks of r equal-scored cells, so the
    pick is tie-free iff R % r == 0, i.e. t == (top_k - 1) % r, or when
    everything visible fits (q + 1 <= width). (Two blocks with exactly equal
    scores, e.g. both 0 after the ReLU, are a further tie not checked here.)
    """
    rs = sorted({r for r in ratios if r > 0})
    if top_k is None or not rs:
        return [True] * n_pos
    flags = []
    for q in range(n_pos):
        ok = True
        for r in rs:
            width = top_k + r - 1
            if q + 1 <= width:
                continue
            t = (q + 1) % r
            if t != (top_k - 1) % r:
                ok = False
        flags.append(ok)
    return flags


def selection_flags(meta: dict, n_pos: int) -> dict:
    """The per-architecture flags that say which positions depend on a sparse
    token selection (see the families' docs)."""
    arch = meta.get("general.architecture")
    if arch == "qwen4exp":
        ratios = meta.get("qwen4exp.attention.compress_ratios") or []
        if isinstance(ratios, int):
            ratios = [ratios]
        return {"qsa_exact": qsa_exact_flags(n_pos, meta.get("qwen4exp.attention.indexer.top_k"), list(ratios))}
    if arch == "glm-dsa":
        top_k = meta.get("glm-dsa.attention.indexer.top_k")
        return {"indexer_dense": [top_k is None or p + 1 <= top_k for p in range(n_pos)]}
    return {}


def f32_list(row) -> list[float]:
    return [float(x) for x in row]


def make_llama(model: Path, n_ctx: int, n_batch: int, threads: int, seed: int):
    from llama_cpp import Llama
    return Llama(
        model_path=str(model),
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=True,
        flash_attn=False,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
        seed=seed,
        n_gpu_layers=0,
        verbose=False,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokens", default="1,2,3,4,5,6,7,8",
                    help="comma-separated prompt token ids (default 1..8)")
    ap.add_argument("--steps", type=int, default=8, help="greedy steps (default 8)")
    ap.add_argument("--n-ctx", type=int, default=256)
    ap.add_argument("--threads", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--all-prefill-logits", action="store_true",
                    help="also store the logits of every prompt position")
    ap.add_argument("--incremental", action="store_true",
                    help="also run the prompt one token at a time and record the difference")
    ap.add_argument("--top", type=int, default=0,
                    help="store only the top-N (id, logit) pairs per row instead of full rows "
                         "(for real vocabularies); 0 = full rows")
    args = ap.parse_args()

    import numpy as np
    import llama_cpp

    prompt = [int(t) for t in args.tokens.split(",") if t.strip() != ""]
    if not prompt:
        ap.error("empty --tokens")
    n_total = len(prompt) + args.steps
    if n_total > args.n_ctx:
        ap.error(f"prompt + steps = {n_total} exceeds --n-ctx {args.n_ctx}")

    def pack(row):
        row = np.asarray(row, dtype=np.float32)
        if args.top and args.top < row.shape[0]:
            idx = np.argsort(-row, kind="stable")[: args.top]
            return {"ids": [int(i) for i in idx], "logits": f32_list(row[idx])}
        return f32_list(row)

    llm = make_llama(args.model, args.n_ctx, max(len(prompt), 1), args.threads, args.seed)
    n_vocab = llm.n_vocab()
    for t in prompt:
        if not 0 <= t < n_vocab:
            ap.error(f"token {t} outside vocab {n_vocab}")

    # prefill: one batch, one ubatch
    llm.reset()
    llm.eval(prompt)
    scores = np.array(llm.scores[: llm.n_tokens, :], dtype=np.float32, copy=True)
    prefill_rows = scores[: len(prompt)]

    greedy: list[int] = []
    step_logits = []
    last = prefill_rows[-1]
    for _ in range(args.steps):
        step_logits.append(pack(last))
        nxt = int(np.argmax(last))
        greedy.append(nxt)
        llm.eval([nxt])
        last = np.array(llm.scores[llm.n_tokens - 1, :], dtype=np.float32, copy=True)
    for row in step_logits:
        if not args.top:
            assert all(math.isfinite(v) for v in row), "non-finite logit"

    meta = read_meta(args.model)

    out = {
        "oracle": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (CPU)",
        "model": {"file": args.model.name, "sha256": sha256_file(args.model), "n_vocab": n_vocab},
        "metadata": meta,
        "config": {
            "n_ctx": args.n_ctx, "n_batch": max(len(prompt), 1), "n_ubatch": max(len(prompt), 1),
            "type_k": "f32", "type_v": "f32", "flash_attn": False, "threads": args.threads,
        },
        "prompt": prompt,
        "greedy": greedy,
        "step_logits_format": "top" if args.top else "full",
        "step_logits": step_logits,
    }
    out.update(selection_flags(meta, n_total))
    if args.all_prefill_logits:
        out["prefill_logits"] = [pack(r) for r in prefill_rows]

    if args.incremental:
        del llm
        inc = make_llama(args.model, args.n_ctx, 1, args.threads, args.seed)
        inc.reset()
        rows = []
        for t in prompt:
            inc.eval([t])
            rows.append(np.array(inc.scores[inc.n_tokens - 1, :], dtype=np.float32, copy=True))
        rows = np.stack(rows)
        diff = float(np.max(np.abs(rows - prefill_rows)))
        out["incremental"] = {
            "max_abs_diff_vs_prefill": diff,
            "logits": [pack(r) for r in rows] if args.all_prefill_logits else None,
        }
        print(f"incremental vs prefill: max |diff| = {diff:.3e}", file=sys.stderr)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: prompt {len(prompt)} tokens, greedy {greedy}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
