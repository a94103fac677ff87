#!/usr/bin/env python3
"""The public GLM-5.3 glm-dsa GGUF's metadata and tensor table, as JSON, for
a generator that writes a sparse GGUF (data left as holes) of the real shape.

    python3 tools/oracle/glmdsa_real_shape.py OUT.json

Sources (no public GGUF header was found; see
tests/data/glm_moe_dsa/README.md):
  * geometry: HF `GlmMoeDsaConfig` defaults (transformers glm_moe_dsa, the
    GLM-5 family: E 6144, 78 layers, 64 heads, q_lora 2048, kv_lora 512,
    qk_nope 192, qk_rope 64, v_head 256, 256 experts top-8, n_ff_exp 2048,
    n_ff 12288, 3 dense, scale 2.5, norm, sigmoid, indexer 32 x 128 top 2048,
    vocab 154880) and a published GLM-5.3 config.json excerpt
    (num_nextn_predict_layers 1, rope_theta 8e6, rms eps 1e-5, untied);
  * the GGUF layout: the converter (conversion/glm.py GlmMoeDsaModel and
    conversion/deepseek.py DeepseekV2Model.set_gguf_parameters) and the loader
    (src/models/glm-dsa.cpp:74-187);
  * families.md: 79 blocks (MTP block blk.78 in the file), no
    attention.indexer.types key, indexer tensors on every block, 228 expert
    stacks at 97.5% of 201.8 GiB.
  * confirmed by a published GLM-5.2 GGUF's KV metadata (model card of
    Deviad/GLM-5.2-mixed-IQ2S-experts-IQ4NL-rest, re-quantized from
    unsloth/GLM-5.2-GGUF): arch glm-dsa, 79 blocks (3 dense + 76 MoE),
    context_length 1048576, E 6144, n_ff 12288, n_ff_exp 2048, heads 64/1,
    q_lora 2048, kv_lora 512, key/value_length_mla 256/256, rope 8e6 / 64,
    vocab 154880, gating 2, scale 2.5, norm true, nextn 1; 754B parameters
    (AesSedai/GLM-5.1-GGUF card). context_length >= 2^20 with no
    indexer.types key selects llama.cpp's GLM-5.2 default table.
  * GLM-5.2 config.json excerpts (public code): index_n_heads 32,
    index_head_dim 128, index_topk 2048, index_topk_freq 4,
    index_skip_topk_offset 3, max_position_embeddings 1048576;
  * assumed: the ggml types (TYPES below): experts IQ2_XXS gate/up and IQ2_S down
    (a common ~2-bit recipe), the rest 4-8 bit, F32 norms. This lands on
    ~202 GiB, the seed's file size; the seed's 97.5% expert share does not
    follow from any realistic non-expert types (it would leave ~5 GiB, about
    2.2 bits per weight, for the ~19.5e9 non-expert weights).

It also prints the census: bytes per route and the experts' share.
"""
from __future__ import annotations

import json
import sys

ARCH = "glm-dsa"
E, N_LAYER, N_NEXTN, H = 6144, 78, 1, 64
Q_LORA, KV_LORA, NOPE, ROPE, V_HEAD = 2048, 512, 192, 64, 256
N_EXPERT, N_USED, N_FF_EXP, N_FF, N_DENSE, N_SHARED = 256, 8, 2048, 12288, 3, 1
IDX_HEADS, IDX_DIM, IDX_TOP_K = 32, 128, 2048
VOCAB = 154880

# (bytes per block, elements per block)
BLOCK = {"F32": (4, 1), "F16": (2, 1), "BF16": (2, 1), "Q8_0": (34, 32), "Q6_K": (210, 256),
         "Q5_K": (176, 256), "Q4_K": (144, 256), "IQ4_XS": (136, 256), "IQ2_XS": (74, 256),
         "IQ2_XXS": (66, 256), "IQ2_S": (82, 256)}

# Assumed types (see the module doc): low-bit experts, 4-6 bit dense weights.
TYPES = {
    "expert_gate_up": "IQ2_XXS", "expert_down": "IQ2_S",
    "embd": "Q4_K", "output": "Q6_K", "attn": "Q4_K", "attn_kb_vb": "Q8_0",
    "indexer": "Q8_0", "dense_ffn": "Q4_K", "shexp": "Q4_K", "router": "F32", "norm": "F32",
    "nextn_eh": "Q8_0",
}


def n_bytes(ty, dims):
    b, e = BLOCK[ty]
    assert dims[0] % e == 0, (ty, dims)
    n = 1
    for d in dims:
        n *= d
    return n // e * b


def route(name):
    """The seed's routes: expert stacks go through the expert path."""
    if name.endswith("_exps.weight"):
        return "expert"
    if name == "token_embd.weight":
        return "embedding_rows"
    return "dense"


def tensors():
    Dk = NOPE + ROPE
    out = [("token_embd.weight", TYPES["embd"], [E, VOCAB]),
           ("output_norm.weight", TYPES["norm"], [E]),
           ("output.weight", TYPES["output"], [E, VOCAB])]
    for il in range(N_LAYER + N_NEXTN):
        b = f"blk.{il}."
        t = [
            ("attn_norm.weight", "norm", [E]),
            ("attn_q_a_norm.weight", "norm", [Q_LORA]),
            ("attn_kv_a_norm.weight", "norm", [KV_LORA]),
            ("attn_q_a.weight", "attn", [E, Q_LORA]),
            ("attn_q_b.weight", "attn", [Q_LORA, H * Dk]),
            ("attn_kv_a_mqa.weight", "attn", [E, KV_LORA + ROPE]),
            ("attn_k_b.weight", "attn_kb_vb", [NOPE, KV_LORA, H]),
            ("attn_v_b.weight", "attn_kb_vb", [KV_LORA, V_HEAD, H]),
            ("attn_output.weight", "attn", [H * V_HEAD, E]),
            ("ffn_norm.weight", "norm", [E]),
            # on every block (the public file's quirk); shared layers' copies are surplus
            ("indexer.k_norm.weight", "norm", [IDX_DIM]),
            ("indexer.k_norm.bias", "norm", [IDX_DIM]),
            ("indexer.proj.weight", "router", [E, IDX_HEADS]),
            ("indexer.attn_k.weight", "indexer", [E, IDX_DIM]),
            ("indexer.attn_q_b.weight", "indexer", [Q_LORA, IDX_HEADS * IDX_DIM]),
        ]
        if il < N_DENSE:
            t += [("ffn_gate.weight", "dense_ffn", [E, N_FF]),
                  ("ffn_down.weight", "dense_ffn", [N_FF, E]),
                  ("ffn_up.weight", "dense_ffn", [E, N_FF])]
        else:
            t += [("ffn_gate_inp.weight", "router", [E, N_EXPERT]),
                  ("exp_probs_b.bias", "router", [N_EXPERT]),
                  ("ffn_gate_exps.weight", "expert_gate_up", [E, N_FF_EXP, N_EXPERT]),
                  ("ffn_down_exps.weight", "expert_down", [N_FF_EXP, E, N_EXPERT]),
                  ("ffn_up_exps.weight", "expert_gate_up", [E, N_FF_EXP, N_EXPERT]),
                  ("ffn_gate_shexp.weight", "shexp", [E, N_FF_EXP * N_SHARED]),
                  ("ffn_down_shexp.weight", "shexp", [N_FF_EXP * N_SHARED, E]),
                  ("ffn_up_shexp.weight", "shexp", [E, N_FF_EXP * N_SHARED])]
        if il >= N_LAYER:
            t += [("nextn.eh_proj.weight", "nextn_eh", [2 * E, E]),
                  ("nextn.enorm.weight", "norm", [E]),
                  ("nextn.hnorm.weight", "norm", [E]),
                  ("nextn.shared_head_norm.weight", "norm", [E])]
        out += [(b + n, TYPES[k], d) for n, k, d in t]
    return out


def metadata():
    u, f, bo, s = "u32", "f32", "bool", "string"
    kv = [("general.architecture", s, ARCH), ("general.name", s, "GLM-5.3 (real shape, data left as holes)"),
          ("context_length", u, 1048576), ("embedding_length", u, E),
          ("block_count", u, N_LAYER + N_NEXTN), ("nextn_predict_layers", u, N_NEXTN),
          ("feed_forward_length", u, N_FF), ("expert_feed_forward_length", u, N_FF_EXP),
          ("expert_count", u, N_EXPERT), ("expert_used_count", u, N_USED),
          ("expert_shared_count", u, N_SHARED), ("leading_dense_block_count", u, N_DENSE),
          ("expert_weights_scale", f, 2.5), ("expert_weights_norm", bo, True),
          ("expert_gating_func", u, 2), ("vocab_size", u, VOCAB),
          ("attention.head_count", u, H), ("attention.head_count_kv", u, 1),
          ("attention.key_length", u, KV_LORA + ROPE), ("attention.value_length", u, KV_LORA),
          ("attention.key_length_mla", u, NOPE + ROPE), ("attention.value_length_mla", u, V_HEAD),
          ("attention.q_lora_rank", u, Q_LORA), ("attention.kv_lora_rank", u, KV_LORA),
          ("attention.layer_norm_rms_epsilon", f, 1e-5),
          ("rope.dimension_count", u, ROPE), ("rope.freq_base", f, 8000000.0),
          ("attention.indexer.head_count", u, IDX_HEADS), ("attention.indexer.key_length", u, IDX_DIM),
          ("attention.indexer.top_k", u, IDX_TOP_K)]
    return [{"key": k if k.startswith("general.") else f"{ARCH}.{k}", "type": t, "value": v} for k, t, v in kv]


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    ts = tensors()
    by_route, total, params = {}, 0, {}
    rows = []
    for name, ty, dims in ts:
        nb = n_bytes(ty, dims)
        total += nb
        r = route(name)
        by_route[r] = by_route.get(r, 0) + nb
        n = 1
        for d in dims:
            n *= d
        params[r] = params.get(r, 0) + n
        rows.append({"name": name, "type": ty, "dims": dims, "bytes": nb})
    n_exps = sum(1 for n, _, _ in ts if n.endswith("_exps.weight"))
    census = {"tensors": len(ts), "bytes_total": total, "gib_total": round(total / 2**30, 2),
              "bytes_per_route": by_route, "params_per_route": params, "expert_stacks": n_exps,
              "expert_share": round(by_route["expert"] / total, 4)}
    doc = {"about": "Metadata and tensor table of the public GLM-5.3 glm-dsa GGUF, written by "
                    "tools/oracle/glmdsa_real_shape.py (sources and assumptions in its doc). Dims in "
                    "GGUF order. Tokenizer keys omitted. A generator writes the header and leaves the "
                    "data as holes.",
           "assumed_types": TYPES, "census": census, "metadata": metadata(), "tensors": rows}
    with open(sys.argv[1], "w") as fo:
        fo.write("{\n")
        for k in ("about", "assumed_types", "census", "metadata"):
            fo.write(f" {json.dumps(k)}: {json.dumps(doc[k])},\n")
        fo.write(' "tensors": [\n')
        fo.write(",\n".join("  " + json.dumps(r) for r in rows))
        fo.write("\n ]\n}\n")
    print(json.dumps(census, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
