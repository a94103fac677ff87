#!/usr/bin/env python3
"""Executable form of docs/families/glm5_next.md: a slow float64 numpy
forward pass of a glm5-next GGUF (mHC, KDA, NoPE MLA with k-pool DSA, sigmoid
MoE with clamped SwiGLU), checked against a golden written by
llama_goldens.py (llama.cpp). Small models only (test-llama-archs size).

    PYTHONPATH=tools/oracle:$LCP/vendor/llama.cpp/gguf-py \
    python3 tools/oracle/glm5_next_ref.py MODEL.gguf GOLDEN.json [--rtol 1e-4] [--ablate RULE]

Every position of prompt + greedy is recomputed. Pool-score ties are broken
as ggml's CPU top_k breaks them (libstdc++ partial_sort, libstdcxx_top_k in
qwen4exp_ref.py). --ablate breaks one rule on purpose; see ABLATIONS.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from oracle_common import Model, check_golden, layer_norm, rms, sigmoid, silu, softmax, softplus
from qwen4exp_ref import libstdcxx_top_k

L2_EPS = 1e-6  # glm5-next.cpp:738, a constant

ABLATIONS = {
    "pre-eps": "drop the + hc_eps on the mHC pre weights",
    "post-2": "post weights without the factor 2",
    "sinkhorn-1": "one Sinkhorn pass fewer",
    "comb-transpose": "mix streams with comb transposed (src/dst swapped)",
    "kda-value-decay": "KDA decay along the value channel (the unfused 1-token graph)",
    "kda-no-lb": "ignore kda.gate_lower_bound (softplus form)",
    "no-tail": "do not attend the incomplete tail pool",
    "pool-first": "take the first visible pools instead of the top-scoring ones",
    "bias-weights": "weight the experts by the biased selection scores",
    "clamp-generic": "generic clamp (clamp silu output) instead of the DSV4 one",
    "scales": "apply the .scale tensors that llama.cpp ignores for this arch",
}


def arr(v, n):
    return list(v) if isinstance(v, list) else [v] * n


class Ref:
    def __init__(self, m: Model, ablate: str | None = None):
        self.m, self.ab = m, ablate
        k = m.k
        self.E = k("embedding_length")
        self.n_layer = k("block_count") - (k("nextn_predict_layers", 0) or 0)
        self.eps = k("attention.layer_norm_rms_epsilon")
        self.eps_ln = k("attention.layer_norm_epsilon", 0.0)
        nh = k("attention.head_count")
        self.H = nh[0] if isinstance(nh, list) else nh
        self.head_kv = arr(k("attention.head_count_kv"), self.n_layer)
        self.dk = k("attention.key_length_mla")
        self.dv = k("attention.value_length_mla")
        self.S = k("kda.head_dim")
        self.d_conv = k("ssm.conv_kernel")
        self.lb = k("kda.gate_lower_bound")
        self.hc = k("hyper_connection.count")
        self.n_iter = k("hyper_connection.sinkhorn_iterations")
        self.hc_eps = k("hyper_connection.epsilon")
        self.n_dense = k("leading_dense_block_count", 0)
        self.n_used = arr(k("expert_used_count"), self.n_layer)
        self.w_norm = bool(k("expert_weights_norm", False))
        self.w_scale = k("expert_weights_scale", 0.0)
        gf = k("expert_gating_func", 0)
        assert gf in (0, 2), f"expert_gating_func {gf}: this reference implements sigmoid only"
        self.clamp_exp = arr(k("swiglu_clamp_exp", 0.0), self.n_layer)
        self.clamp_sh = arr(k("swiglu_clamp_shexp", k("swiglu_clamp_exp", 0.0)), self.n_layer)
        self.nh_i = k("attention.indexer.head_count")
        self.di = k("attention.indexer.key_length")
        self.top_k = k("attention.indexer.top_k")
        self.kpool = k("attention.indexer.kpool")
        self.tail = bool(k("attention.indexer.kpool_select_tail", False)) and self.ab != "no-tail"
        self.idx_full = [bool(v) for v in arr(k("attention.indexer.types", 1), self.n_layer)]
        assert self.hc == 4

    def w(self, name):
        return self.m.w(name)

    def mm(self, x, name):
        y = x @ self.w(name + ".weight").T
        s = self.m.opt(name + ".scale") if self.ab == "scales" else None
        return y if s is None else y * s.reshape(-1)[0]

    # ---- mHC
    def hc_pre(self, R, p):
        T, hc, E = R.shape
        flat = rms(R.reshape(T, hc * E), self.eps)
        mix = flat @ self.w(p + "_fn.weight").T                  # (T, 24)
        sc = self.w(p + "_scale.weight").reshape(-1)
        base = self.w(p + "_base.weight").reshape(-1)
        pre = sigmoid(mix[:, :hc] * sc[0] + base[:hc])
        if self.ab != "pre-eps":
            pre = pre + self.hc_eps
        post = sigmoid(mix[:, hc:2 * hc] * sc[1] + base[hc:2 * hc])
        if self.ab != "post-2":
            post = post * 2.0
        A = (mix[:, 2 * hc:] * sc[2] + base[2 * hc:]).reshape(T, hc, hc)   # [t, src, dst]
        A = softmax(A, axis=2) + self.hc_eps
        eps = self.hc_eps

        def norm_cols(A):   # for each dst: sum over src
            return A / (A.sum(axis=1, keepdims=True) + eps)

        def norm_rows(A):   # for each src: sum over dst
            return A / (A.sum(axis=2, keepdims=True) + eps)

        A = norm_cols(A)
        n = self.n_iter - (1 if self.ab == "sinkhorn-1" else 0)
        for _ in range(1, n):
            A = norm_cols(norm_rows(A))
        comb = np.transpose(A, (0, 2, 1))                          # [t, dst, src]
        if self.ab == "comb-transpose":
            comb = A
        x = np.einsum("tc,tce->te", pre, R)
        return x, post, comb

    @staticmethod
    def hc_post(y, R, post, comb):
        return y[:, None, :] * post[:, :, None] + np.einsum("tds,tse->tde", comb, R)

    # ---- KDA
    def kda(self, il, x):
        p = f"blk.{il}."
        T = x.shape[0]
        H, S, dc = self.H, self.S, self.d_conv

        def conv(wname, cname):
            u = self.mm(x, p + wname)                              # (T, d_inner)
            w = self.w(p + cname + ".weight").reshape(H * S, dc)   # [ch, j]
            up = np.concatenate([np.zeros((dc - 1, H * S)), u], axis=0)
            c = np.zeros_like(u)
            for j in range(dc):
                c += up[j:j + T] * w[:, j]
            return silu(c).reshape(T, H, S)

        q, k, v = conv("attn_q", "ssm_conv1d_q"), conv("attn_k", "ssm_conv1d_k"), conv("attn_v", "ssm_conv1d_v")
        g1 = (x @ self.w(p + "ssm_f_a.weight").T) @ self.w(p + "ssm_f_b.weight").T + self.w(p + "ssm_dt.bias")
        g1 = g1.reshape(T, H, S)
        A = self.w(p + "ssm_a").reshape(1, H, 1)
        if self.lb is not None and np.isfinite(self.lb) and self.ab != "kda-no-lb":
            g = self.lb * sigmoid(-(g1 * A))
        else:
            g = softplus(g1) * A
        beta = sigmoid(x @ self.w(p + "ssm_beta.weight").reshape(H, -1).T)   # (T, H); {E, 1} may be stored 1-D
        q = q / np.sqrt(np.sum(q * q, axis=-1, keepdims=True) + L2_EPS)
        k = k / np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + L2_EPS)
        o = np.zeros((T, H, S))
        for h in range(H):
            St = np.zeros((S, S))                                  # [key i, value j]
            for t in range(T):
                dec = np.exp(g[t, h])
                St = St * (dec[None, :] if self.ab == "kda-value-decay" else dec[:, None])
                delta = (v[t, h] - St.T @ k[t, h]) * beta[t, h]
                St = St + np.outer(k[t, h], delta)
                o[t, h] = (St.T @ q[t, h]) / np.sqrt(S)
        g2 = ((x @ self.w(p + "ssm_g_a.weight").T) @ self.w(p + "ssm_g_b.weight").T).reshape(T, H, S)
        out = rms(o, self.eps) * self.w(p + "ssm_norm.weight") * sigmoid(g2)
        return self.mm(out.reshape(T, H * S), p + "attn_output")

    # ---- MLA + k-pool DSA
    def select(self, il, x, qr, n_prefill):
        """Per query position: the set of attended cells."""
        p = f"blk.{il}."
        T, kp = x.shape[0], self.kpool
        ik = layer_norm(x @ self.w(p + "indexer.attn_k.weight").T, self.eps_ln)
        ik = ik * self.w(p + "indexer.k_norm.weight") + self.w(p + "indexer.k_norm.bias")
        ig = x @ self.w(p + "indexer_compressor_gate.weight").T
        ape = self.w(p + "indexer_compressor_ape.weight")          # (kpool, di)
        n_pools = T // kp
        pooled = np.zeros((n_pools, self.di))
        for b in range(n_pools):
            sl = slice(b * kp, (b + 1) * kp)
            pr = softmax(ig[sl] + ape, axis=0)
            pooled[b] = np.sum(pr * ik[sl], axis=0)
        iq = (qr @ self.w(p + "indexer.attn_q_b.weight").T).reshape(T, self.nh_i, self.di)
        wt = (x @ self.w(p + "indexer.proj.weight").T) / np.sqrt(self.di * self.nh_i)
        sels = []
        for t in range(T):
            nv = (t + 1) // kp
            n_real = (n_prefill // kp) if t < n_prefill else nv
            n_pool = max(64, -(-(n_real + 1) // 64) * 64)
            n_top = min(n_pool, self.top_k // kp)
            if nv <= n_top:
                live = list(range(nv))
            elif self.ab == "pool-first":
                live = list(range(n_top))
            else:
                row = np.full(n_pool, -np.inf)
                sc = np.maximum(iq[t] @ pooled[:nv].T, 0.0)        # (nh_i, nv)
                row[:nv] = wt[t] @ sc
                picked = libstdcxx_top_k(list(row), n_top)
                live = [b for b in picked if np.isfinite(row[b])]
            cells = set()
            for b in live:
                cells.update(range(b * kp, (b + 1) * kp))
            if self.tail:
                cells.update(t - j for j in range((t + 1) % kp))
            sels.append(sorted(c for c in cells if c <= t))
        return sels

    def mla(self, il, x, n_prefill, prev_sel):
        p = f"blk.{il}."
        T, H = x.shape[0], self.H
        qr = rms(x @ self.w(p + "attn_q_a.weight").T, self.eps) * self.w(p + "attn_q_a_norm.weight")
        q = (qr @ self.w(p + "attn_q_b.weight").T).reshape(T, H, self.dk)
        kv = rms(x @ self.w(p + "attn_kv_a_mqa.weight").T, self.eps) * self.w(p + "attn_kv_a_norm.weight")
        L = kv.shape[1]
        kb = self.w(p + "attn_k_b.weight").reshape(H, L, self.dk)  # ggml {dk, L, H}; a trailing 1 may be dropped
        vb = self.w(p + "attn_v_b.weight").reshape(H, self.dv, L)  # ggml {L, dv, H}
        qa = np.einsum("hld,thd->thl", kb, q)
        if self.idx_full[il]:
            sel = self.select(il, x, qr, n_prefill)
        else:
            assert prev_sel is not None, "shared indexer layer before any full one"
            sel = prev_sel
        out = np.zeros((T, H, self.dv))
        for t in range(T):
            js = np.asarray(sel[t], dtype=int)
            if js.size == 0:    # only reachable with --ablate no-tail (p = 0 sees nothing)
                continue
            s = (qa[t] @ kv[js].T) / np.sqrt(self.dk)              # (H, n)
            lat = softmax(s, axis=1) @ kv[js]                       # (H, L)
            out[t] = np.einsum("hel,hl->he", vb, lat)
        return self.mm(out.reshape(T, H * self.dv), p + "attn_output"), sel

    # ---- FFN
    def swiglu(self, g, u, limit):
        if limit > 1e-6:
            if self.ab == "clamp-generic":
                return np.minimum(silu(g), limit) * np.clip(u, -limit, limit)
            g = np.minimum(g, limit)
            u = np.clip(u, -limit, limit)
        return silu(g) * u

    def ffn(self, il, x):
        p = f"blk.{il}."
        if il < self.n_dense:
            return self.mm(self.swiglu(self.mm(x, p + "ffn_gate"), self.mm(x, p + "ffn_up"), self.clamp_sh[il]),
                           p + "ffn_down")
        logits = x @ self.w(p + "ffn_gate_inp.weight").T
        pr = sigmoid(logits)
        biased = pr + self.w(p + "exp_probs_b.bias")
        ge, ue, de = (self.w(p + n) for n in ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"))
        k = self.n_used[il]
        out = np.zeros_like(x)
        for t in range(x.shape[0]):
            sel = np.argsort(-biased[t], kind="stable")[:k]
            wts = (biased if self.ab == "bias-weights" else pr)[t, sel]
            if self.w_norm:
                wts = wts / max(wts.sum(), 6.103515625e-5)
            if self.w_scale not in (0.0, 1.0):
                wts = wts * self.w_scale
            for e, we in zip(sel, wts):
                a = self.swiglu(ge[e] @ x[t], ue[e] @ x[t], self.clamp_exp[il])
                out[t] += we * (de[e] @ a)
        sh = self.mm(self.swiglu(self.mm(x, p + "ffn_gate_shexp"), self.mm(x, p + "ffn_up_shexp"), self.clamp_sh[il]),
                     p + "ffn_down_shexp")
        return out + sh

    def forward(self, tokens, n_prefill):
        m = self.m
        e = m.w("token_embd.weight")[np.asarray(tokens)]
        R = np.repeat(e[:, None, :], self.hc, axis=1)
        prev_sel = None
        for il in range(self.n_layer):
            p = f"blk.{il}."
            x, post, comb = self.hc_pre(R, p + "hc_attn")
            x = rms(x, self.eps) * m.w(p + "attn_norm.weight")
            if self.head_kv[il] == 0:
                y = self.kda(il, x)
            else:
                y, prev_sel = self.mla(il, x, n_prefill, prev_sel)
            R = self.hc_post(y, R, post, comb)
            x, post, comb = self.hc_pre(R, p + "hc_ffn")
            x = rms(x, self.eps) * m.w(p + "ffn_norm.weight")
            R = self.hc_post(self.ffn(il, x), R, post, comb)
        h = rms(R.mean(axis=1), self.eps) * m.w("output_norm.weight")
        return h @ m.w("output.weight").T


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("golden")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--ablate", choices=sorted(ABLATIONS), help="break one spec rule on purpose")
    args = ap.parse_args()
    m = Model(args.model)
    ref = Ref(m, args.ablate)
    n_prefill = len(json.load(open(args.golden))["prompt"])
    return check_golden(lambda toks: ref.forward(toks, n_prefill), args.golden, args.rtol)


if __name__ == "__main__":
    sys.exit(main())
