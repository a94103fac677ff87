#!/usr/bin/env python3
"""Small glm-dsa GGUF fixtures that cover what test-llama-archs' model does
not: sparse indexer selection, "shared" indexer layers, several experts with a
selection bias, weight normalisation and scale, an MTP block, the public
file's quirks, and mixed ggml types. See docs/families/glm_moe_dsa.md.

    python3 tools/oracle/glmdsa_fixture.py PROFILE OUT.gguf

Profiles:
  public   Shaped like the public GLM-5.x file, scaled down: no
           attention.indexer.types key and context_length 2^20, so the types
           come from llama.cpp's GLM-5.2 default table (layers 0-2 full, 3-5
           shared); indexer tensors on every block, shared ones included; an
           MTP block (blk.6, nextn.*) after 6 trunk layers; 1 leading dense
           block; 8 experts top-2 with exp_probs_b, norm on, scale 2.5;
           indexer top_k 5 (sparse from the 6th token); F32/F16/Q8_0 mix.
           kv_lora + n_rot (80) differs from key_length_mla (48), so the
           attention scale is pinned.
  public-f32  The same model with every tensor F32: ggml rounds the
           activations of F16/Q8_0 matmuls (to F16 / Q8_0 blocks), and the
           indexer's top-k and the expert choice turn that rounding into
           O(1) logit changes, so an implementation that dequantizes and
           runs f32 matches this file's goldens, not the mixed one's, unless
           it rounds activations the way ggml does.
  explicit An explicit attention.indexer.types = [1, 0, 1, 0] (u32), 4
           layers, no MTP, norm off and no scale key (raw sigmoid weights),
           top_k 3, per-tensor .scale tensors, all F32.

Weights come from numpy's PCG64 with a fixed seed, so the file is the same
on every platform (unlike test-llama-archs, whose weights depend on
libstdc++'s std::hash). Activations stay O(1): matrices N(0, 1/fan_in),
gammas 1 + N(0, 0.2).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

ARCH = "glm-dsa"

PROFILES = {
    "public": dict(
        seed=1603, n_vocab=256, E=64, H=2, q_lora=64, kv_lora=64, rope=16, nope=32, v_head=32,
        n_layer=6, n_nextn=1, n_dense=1, n_ff=96, n_expert=8, n_used=2, n_ff_exp=32,
        idx_heads=4, idx_dim=64, top_k=5, ctx=1 << 20, indexer_types=None,
        norm=True, scale=2.5, probs_bias=True, scales=False, freq_base=10000.0, mixed=True,
    ),
    "public-f32": None,  # "public" with every tensor F32 (same seed, same values before rounding)
    "explicit": dict(
        seed=1604, n_vocab=256, E=64, H=2, q_lora=64, kv_lora=64, rope=16, nope=32, v_head=32,
        n_layer=4, n_nextn=0, n_dense=1, n_ff=96, n_expert=4, n_used=2, n_ff_exp=32,
        idx_heads=4, idx_dim=64, top_k=3, ctx=4096, indexer_types=[1, 0, 1, 0],
        norm=False, scale=None, probs_bias=True, scales=True, freq_base=10000.0, mixed=False,
    ),
}

# GLM-5.2 default indexer types (glm-dsa.cpp:6-27), for the record only
DEFAULT_TYPES_FIRST = [1, 1] + [1, 0, 0, 0] * 19


def build(profile: str, out: str) -> None:
    import gguf
    from gguf.quants import quantize

    p = PROFILES[profile] or dict(PROFILES["public"], mixed=False)
    rng = np.random.default_rng(p["seed"])
    T = gguf.GGMLQuantizationType
    E, H = p["E"], p["H"]
    Dk = p["nope"] + p["rope"]
    n_layer_all = p["n_layer"] + p["n_nextn"]

    w = gguf.GGUFWriter(out, ARCH)
    w.add_uint32(f"{ARCH}.context_length", p["ctx"])
    w.add_uint32(f"{ARCH}.embedding_length", E)
    w.add_uint32(f"{ARCH}.block_count", n_layer_all)
    if p["n_nextn"]:
        w.add_uint32(f"{ARCH}.nextn_predict_layers", p["n_nextn"])
    w.add_uint32(f"{ARCH}.feed_forward_length", p["n_ff"])
    w.add_uint32(f"{ARCH}.expert_feed_forward_length", p["n_ff_exp"])
    w.add_uint32(f"{ARCH}.expert_count", p["n_expert"])
    w.add_uint32(f"{ARCH}.expert_used_count", p["n_used"])
    w.add_uint32(f"{ARCH}.expert_shared_count", 1)
    w.add_uint32(f"{ARCH}.leading_dense_block_count", p["n_dense"])
    if p["scale"] is not None:
        w.add_float32(f"{ARCH}.expert_weights_scale", p["scale"])
    if p["norm"]:
        w.add_bool(f"{ARCH}.expert_weights_norm", True)
    w.add_uint32(f"{ARCH}.expert_gating_func", 2)
    w.add_uint32(f"{ARCH}.attention.head_count", H)
    w.add_uint32(f"{ARCH}.attention.head_count_kv", 1)
    w.add_uint32(f"{ARCH}.attention.key_length", p["kv_lora"] + p["rope"])
    w.add_uint32(f"{ARCH}.attention.value_length", p["kv_lora"])
    w.add_uint32(f"{ARCH}.attention.key_length_mla", Dk)
    w.add_uint32(f"{ARCH}.attention.value_length_mla", p["v_head"])
    w.add_uint32(f"{ARCH}.attention.q_lora_rank", p["q_lora"])
    w.add_uint32(f"{ARCH}.attention.kv_lora_rank", p["kv_lora"])
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32(f"{ARCH}.rope.dimension_count", p["rope"])
    w.add_float32(f"{ARCH}.rope.freq_base", p["freq_base"])
    w.add_uint32(f"{ARCH}.attention.indexer.head_count", p["idx_heads"])
    w.add_uint32(f"{ARCH}.attention.indexer.key_length", p["idx_dim"])
    w.add_uint32(f"{ARCH}.attention.indexer.top_k", p["top_k"])
    if p["indexer_types"] is not None:
        w.add_array(f"{ARCH}.attention.indexer.types", [int(v) for v in p["indexer_types"]])
    w.add_string("tokenizer.ggml.model", "test")
    w.add_array("tokenizer.ggml.tokens", [f"tok_{i}" for i in range(p["n_vocab"])])
    w.add_array("tokenizer.ggml.scores", [0.0] * p["n_vocab"])

    def mat(*shape, fan_in, gain=1.0):
        return (rng.standard_normal(shape) * (gain / np.sqrt(fan_in))).astype(np.float32)

    def gamma(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    def put(name, a, ty=T.F32):
        if not p["mixed"]:
            ty = T.F32
        if ty == T.F32:
            w.add_tensor(name, a.astype(np.float32))
        elif ty == T.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            w.add_tensor(name, quantize(a.astype(np.float32), ty), raw_dtype=ty)

    # numpy shapes are torch order: (out, in) for {in, out}
    put("token_embd.weight", rng.standard_normal((p["n_vocab"], E)).astype(np.float32), T.Q8_0)
    put("output_norm.weight", gamma(E))
    put("output.weight", mat(p["n_vocab"], E, fan_in=E, gain=3.0), T.F16)

    for il in range(n_layer_all):
        b = f"blk.{il}."
        put(b + "attn_norm.weight", gamma(E))
        put(b + "attn_q_a.weight", mat(p["q_lora"], E, fan_in=E), T.Q8_0)
        put(b + "attn_q_a_norm.weight", gamma(p["q_lora"]))
        put(b + "attn_q_b.weight", mat(H * Dk, p["q_lora"], fan_in=p["q_lora"]), T.F16)
        put(b + "attn_kv_a_mqa.weight", mat(p["kv_lora"] + p["rope"], E, fan_in=E), T.Q8_0)
        put(b + "attn_kv_a_norm.weight", gamma(p["kv_lora"]))
        # k_b {nope, kv_lora, H} -> numpy (H, kv_lora, nope); v_b {kv_lora, v, H} -> (H, v, kv_lora)
        put(b + "attn_k_b.weight", mat(H, p["kv_lora"], p["nope"], fan_in=p["nope"], gain=2.0), T.F16)
        put(b + "attn_v_b.weight", mat(H, p["v_head"], p["kv_lora"], fan_in=p["kv_lora"]), T.Q8_0)
        put(b + "attn_output.weight", mat(E, H * p["v_head"], fan_in=H * p["v_head"]), T.Q8_0)
        put(b + "ffn_norm.weight", gamma(E))
        # indexer on every block, shared and MTP ones too (the public file's quirk)
        put(b + "indexer.attn_q_b.weight",
            mat(p["idx_heads"] * p["idx_dim"], p["q_lora"], fan_in=p["q_lora"], gain=2.0), T.F16)
        put(b + "indexer.attn_k.weight", mat(p["idx_dim"], E, fan_in=E, gain=2.0), T.F16)
        put(b + "indexer.k_norm.weight", gamma(p["idx_dim"]))
        put(b + "indexer.k_norm.bias", (0.2 * rng.standard_normal(p["idx_dim"])).astype(np.float32))
        put(b + "indexer.proj.weight", mat(p["idx_heads"], E, fan_in=E, gain=4.0))
        if il < p["n_dense"]:
            put(b + "ffn_gate.weight", mat(p["n_ff"], E, fan_in=E), T.F16)
            put(b + "ffn_up.weight", mat(p["n_ff"], E, fan_in=E), T.F16)
            put(b + "ffn_down.weight", mat(E, p["n_ff"], fan_in=p["n_ff"]), T.Q8_0)
        else:
            ne, nf = p["n_expert"], p["n_ff_exp"]
            put(b + "ffn_gate_inp.weight", mat(ne, E, fan_in=E, gain=2.0))
            if p["probs_bias"]:
                put(b + "exp_probs_b.bias", (0.3 * rng.standard_normal(ne)).astype(np.float32))
            put(b + "ffn_gate_exps.weight", mat(ne, nf, E, fan_in=E), T.Q8_0)
            put(b + "ffn_up_exps.weight", mat(ne, nf, E, fan_in=E), T.F16)
            put(b + "ffn_down_exps.weight", mat(ne, E, nf, fan_in=nf, gain=2.0), T.Q8_0)
            put(b + "ffn_gate_shexp.weight", mat(nf, E, fan_in=E), T.F16)
            put(b + "ffn_up_shexp.weight", mat(nf, E, fan_in=E), T.F16)
            put(b + "ffn_down_shexp.weight", mat(E, nf, fan_in=nf), T.Q8_0)
            if p["scales"]:
                put(b + "ffn_down_exps.scale", (1.0 + 0.3 * rng.standard_normal(ne)).astype(np.float32))
                put(b + "ffn_up_shexp.scale", np.array([0.7], dtype=np.float32))
        if p["scales"]:
            put(b + "attn_output.scale", np.array([1.3], dtype=np.float32))
        if il >= p["n_layer"]:
            put(b + "nextn.eh_proj.weight", mat(E, 2 * E, fan_in=2 * E), T.F16)
            put(b + "nextn.enorm.weight", gamma(E))
            put(b + "nextn.hnorm.weight", gamma(E))
            put(b + "nextn.shared_head_norm.weight", gamma(E))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", choices=sorted(PROFILES))
    ap.add_argument("out")
    args = ap.parse_args()
    build(args.profile, args.out)
    print(f"wrote {args.out} ({args.profile})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
