#!/usr/bin/env python3
"""Executable form of docs/families/muse_glimmer.md: a slow float64 numpy
forward pass of a muse-glimmer GGUF, checked against a golden written by
llama_goldens.py (llama.cpp). Small models only (test-llama-archs size).

    PYTHONPATH=tools/oracle:$LCP/vendor/llama.cpp/gguf-py \
    python3 tools/oracle/muse_glimmer_ref.py MODEL.gguf GOLDEN.json [--rtol 1e-4] [--ablate RULE]

It recomputes the logits of every position (prompt and greedy steps) and
prints the max abs/rel error. --ablate breaks one rule of the spec on purpose
(to show the goldens catch it); see ABLATIONS.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from oracle_common import Model, check_golden, mm, rms, sigmoid, silu

POST_NORM_EPS = 1e-8  # muse-glimmer.cpp:62-63, no key

ABLATIONS = {
    "embd-norm": "drop the weightless RMSNorm on the embedding",
    "rope-full": "rope the full layers too (spec: only SWA layers)",
    "rope-neox": "rope (i, i + n_rot/2) pairs instead of adjacent ones",
    "post-eps": "post-norms with the rms eps instead of 1e-8",
    "gate": "drop the sigmoid attention output gate",
    "swa": "no sliding-window mask (every layer full)",
    "scales": "ignore the .scale tensors llama.cpp applies",
    "unused-scales": "also apply attn_gate/ffn_*.scale, which llama.cpp ignores",
    "softcap-order": "softcap before the logit scale",
}


class Ref:
    def __init__(self, m: Model, ablate: str | None = None):
        self.m, self.ab = m, ablate
        k = m.k
        self.E = k("embedding_length")
        self.n_layer = k("block_count")
        self.eps = k("attention.layer_norm_rms_epsilon")
        nh = k("attention.head_count")
        self.n_head = nh[0] if isinstance(nh, list) else nh
        nkv = k("attention.head_count_kv", self.n_head)
        self.n_head_kv = nkv[0] if isinstance(nkv, list) else nkv
        self.hd = k("attention.key_length", self.E // self.n_head)
        self.base = k("rope.freq_base_swa", k("rope.freq_base", 10000.0))
        self.n_swa = k("attention.sliding_window")
        pat = k("attention.sliding_window_pattern", 4)
        if isinstance(pat, list):
            self.is_swa = [bool(v) for v in pat]
        else:
            n = int(pat)
            self.is_swa = [n == 0 or (i % n) < (n - 1) for i in range(self.n_layer)]
        # the graph uses one n_rot, hparams.n_rot() of layer 0 (llama-graph.cpp:1468)
        n_rot_full = k("rope.dimension_count", self.hd)
        self.n_rot = k("rope.dimension_count_swa", n_rot_full) if self.is_swa[0] else n_rot_full
        self.logit_scale = k("logit_scale")
        # absent key: hparams default 30.0 (src/llama-hparams.h:136), not "off"
        self.softcap = k("final_logit_softcapping", 30.0)

    def s(self, name):
        return None if self.ab == "scales" else self.m.opt(name + ".scale")

    def s_unused(self, name):
        return self.m.opt(name + ".scale") if self.ab == "unused-scales" else None

    def rope(self, x, pos):
        """x (T, H, hd); NORM rope on the first n_rot dims."""
        x = x.copy()
        half = self.n_rot // 2
        i = np.arange(half)
        theta = pos[:, None].astype(np.float64) * self.base ** (-2.0 * i / self.n_rot)  # (T, half)
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        if self.ab == "rope-neox":
            a, b = x[..., :half].copy(), x[..., half:self.n_rot].copy()
            x[..., :half], x[..., half:self.n_rot] = a * c - b * s, a * s + b * c
        else:
            a, b = x[..., 0:self.n_rot:2].copy(), x[..., 1:self.n_rot:2].copy()
            x[..., 0:self.n_rot:2], x[..., 1:self.n_rot:2] = a * c - b * s, a * s + b * c
        return x

    def attn(self, il, x, pos):
        m, p = self.m, f"blk.{il}."
        T = x.shape[0]
        if m.opt(p + "attn_qkv.weight") is not None:
            qkv = mm(x, m.w(p + "attn_qkv.weight"), self.s(p + "attn_qkv"))
            b = m.opt(p + "attn_qkv.bias")
            if b is not None:
                qkv = qkv + b
            nq, nk = self.n_head * self.hd, self.n_head_kv * self.hd
            q, kk, v = qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:]
        else:
            q = mm(x, m.w(p + "attn_q.weight"), self.s(p + "attn_q"))
            kk = mm(x, m.w(p + "attn_k.weight"), self.s(p + "attn_k"))
            v = mm(x, m.w(p + "attn_v.weight"), self.s(p + "attn_v"))
            for name, arr in (("attn_q", q), ("attn_k", kk), ("attn_v", v)):
                b = m.opt(p + name + ".bias")
                if b is not None:
                    arr += b
        gate = mm(x, m.w(p + "attn_gate.weight"), self.s_unused(p + "attn_gate"))
        q = q.reshape(T, self.n_head, self.hd)
        kk = kk.reshape(T, self.n_head_kv, self.hd)
        v = v.reshape(T, self.n_head_kv, self.hd)
        q = rms(q, self.eps) * m.w(p + "attn_q_norm.weight")
        kk = rms(kk, self.eps) * m.w(p + "attn_k_norm.weight")
        swa = self.is_swa[il] and self.ab != "swa"
        if self.is_swa[il] or self.ab == "rope-full":
            q, kk = self.rope(q, pos), self.rope(kk, pos)
        scale = 1.0 / np.sqrt(self.hd)
        g = self.n_head // self.n_head_kv
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        vis = j <= i
        if swa:
            vis = vis & (i - j < self.n_swa)
        out = np.zeros((T, self.n_head, self.hd))
        for h in range(self.n_head):
            kv = h // g
            sc = (q[:, h, :] @ kk[:, kv, :].T) * scale
            sc = np.where(vis, sc, -np.inf)
            sc = np.exp(sc - sc.max(axis=1, keepdims=True))
            sc /= sc.sum(axis=1, keepdims=True)
            out[:, h, :] = sc @ v[:, kv, :]
        a = out.reshape(T, self.n_head * self.hd)
        if self.ab != "gate":
            a = a * sigmoid(gate)
        return mm(a, m.w(p + "attn_output.weight"), self.s(p + "attn_output"))

    def forward(self, tokens):
        m = self.m
        tok = np.asarray(tokens)
        pos = np.arange(len(tokens))
        post_eps = self.eps if self.ab == "post-eps" else POST_NORM_EPS
        h = m.w("token_embd.weight")[tok]
        if self.ab != "embd-norm":
            h = rms(h, self.eps)
        for il in range(self.n_layer):
            p = f"blk.{il}."
            x = rms(h, self.eps) * m.w(p + "attn_norm.weight")
            o = self.attn(il, x, pos)
            o = rms(o, post_eps) * m.w(p + "post_attention_norm.weight")
            f_in = o + h
            y = rms(f_in, self.eps) * m.w(p + "ffn_norm.weight")
            gt = mm(y, m.w(p + "ffn_gate.weight"), self.s_unused(p + "ffn_gate"))
            up = mm(y, m.w(p + "ffn_up.weight"), self.s_unused(p + "ffn_up"))
            y = mm(silu(gt) * up, m.w(p + "ffn_down.weight"), self.s_unused(p + "ffn_down"))
            y = rms(y, post_eps) * m.w(p + "post_ffw_norm.weight")
            h = y + f_in
        h = rms(h, self.eps) * m.w("output_norm.weight")
        z = mm(h, m.w("output.weight"))
        c = self.softcap
        if self.ab == "softcap-order" and c:
            return c * np.tanh(z / c) * self.logit_scale
        z = z * self.logit_scale
        if c:
            z = c * np.tanh(z / c)
        return z


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("golden")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--ablate", choices=sorted(ABLATIONS), help="break one spec rule on purpose")
    args = ap.parse_args()
    ref = Ref(Model(args.model), args.ablate)
    return check_golden(ref.forward, args.golden, args.rtol)


if __name__ == "__main__":
    sys.exit(main())
