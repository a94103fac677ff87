#!/usr/bin/env python3
"""Logit goldens for any GGUF llama.cpp runs, from the llama.cpp oracle.

Architecture-generic form of qwen4exp_goldens.py (same JSON layout, so one
Rust comparator reads both). The oracle is llama.cpp as vendored by PyPI
llama-cpp-python==0.3.36, built on CPU by tools/oracle/build_llama.sh. This
script only runs it and writes a small JSON; CI reads the JSON, no Python.

    python3 tools/oracle/llama_goldens.py MODEL.gguf OUT.json \
        --tokens 1,5,9,3 --steps 8 [--incremental] [--top N]

What it records:
  prompt           the token ids fed in one prefill batch (one ubatch)
  greedy           N greedy continuation tokens (argmax of the last logits;
                   ties -> lowest id, as numpy.argmax)
  prefill_logits   logits of EVERY prompt position (always written)
  step_logits      N rows: row 0 = logits at the last prompt position (equal
                   to prefill_logits[-1], they predict greedy[0]); row i =
                   logits after feeding greedy[i-1] as a one-token decode.
                   prefill_logits + step_logits[1:] are the logits of every
                   position of prompt + greedy[:-1].
  incremental      (--incremental) the prompt fed one token per decode call
                   in a fresh context: per-position logits and the max abs
                   difference to the batched prefill, the oracle's own
                   1-token vs n-token consistency bound; then the same
                   greedy tokens fed on that context (`step_logits`, rows
                   as the top-level `step_logits`): the steps of the
                   one-token path, with their max abs difference to the
                   steps on the batched cache
  model.sha256     the GGUF's hash: test-llama-archs weights depend on the C++
                   library (std::hash), so goldens belong to one exact file
  metadata         every non-array-of-string key under the file's
                   architecture prefix (for the record)
  config           the context settings that affect numbers

Numerics pinned on purpose (see docs/families/*.md, "Numerics"):
  * KV cache in F32 (type_k = type_v = GGML_TYPE_F32), not the default F16;
  * flash attention off (its CPU path casts K/V and the mask to F16);
  * n_batch = n_ubatch >= prompt length, so the prompt is one ubatch.

Floats are the f32 values widened to f64 (Python repr, exact).
"""
from __future__ import annotations

import argparse
import hashlib
import json
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
    """general.architecture and the keys under its prefix, through gguf-py."""
    try:
        import gguf
    except Exception:
        return {}
    r = gguf.GGUFReader(str(path))
    out = {}
    arch = None
    f = r.fields.get("general.architecture")
    if f is not None:
        arch = bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
        out["general.architecture"] = arch
    if arch is None:
        return out
    for name, field in r.fields.items():
        if not name.startswith(arch + "."):
            continue
        try:
            t0 = field.types[0]
            if t0 == gguf.GGUFValueType.STRING:
                out[name] = bytes(field.parts[field.data[0]]).decode("utf-8", "replace")
            elif t0 == gguf.GGUFValueType.ARRAY:
                if len(field.types) > 1 and field.types[1] == gguf.GGUFValueType.STRING:
                    continue
                out[name] = [field.parts[i][0].item() for i in field.data]
            else:
                out[name] = field.parts[field.data[0]][0].item()
        except Exception:
            pass
    return out


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
    ap.add_argument("--incremental", action="store_true",
                    help="also run the prompt one token at a time and record the difference")
    ap.add_argument("--top", type=int, default=0,
                    help="store only the top-N (id, logit) pairs per row (real vocabularies); 0 = full rows")
    ap.add_argument("--note", default="", help="free text stored as 'note' (how the model was made)")
    args = ap.parse_args()

    import numpy as np
    import llama_cpp

    prompt = [int(t) for t in args.tokens.split(",") if t.strip() != ""]
    if not prompt:
        ap.error("empty --tokens")
    if args.steps < 1:
        ap.error("--steps must be >= 1")
    n_total = len(prompt) + args.steps
    if n_total > args.n_ctx:
        ap.error(f"prompt + steps = {n_total} exceeds --n-ctx {args.n_ctx}")

    def pack(row):
        row = np.asarray(row, dtype=np.float32)
        assert np.all(np.isfinite(row)), "non-finite logit"
        if args.top and args.top < row.shape[0]:
            idx = np.argsort(-row, kind="stable")[: args.top]
            return {"ids": [int(i) for i in idx], "logits": [float(x) for x in row[idx]]}
        return [float(x) for x in row]

    n_batch = max(len(prompt), 1)
    llm = make_llama(args.model, args.n_ctx, n_batch, args.threads, args.seed)
    n_vocab = llm.n_vocab()
    for t in prompt:
        if not 0 <= t < n_vocab:
            ap.error(f"token {t} outside vocab {n_vocab}")

    llm.reset()
    llm.eval(prompt)
    prefill_rows = np.array(llm.scores[: len(prompt), :], dtype=np.float32, copy=True)

    greedy: list[int] = []
    step_logits = []
    last = prefill_rows[-1]
    step_rows = []
    for _ in range(args.steps):
        step_rows.append(last)
        step_logits.append(pack(last))
        nxt = int(np.argmax(last))
        greedy.append(nxt)
        llm.eval([nxt])
        last = np.array(llm.scores[llm.n_tokens - 1, :], dtype=np.float32, copy=True)

    out = {
        "oracle": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (CPU)",
        "model": {"file": args.model.name, "sha256": sha256_file(args.model), "n_vocab": n_vocab},
        "note": args.note,
        "metadata": read_meta(args.model),
        "config": {
            "n_ctx": args.n_ctx, "n_batch": n_batch, "n_ubatch": n_batch,
            "type_k": "f32", "type_v": "f32", "flash_attn": False, "threads": args.threads,
        },
        "prompt": prompt,
        "greedy": greedy,
        "step_logits_format": "top" if args.top else "full",
        "step_logits": step_logits,
        "prefill_logits": [pack(r) for r in prefill_rows],
    }

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
        # The same greedy tokens fed on this one-token context: llama.cpp's
        # steps without its batched prefill's cache (the batched matmuls
        # round differently in the last bits, and on a sensitive model a
        # one-ulp difference at a Q8_0/Q8_K/F16 rounding boundary moves the
        # logits by 1e-2).
        inc_steps = [rows[-1]]
        for t in greedy[:-1]:
            inc.eval([t])
            inc_steps.append(np.array(inc.scores[inc.n_tokens - 1, :], dtype=np.float32, copy=True))
        inc_steps = np.stack(inc_steps)
        batched_steps = np.stack([prefill_rows[-1]] + [np.asarray(r, dtype=np.float32) for r in step_rows[1:]])
        sdiff = float(np.max(np.abs(inc_steps - batched_steps)))
        out["incremental"] = {
            "max_abs_diff_vs_prefill": diff,
            "logits": [pack(r) for r in rows],
            "step_max_abs_diff_vs_batched": sdiff,
            "step_logits": [pack(r) for r in inc_steps],
        }
        print(f"incremental vs prefill: max |diff| = {diff:.3e}; steps {sdiff:.3e}", file=sys.stderr)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}: prompt {len(prompt)} tokens, greedy {greedy}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
