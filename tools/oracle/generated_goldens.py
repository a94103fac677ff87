#!/usr/bin/env python3
"""Goldens of llama.cpp on quantized models the tests can make again.

A quantized file of every type people run costs the repository megabytes
(the tracked tree must stay under the device tool's 64 MiB), so the models
of these goldens are not committed: each is made by `cargo xtask
generated-model` from a committed model's metadata and tensor table (one of
llama.cpp's test-llama-archs models), the tensor types llama-quantize
chooses for a file type, and this project's pseudo-random values of a seed
and a gain. The golden keeps that recipe and the model's sha256; the tests
make the same file again, check the hash and compare. Only the logits are
committed: little-endian f32 in NAME.logits beside NAME.golden.json.

    python3 tools/oracle/generated_goldens.py BASE.gguf --file-type Q4_K_M \\
        --seed 1 --gain 1 --name gen-q4km [--quantize-arg=--tensor-type ...]

Writes BASE's folder/NAME.golden.json and NAME.logits. The runs (llama.cpp
as vendored by llama-cpp-python 0.3.36, CPU, tools/oracle/build_llama.sh):
every combination of the cache types (--cache f32,f16: K and V alike) and
the prompt fed as one batch (`batched`, the logits of every position of
the one ubatch) or one token per decode (`one-token`), then --steps greedy
tokens fed one at a time on that context. Flash attention off (llama-cpp-
python's default) unless --flash-attn on (or both: every run twice). Rows
of a run: every prompt position, then one per step but the last.

Env: LLAMA_QUANTIZE (default /tmp/lcp/build/bin/llama-quantize, else found
under /tmp/lcp), XTASK (the built xtask binary; default `cargo xtask`).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FORMAT = "seam-generated-golden-1"
CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30}
DEFAULT_PROMPT = "5,17,99,3,0,42,7,7,64,1,0,0,9,120,33,2,5,17,99,3,11,76,23,88"


def llama_quantize() -> str:
    env = os.environ.get("LLAMA_QUANTIZE")
    if env:
        return env
    found = sorted(glob.glob("/tmp/lcp/**/bin/llama-quantize", recursive=True))
    if not found:
        sys.exit("llama-quantize not found: build it (tools/oracle/README.md) or set LLAMA_QUANTIZE")
    return found[0]


def run_llama(model: Path, prompt: list[int], steps: int, cache: str, batched: bool, threads: int,
              flash_attn: bool = False):
    """The logits of every prompt position, then of each greedy step but the last."""
    import numpy as np
    from llama_cpp import Llama

    n_batch = len(prompt) if batched else 1
    llm = Llama(
        model_path=str(model), n_ctx=128, n_batch=n_batch, n_ubatch=n_batch,
        n_threads=threads, n_threads_batch=threads, logits_all=True, flash_attn=flash_attn,
        type_k=CACHE_TYPES[cache], type_v=CACHE_TYPES[cache], seed=1234,
        n_gpu_layers=0, verbose=False,
    )
    llm.reset()
    if batched:
        llm.eval(prompt)
        rows = [np.array(llm.scores[i, :], dtype=np.float32, copy=True) for i in range(len(prompt))]
    else:
        rows = []
        for t in prompt:
            llm.eval([t])
            rows.append(np.array(llm.scores[llm.n_tokens - 1, :], dtype=np.float32, copy=True))
    greedy = []
    last = rows[-1]
    for i in range(steps):
        nxt = int(np.argmax(last))
        greedy.append(nxt)
        if i + 1 < steps:
            llm.eval([nxt])
            last = np.array(llm.scores[llm.n_tokens - 1, :], dtype=np.float32, copy=True)
            rows.append(last)
    assert all(np.all(np.isfinite(r)) for r in rows), "non-finite logit"
    n_vocab = llm.n_vocab()
    del llm
    return rows, greedy, n_vocab


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", type=Path, help="a committed model (its folder gets the golden)")
    ap.add_argument("--file-type", required=True, help="llama-quantize's type: Q8_0, Q4_K_M, IQ4_XS, ...")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--gain", type=int, default=1)
    ap.add_argument("--name", required=True, help="the golden's name (NAME.golden.json)")
    ap.add_argument("--tokens", default=DEFAULT_PROMPT)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--cache", default="f32,f16", help="cache types to run (K and V alike)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--flash-attn", default="off", choices=["off", "on", "both"],
                    help="llama.cpp's flash attention in the runs (both: every run twice)")
    ap.add_argument("--quantize-arg", action="append", default=[],
                    help="an extra llama-quantize argument (repeat; e.g. --quantize-arg=--tensor-type --quantize-arg=ple_norm=f32)")
    ap.add_argument("--unit-imatrix", action="append", default=[], metavar="TENSOR=NVAL",
                    help="an all-ones importance matrix entry of NVAL values (the tensor's ne0, times "
                         "its experts for a stack) handed to llama-quantize, which asks one of the IQ1/IQ2 "
                         "types; the values are this project's anyway, only the type is taken (repeat)")
    ap.add_argument("--note", default="")
    args = ap.parse_args()

    import llama_cpp

    root = Path(__file__).resolve().parents[2]
    prompt = [int(t) for t in args.tokens.split(",")]
    out_dir = args.base.parent
    with tempfile.TemporaryDirectory() as tmp:
        q = Path(tmp) / "quantized.gguf"
        imatrix = []
        if args.unit_imatrix:
            # llama-imatrix's legacy .dat: entries (name, calls, values), then the
            # last call and the dataset's name.
            import struct
            path = Path(tmp) / "unit.imatrix.dat"
            with open(path, "wb") as f:
                f.write(struct.pack("<i", len(args.unit_imatrix)))
                for entry in args.unit_imatrix:
                    name, nval = entry.rsplit("=", 1)
                    nval = int(nval)
                    f.write(struct.pack("<i", len(name.encode())) + name.encode())
                    f.write(struct.pack("<ii", 1, nval) + struct.pack(f"<{nval}f", *([1.0] * nval)))
                f.write(struct.pack("<ii", 1, 4) + b"unit")
            imatrix = ["--imatrix", str(path)]
        subprocess.run([llama_quantize(), *imatrix, *args.quantize_arg, str(args.base), str(q),
                        args.file_type], check=True, stdout=subprocess.DEVNULL)
        model = Path(tmp) / "generated.gguf"
        xtask = [os.environ["XTASK"]] if os.environ.get("XTASK") else ["cargo", "xtask"]
        made = subprocess.run(
            [*xtask, "generated-model", "--base", str(args.base),
             "--types-from", str(q), "--file-type", args.file_type, "--seed", str(args.seed),
             "--gain", str(args.gain), "--out", str(model)],
            check=True, capture_output=True, text=True, cwd=root)
        made = json.loads(made.stdout.strip().splitlines()[-1])
        runs, blobs, offset, n_vocab = [], [], 0, None
        fa_modes = {"off": (False,), "on": (True,), "both": (False, True)}[args.flash_attn]
        for fa in fa_modes:
            for cache in args.cache.split(","):
                for batched in (True, False):
                    rows, greedy, n_vocab = run_llama(model, prompt, args.steps, cache, batched,
                                                      args.threads, fa)
                    runs.append({"cache_type_k": cache, "cache_type_v": cache, "flash_attn": fa,
                                 "batched": batched, "greedy": greedy, "row_offset": offset,
                                 "rows": len(rows)})
                    blobs.extend(rows)
                    offset += len(rows)
                    print(f"{args.name}: {cache} {'batched' if batched else 'one-token'}"
                          f"{' fa' if fa else ''}: greedy {greedy}", file=sys.stderr)
    import numpy as np
    logits_file = f"{args.name}.logits"
    np.stack(blobs).astype("<f4").tofile(out_dir / logits_file)
    golden = {
        "format": FORMAT,
        "oracle": f"llama.cpp via llama-cpp-python {llama_cpp.__version__} (CPU), "
                  f"types by llama-quantize {args.file_type} {' '.join(args.quantize_arg)}".strip(),
        "note": args.note,
        "recipe": made["recipe"],
        "model": {"sha256": made["sha256"], "bytes": made["bytes"], "n_vocab": n_vocab},
        "prompt": prompt,
        "logits_file": logits_file,
        "runs": runs,
    }
    with open(out_dir / f"{args.name}.golden.json", "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(f"wrote {out_dir / (args.name + '.golden.json')} ({len(runs)} runs, {offset} rows)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
