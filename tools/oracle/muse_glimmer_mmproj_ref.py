#!/usr/bin/env python3
"""Executable form of docs/families/muse_glimmer.md section 7.3: a float64
numpy encoder for a muse-glimmer projector (ViT + pixel shuffle + adapter),
checked against the embeddings llama.cpp's clip loader computed
(tools/oracle/mm_encode.cpp writes them).

    PYTHONPATH=tools/oracle:$LCP/vendor/llama.cpp/gguf-py \
    python3 tools/oracle/muse_glimmer_mmproj_ref.py MMPROJ.gguf EMBD.json [--rtol 1e-4]

The image is mm_encode's synthetic one: pixel (x, y) channel c =
sin(0.37 x + 0.61 y + 1.3 c), already normalised.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

from oracle_common import Model, layer_norm

ROPE_BASE = 10000.0     # clip.cpp:1705
SPARSE_FACTOR = 4       # clip.cpp:1707


def gelu_erf(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def rope_norm(x, pos, n_dims, base):
    """NORM rope on the first n_dims of the last axis; x (T, H, n_dims...), pos (T,)."""
    x = x.copy()
    i = np.arange(n_dims // 2)
    theta = pos[:, None] * base ** (-2.0 * i / n_dims)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = x[..., 0:n_dims:2].copy(), x[..., 1:n_dims:2].copy()
    x[..., 0:n_dims:2], x[..., 1:n_dims:2] = a * c - b * s, a * s + b * c
    return x


def bilinear(table, P, gw, gh):
    """ggml upscale BILINEAR, half-pixel, clamped: table (P*P, Ev) row r = x + P*y."""
    grid = table.reshape(P, P, -1)          # [y, x, e]
    sx, sy = gw / P, gh / P
    out = np.zeros((gh, gw, table.shape[1]))
    for j in range(gh):
        y = (j + 0.5) / sy - 0.5
        y0 = int(math.floor(y)); y1 = y0 + 1
        y0c, y1c = min(max(y0, 0), P - 1), min(max(y1, 0), P - 1)
        dy = min(max(y - y0c, 0.0), 1.0)
        for i in range(gw):
            x = (i + 0.5) / sx - 0.5
            x0 = int(math.floor(x)); x1 = x0 + 1
            x0c, x1c = min(max(x0, 0), P - 1), min(max(x1, 0), P - 1)
            dx = min(max(x - x0c, 0.0), 1.0)
            out[j, i] = (grid[y0c, x0c] * (1 - dx) * (1 - dy) + grid[y0c, x1c] * dx * (1 - dy)
                         + grid[y1c, x0c] * (1 - dx) * dy + grid[y1c, x1c] * dx * dy)
    return out.reshape(gh * gw, -1)


def encode(m: Model, W: int, H: int) -> np.ndarray:
    kv = m.kv
    ps = kv["clip.vision.patch_size"]
    Ev = kv["clip.vision.embedding_length"]
    nh = kv["clip.vision.attention.head_count"]
    nl = kv["clip.vision.block_count"]
    eps = kv["clip.vision.attention.layer_norm_epsilon"]
    f = kv.get("clip.vision.spatial_merge_size", 2)
    dh = Ev // nh
    gw, gh = W // ps, H // ps
    T = gw * gh
    img = np.array([[[math.sin(np.float32(0.37) * x + np.float32(0.61) * y + np.float32(1.3) * c)
                      for c in range(3)] for x in range(W)] for y in range(H)])      # [y, x, c]
    K = m.w("v.patch_embd.weight")                                                 # (Ev, 3, ps, ps)
    patches = img.reshape(gh, ps, gw, ps, 3).transpose(0, 2, 4, 1, 3).reshape(T, 3 * ps * ps)  # [t, (c, ky, kx)]
    # [oracle quirk] ggml_conv_2d runs im2col into F16 unless the kernel is BF16
    # (ggml/src/ggml.c:4772), and mul_mat then converts the kernel to F16 too
    if m.types["v.patch_embd.weight"] != "BF16":
        patches = patches.astype(np.float16).astype(np.float64)
        K = K.astype(np.float16).astype(np.float64)
    x = patches @ K.reshape(Ev, -1).T
    b = m.opt("v.patch_embd.bias")
    if b is not None:
        x = x + b
    table = m.w("v.position_embd.weight")                                          # (P*P, Ev)
    P = int(round(math.sqrt(table.shape[0])))
    x = x + (table if (gw == P and gh == P) else bilinear(table, P, gw, gh))
    gx, gy = np.arange(T) % gw, np.arange(T) // gw
    win = (gy // P) * 10_000 + (gx // P)
    same_win = win[:, None] == win[None, :]
    pos_w, pos_h = (gx + 1).astype(np.float64), (gy + 1).astype(np.float64)

    def ln(x, name):
        w = m.opt(name + ".weight")
        if w is None:
            return x
        y = layer_norm(x, eps) * w
        bb = m.opt(name + ".bias")
        return y if bb is None else y + bb

    def lin(x, name):
        y = x @ m.w(name + ".weight").T
        bb = m.opt(name + ".bias")
        return y if bb is None else y + bb

    x = ln(x, "v.pre_ln")
    for il in range(nl):
        p = f"v.blk.{il}."
        h = ln(x, p + "ln1")
        q = lin(h, p + "attn_q").reshape(T, nh, dh)
        k = lin(h, p + "attn_k").reshape(T, nh, dh)
        v = lin(h, p + "attn_v").reshape(T, nh, dh)
        for arr in (q, k):
            arr[..., : dh // 2] = rope_norm(arr[..., : dh // 2], pos_w, dh // 2, ROPE_BASE)
            arr[..., dh // 2:] = rope_norm(arr[..., dh // 2:], pos_h, dh // 2, ROPE_BASE)
        glob = il == nl - 1 or (il + 1) % SPARSE_FACTOR == 0
        out = np.zeros((T, nh, dh))
        for hh in range(nh):
            s = (q[:, hh] @ k[:, hh].T) / math.sqrt(dh)
            if not glob:
                s = np.where(same_win, s, -np.inf)
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            out[:, hh] = s @ v[:, hh]
        x = x + lin(out.reshape(T, Ev), p + "attn_out")
        h = ln(x, p + "ln2")
        x = x + lin(gelu_erf(lin(h, p + "ffn_up")), p + "ffn_down")
    x = ln(x, "v.post_ln")
    n_out = (gw // f) * (gh // f)
    y = np.zeros((n_out, Ev * f * f))
    o = 0
    for oy in range(gh // f):
        for ox in range(gw // f):
            for ry in range(f):
                for rx in range(f):
                    s_ = ry * f + rx
                    y[o, s_::f * f] = x[(oy * f + ry) * gw + ox * f + rx]
            o += 1
    def mm(y, name):
        # ggml's CPU matmul converts the activations to F16 for F16 weights
        if m.types[name] == "F16":
            y = y.astype(np.float16).astype(np.float64)
        return y @ m.w(name).T

    y = gelu_erf(mm(y, "mm.0.weight"))
    y = gelu_erf(mm(y, "mm.1.weight"))
    return mm(y, "mm.2.weight")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mmproj")
    ap.add_argument("embd")
    ap.add_argument("--rtol", type=float, default=1e-4)
    args = ap.parse_args()
    g = json.load(open(args.embd))
    m = Model(args.mmproj, arch="clip")
    ref = encode(m, g["width"], g["height"])
    orc = np.asarray(g["embeddings"], dtype=np.float64).reshape(g["n_tokens"], g["n_embd"])
    d = float(np.max(np.abs(ref - orc)))
    scale = float(np.max(np.abs(orc)))
    print(f"tokens {g['n_tokens']} x {g['n_embd']}  max|embd| {scale:.4e}  max abs diff {d:.3e}  rel {d / scale:.3e}")
    ok = ref.shape == orc.shape and d <= args.rtol * scale
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
