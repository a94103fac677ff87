#!/usr/bin/env python3
"""Executable form of docs/families/glm_moe_dsa.md: a slow numpy (float64)
forward pass of a glm-dsa GGUF, checked against goldens written by
goldens.py (llama.cpp). It validates the spec; small models only.

    python3 tools/oracle/glmdsa_ref.py MODEL.gguf GOLDEN.json [--rtol 1e-4]
        [--no-act-quant] [--ablate NAME]

Every position is checked: the prompt's prefill rows (if the golden has
prefill_logits) and every greedy step. The error is reported relative to the
largest |logit| of the golden (exit 0 iff within --rtol).

ggml's CPU matmul rounds the activations to the weight's vec_dot type (F16
for F16 weights, Q8_0 blocks for Q8_0 weights); this reference does the same
(--no-act-quant turns it off, to show how much it matters). Other types are
dequantized and run in float64 without activation rounding.

--ablate breaks one rule of the spec, to show the goldens catch it:
  no_bias       experts picked by sigmoid(router) without exp_probs_b
  biased_weights  weights taken from the biased scores
  no_norm       skip the weight normalisation
  no_scale      skip expert_weights_scale
  no_shared     skip the shared expert
  dense_attn    ignore the indexer selection (dense causal MLA)
  fresh_shared  recompute the indexer on shared layers instead of reusing
  ln_eps        indexer k_norm with eps 1e-6 instead of 0
  neox_rope     NEOX pairs instead of interleaved (NORM) rope
  rope_last     rope the LAST n_rot dims of the indexer heads
  scale_kvl     kq scale 1/sqrt(kv_lora + n_rot) instead of 1/sqrt(key_length_mla)
  lowest_ties   tie order: lowest index wins instead of libstdc++'s heap
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen4exp_ref import Model, libstdcxx_top_k, rms, sigmoid, silu  # noqa: E402

ARCH = "glm-dsa"
# glm-dsa.cpp:6-27
GLM_5_2_DEFAULT_INDEXER_TYPES = [1, 1] + [1, 0, 0, 0] * 19


class GlmModel(Model):
    def __init__(self, path: str):
        super().__init__(path)
        import gguf
        self.types = {t.name: t.tensor_type for t in self.r.tensors}
        self.Q = gguf.GGMLQuantizationType

    def k(self, key, default=None):
        return self.kv.get(f"{ARCH}." + key, default)


def f16(x):
    return x.astype(np.float16).astype(np.float64)


def q8_0_act(x):
    """quantize_row_q8_0 (x86 AVX path, ggml-cpu/arch/x86/quants.c) then
    dequantize: blocks of 32, d = amax/127 stored as f16,
    q = round_half_even(x * (127/amax)) in f32."""
    sh = x.shape
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.max(np.abs(b), axis=1, keepdims=True)
    d = amax / np.float32(127.0)
    inv = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(b * inv)
    return (q * d.astype(np.float16).astype(np.float64)).reshape(sh)


class Ref:
    def __init__(self, m: GlmModel, act_quant=True, ablate=None):
        self.m, self.act_quant, self.ab = m, act_quant, ablate
        k = m.k
        self.E = k("embedding_length")
        self.n_layer = k("block_count") - (k("nextn_predict_layers", 0) or 0)
        self.eps = k("attention.layer_norm_rms_epsilon")
        self.H = k("attention.head_count")
        self.Dk = k("attention.key_length_mla")
        self.Dv = k("attention.value_length_mla")
        self.kv_lora = k("attention.kv_lora_rank")
        self.R = k("rope.dimension_count")
        self.Dn = self.Dk - self.R
        self.base = k("rope.freq_base", 10000.0)
        self.n_dense = k("leading_dense_block_count", 0)
        self.n_used = k("expert_used_count")
        self.n_shared = k("expert_shared_count")
        self.w_scale = k("expert_weights_scale", 0.0)
        self.w_norm = bool(k("expert_weights_norm", False))
        gf = k("expert_gating_func", 0)
        if gf not in (0, 2):
            raise SystemExit(f"expert_gating_func {gf}: only sigmoid is implemented here")
        self.Hi = k("attention.indexer.head_count")
        self.Di = k("attention.indexer.key_length")
        self.top_k = k("attention.indexer.top_k")
        types = k("attention.indexer.types")
        if types is None:
            ctx = k("context_length")
            full = [1] * self.n_layer if ctx < 1048576 else (GLM_5_2_DEFAULT_INDEXER_TYPES + [0] * 512)[: self.n_layer]
        elif isinstance(types, list):
            full = [int(bool(v)) for v in types]
        else:
            full = [int(bool(types))] * self.n_layer
        self.is_full = full
        self.kq_scale = 1.0 / np.sqrt(self.Dk if ablate != "scale_kvl" else self.kv_lora + self.R)

    # -- primitives
    def w(self, name):
        return self.m.w(name)

    def mm(self, x, name, scale_name=None):
        """x (..., in) @ W^T with the oracle's activation rounding."""
        W = self.m.w(name)  # (out, in)
        y = self.act(x, name) @ W.T
        s = self.m.opt(scale_name or (name[: -len(".weight")] + ".scale"))
        if s is not None:
            y = y * s.reshape(-1)[0]
        return y

    def act(self, x, name):
        ty = self.m.types[name]
        if self.act_quant:
            if ty == self.m.Q.F16:
                return f16(x)
            if ty == self.m.Q.Q8_0:
                return q8_0_act(x)
        return x

    def rope(self, x, pos, n_rot, first=True):
        """ROPE_NORM: interleaved pairs (2i, 2i+1) of n_rot dims; pos (T,)."""
        x = x.copy()
        i = np.arange(n_rot // 2)
        theta = pos.reshape(-1, *([1] * (x.ndim - 1)))[..., 0:1] * self.base ** (-2.0 * i / n_rot)
        c, s = np.cos(theta), np.sin(theta)
        off = 0 if first else x.shape[-1] - n_rot
        seg = x[..., off:off + n_rot]
        if self.ab == "neox_rope":
            h = n_rot // 2
            x0, x1 = seg[..., :h].copy(), seg[..., h:].copy()
            seg[..., :h] = x0 * c - x1 * s
            seg[..., h:] = x0 * s + x1 * c
        else:
            x0, x1 = seg[..., 0::2].copy(), seg[..., 1::2].copy()
            seg[..., 0::2] = x0 * c - x1 * s
            seg[..., 1::2] = x0 * s + x1 * c
        x[..., off:off + n_rot] = seg
        return x

    # -- blocks
    def indexer(self, il, h, qr, pos):
        b = f"blk.{il}."
        T = h.shape[0]
        qi = self.mm(qr, b + "indexer.attn_q_b.weight").reshape(T, self.Hi, self.Di)
        first = self.ab != "rope_last"
        qi = self.rope(qi, pos, self.R, first)
        ki = self.mm(h, b + "indexer.attn_k.weight")
        mu = ki.mean(-1, keepdims=True)
        var = ((ki - mu) ** 2).mean(-1, keepdims=True)
        eps = 1e-6 if self.ab == "ln_eps" else 0.0
        ki = (ki - mu) / np.sqrt(var + eps) * self.w(b + "indexer.k_norm.weight")
        kb = self.m.opt(b + "indexer.k_norm.bias")
        if kb is not None:
            ki = ki + kb
        ki = self.rope(ki, pos, self.R, first)
        wts = self.mm(h, b + "indexer.proj.weight") / np.sqrt(self.Di * self.Hi)  # (T, Hi)
        dots = np.einsum("thd,jd->thj", qi, ki)
        score = np.einsum("thj,th->tj", np.maximum(dots, 0.0), wts)
        sel = np.zeros((T, T), dtype=bool)
        for t in range(T):
            row = score[t, : t + 1].astype(np.float32)  # the oracle's scores are f32
            if self.ab == "lowest_ties":
                idx = np.argsort(-row, kind="stable")[: self.top_k]
            else:
                idx = libstdcxx_top_k(list(row), min(self.top_k, t + 1))
            sel[t, list(idx)] = True
        return sel, score

    def attention(self, il, h, pos, prev_sel):
        b = f"blk.{il}."
        T, H = h.shape[0], self.H
        qr = rms(self.mm(h, b + "attn_q_a.weight"), self.eps) * self.w(b + "attn_q_a_norm.weight")
        if self.is_full[il] or self.ab == "fresh_shared":
            sel, _ = self.indexer(il, h, qr, pos)
        else:
            if prev_sel is None:
                raise SystemExit(f"layer {il} is shared but no earlier layer is full")
            sel = prev_sel
        if self.ab == "dense_attn":
            sel = np.tril(np.ones((T, T), dtype=bool))
        q = self.mm(qr, b + "attn_q_b.weight").reshape(T, H, self.Dk)
        q_nope, q_pe = q[..., : self.Dn], q[..., self.Dn:]
        kvp = self.mm(h, b + "attn_kv_a_mqa.weight")
        c = rms(kvp[:, : self.kv_lora], self.eps) * self.w(b + "attn_kv_a_norm.weight")
        k_pe = kvp[:, self.kv_lora:]
        q_pe = self.rope(q_pe, pos, self.R)
        k_pe = self.rope(k_pe, pos, self.R)
        kb = self.w(b + "attn_k_b.weight").reshape(H, self.kv_lora, self.Dn)
        qa = np.einsum("hri,thi->thr", kb, self.act(q_nope, b + "attn_k_b.weight"))
        s = (np.einsum("thr,jr->thj", qa, c) + np.einsum("thr,jr->thj", q_pe, k_pe)) * self.kq_scale
        causal = np.tril(np.ones((T, T), dtype=bool))
        mask = np.where(causal & sel, 0.0, -np.inf)
        s = s + mask[:, None, :]
        s = s - s.max(-1, keepdims=True)
        a = np.exp(s)
        a = a / a.sum(-1, keepdims=True)
        o = np.einsum("thj,jr->thr", a, c)
        vb = self.w(b + "attn_v_b.weight").reshape(H, self.Dv, self.kv_lora)
        u = np.einsum("hdr,thr->thd", vb, self.act(o, b + "attn_v_b.weight"))
        out = self.mm(u.reshape(T, H * self.Dv), b + "attn_output.weight")
        return out, sel

    def ffn(self, b, h, kind):
        g = self.mm(h, b + f"ffn_gate{kind}.weight")
        u = self.mm(h, b + f"ffn_up{kind}.weight")
        return self.mm(silu(g) * u, b + f"ffn_down{kind}.weight")

    def moe(self, il, h):
        b = f"blk.{il}."
        T = h.shape[0]
        logits = self.mm(h, b + "ffn_gate_inp.weight")
        probs = sigmoid(logits)
        bias = self.m.opt(b + "exp_probs_b.bias")
        sel_sc = probs + bias if (bias is not None and self.ab != "no_bias") else probs
        gate = self.w(b + "ffn_gate_exps.weight")  # (n_expert, n_ff_exp, E)
        up = self.w(b + "ffn_up_exps.weight")
        down = self.w(b + "ffn_down_exps.weight")  # (n_expert, E, n_ff_exp)
        sc = {n: self.m.opt(b + f"ffn_{n}_exps.scale") for n in ("gate", "up", "down")}
        tg, tu, td = (self.m.types[b + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
        out = np.zeros_like(h)
        for t in range(T):
            picks = np.argsort(-sel_sc[t].astype(np.float32), kind="stable")[: self.n_used]
            wts = (sel_sc if self.ab == "biased_weights" else probs)[t, picks]
            if self.w_norm and self.ab != "no_norm":
                wts = wts / max(wts.sum(), 6.103515625e-5)
            if self.w_scale not in (0.0, 1.0) and self.ab != "no_scale":
                wts = wts * self.w_scale
            for e, we in zip(picks, wts):
                x = h[t]
                gx = self._act_ty(x, tg) @ gate[e].T
                ux = self._act_ty(x, tu) @ up[e].T
                if sc["gate"] is not None:
                    gx = gx * sc["gate"][e]
                if sc["up"] is not None:
                    ux = ux * sc["up"][e]
                y = self._act_ty(silu(gx) * ux, td) @ down[e].T
                if sc["down"] is not None:
                    y = y * sc["down"][e]
                out[t] += we * y
        if self.ab != "no_shared":
            out = out + self.ffn(b, h, "_shexp")
        return out

    def _act_ty(self, x, ty):
        if self.act_quant:
            if ty == self.m.Q.F16:
                return f16(x)
            if ty == self.m.Q.Q8_0:
                return q8_0_act(x)
        return x

    def forward(self, tokens):
        tokens = np.asarray(tokens)
        pos = np.arange(len(tokens), dtype=np.float64)
        x = self.w("token_embd.weight")[tokens].copy()
        prev_sel = None
        for il in range(self.n_layer):
            b = f"blk.{il}."
            h = rms(x, self.eps) * self.w(b + "attn_norm.weight")
            a, sel = self.attention(il, h, pos, prev_sel)
            if self.is_full[il]:
                prev_sel = sel
            x = x + a
            h = rms(x, self.eps) * self.w(b + "ffn_norm.weight")
            f = self.ffn(b, h, "") if il < self.n_dense else self.moe(il, h)
            x = x + f
        h = rms(x, self.eps) * self.w("output_norm.weight")
        name = "output.weight" if self.m.opt("output.weight") is not None else "token_embd.weight"
        return self.mm(h, name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("golden")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--no-act-quant", action="store_true")
    ap.add_argument("--ablate", default=None)
    args = ap.parse_args()

    g = json.load(open(args.golden))
    if g.get("step_logits_format", "full") != "full":
        raise SystemExit("golden stores top-N rows; rerun goldens.py without --top")
    m = GlmModel(args.model)
    ref = Ref(m, act_quant=not args.no_act_quant, ablate=args.ablate)
    prompt, greedy = g["prompt"], g["greedy"]
    seq = list(prompt) + list(greedy[:-1])
    L = ref.forward(seq)
    P = len(prompt)
    rows, want = [], []
    if g.get("prefill_logits"):
        for i, r in enumerate(g["prefill_logits"]):
            rows.append(L[i]); want.append(r)
    for i, r in enumerate(g["step_logits"]):
        rows.append(L[P - 1 + i]); want.append(r)
    got, want = np.array(rows), np.array(want, dtype=np.float64)
    diff = np.abs(got - want)
    scale = np.max(np.abs(want))
    worst = float(diff.max())
    greedy_ref = [int(np.argmax(L[P - 1 + i])) for i in range(len(greedy))]
    print(f"{args.model}: {len(rows)} rows, max |diff| {worst:.3e}, max |logit| {scale:.3f}, "
          f"rel {worst / scale:.2e}; greedy {'same' if greedy_ref == greedy else 'DIFFERENT'}; "
          f"indexer types {ref.is_full}")
    ok = worst <= args.rtol * scale and greedy_ref == greedy
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
