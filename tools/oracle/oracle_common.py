"""Shared pieces of the float64 numpy references (tools/oracle/*_ref.py):
reading a GGUF through gguf-py, the primitives every family uses, and the
check of a forward pass against a golden written by llama_goldens.py.

gguf-py: the copy vendored in the llama-cpp-python 0.3.36 sdist knows every
architecture name used here (PYTHONPATH=.../vendor/llama.cpp/gguf-py); PyPI
gguf >= 0.19 works too. Tensors are dequantized with gguf.quants.dequantize.
"""
from __future__ import annotations

import json

import numpy as np


class Model:
    """All tensors of a GGUF as float64 arrays in numpy (torch) order, and its
    keys. `k(key)` reads `<arch>.<key>`; `arch` may be given to accept an
    alias (e.g. glm5next / glm5-next)."""

    def __init__(self, path: str, arch: str | None = None):
        import gguf
        from gguf.quants import dequantize
        self.r = gguf.GGUFReader(path)
        self.kv = {}
        for name, f in self.r.fields.items():
            if not f.types:
                continue
            t0 = f.types[0]
            if t0 == gguf.GGUFValueType.STRING:
                self.kv[name] = bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
            elif t0 == gguf.GGUFValueType.ARRAY:
                if len(f.types) > 1 and f.types[1] == gguf.GGUFValueType.STRING:
                    continue
                self.kv[name] = [f.parts[i][0].item() for i in f.data]
            else:
                self.kv[name] = f.parts[f.data[0]][0].item()
        self.arch = arch or self.kv["general.architecture"]
        self.types = {}
        self.t = {}
        for t in self.r.tensors:
            a = dequantize(t.data, t.tensor_type)
            shape = tuple(int(x) for x in reversed(t.shape))
            self.t[t.name] = np.asarray(a, dtype=np.float64).reshape(shape)
            self.types[t.name] = t.tensor_type.name

    def k(self, key, default=None):
        return self.kv.get(self.arch + "." + key, default)

    def w(self, name):
        return self.t[name]

    def opt(self, name):
        return self.t.get(name)


def rms(x, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def layer_norm(x, eps):
    mu = np.mean(x, axis=-1, keepdims=True)
    d = x - mu
    return d / np.sqrt(np.mean(d * d, axis=-1, keepdims=True) + eps)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def silu(x):
    return x * sigmoid(x)


def softplus(x):
    """ggml's: x above 20 passes through (ggml-cpu/unary-ops.cpp)."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def softmax(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def mm(x, w, s=None):
    """x (..., in) times a GGUF weight w (numpy shape (out, in)); optional
    per-tensor `.scale` s applied to the product, as build_lora_mm does."""
    y = x @ w.T
    if s is not None:
        y = y * s.reshape(-1)[0]
    return y


def rows_of(row):
    if isinstance(row, dict):
        raise SystemExit("golden stores top-N rows; rerun llama_goldens.py without --top")
    return np.asarray(row, dtype=np.float64)


def check_golden(forward, golden_path: str, rtol: float) -> int:
    """forward(tokens) -> logits (len(tokens), n_vocab) for every position.
    Compares every position of prompt + greedy[:-1] with the golden and the
    greedy tokens; exit code 0 = match within rtol * max|oracle logit|."""
    g = json.load(open(golden_path))
    prompt, greedy = g["prompt"], g["greedy"]
    seq = prompt + greedy[:-1]
    logits = forward(seq)
    checks = []
    for i, row in enumerate(g.get("prefill_logits") or []):
        checks.append((i, rows_of(row)))
    for i, row in enumerate(g["step_logits"]):
        checks.append((len(prompt) - 1 + i, rows_of(row)))
    scale = max(float(np.max(np.abs(r))) for _, r in checks)
    worst, worst_pos = 0.0, -1
    for pos, orow in checks:
        d = float(np.max(np.abs(logits[pos] - orow)))
        if d > worst:
            worst, worst_pos = d, pos
    ref_greedy = [int(np.argmax(logits[len(prompt) - 1 + i])) for i in range(len(greedy))]
    print(f"positions checked {len(set(p for p, _ in checks))}  max|logit| {scale:.4e}  "
          f"max abs diff {worst:.3e} (position {worst_pos})  rel {worst / scale:.3e}")
    print(f"greedy oracle {greedy}  ref {ref_greedy}")
    ok = worst <= rtol * scale and ref_greedy == greedy
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1
