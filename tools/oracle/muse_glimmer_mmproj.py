#!/usr/bin/env python3
"""Write a tiny muse-glimmer multimodal projector GGUF (general.architecture
"clip", clip.projector_type "muse-glimmer") with the keys and tensors
llama.cpp's mtmd/clip loader expects for this model
(docs/families/muse_glimmer.md section 7), random N(0, stdev) weights from
numpy's default_rng(seed), plus the broken variants the seam must refuse.

    PYTHONPATH=$LCP/vendor/llama.cpp/gguf-py python3 tools/oracle/muse_glimmer_mmproj.py OUT.gguf \
        [--text-embd 256] [--break none|patch-missing|patch-shape|patch-short|other-model] [--seed 1]

--break:
  patch-missing  v.patch_embd.weight absent (the public file's defect, by name)
  patch-shape    v.patch_embd.weight with half its output channels {ps, ps, 3, Ev/2}
  patch-short    v.patch_embd.weight is the last tensor and the file ends half-way
                 through its data (the header still claims the full size)
  other-model    a complete projector of another type ("gemma3")
Sizes: patch 4, Ev 32, 2 heads, n_ff 64, 4 blocks (block 3 global), merge 2,
learned position table 4x4, adapter 128 -> 64 -> 64 -> text E. Types: F32,
except the adapter (mm.0/mm.1 F16) so the file mixes ggml types.
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import gguf

PS, EV, NH, NFF, NL, MERGE, P, D1 = 4, 32, 2, 64, 4, 2, 4, 64


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--text-embd", type=int, default=256, help="the text model's embedding_length (mm.2 output)")
    ap.add_argument("--break", dest="brk", default="none",
                    choices=["none", "patch-missing", "patch-shape", "patch-short", "other-model"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stdev", type=float, default=0.1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)

    def rnd(*shape):  # numpy order (reversed ggml dims)
        return rng.normal(0.0, args.stdev, size=shape).astype(np.float32)

    w = gguf.GGUFWriter(args.out, "clip")
    w.add_type(gguf.GGUFType.MMPROJ)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type("gemma3" if args.brk == "other-model" else "muse-glimmer")
    w.add_vision_projection_dim(args.text_embd)
    w.add_vision_image_size(P * PS * MERGE)
    w.add_vision_patch_size(PS)
    w.add_vision_embedding_length(EV)
    w.add_vision_feed_forward_length(NFF)
    w.add_vision_block_count(NL)
    w.add_vision_head_count(NH)
    w.add_vision_attention_layernorm_eps(1e-6)
    w.add_vision_spatial_merge_size(MERGE)
    w.add_vision_image_mean([0.5, 0.5, 0.5])
    w.add_vision_image_std([0.5, 0.5, 0.5])

    tensors: list[tuple[str, np.ndarray]] = []
    tensors.append(("v.patch_embd.bias", rnd(EV)))
    tensors.append(("v.position_embd.weight", rnd(P * P, EV)))
    for n in ("v.pre_ln", "v.post_ln"):
        tensors.append((n + ".weight", 1.0 + rnd(EV)))
        tensors.append((n + ".bias", rnd(EV)))
    for il in range(NL):
        b = f"v.blk.{il}."
        for n in ("ln1", "ln2"):
            tensors.append((b + n + ".weight", 1.0 + rnd(EV)))
            tensors.append((b + n + ".bias", rnd(EV)))
        for n in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors.append((b + n + ".weight", rnd(EV, EV)))
            tensors.append((b + n + ".bias", rnd(EV)))
        tensors.append((b + "ffn_up.weight", rnd(NFF, EV)))
        tensors.append((b + "ffn_up.bias", rnd(NFF)))
        tensors.append((b + "ffn_down.weight", rnd(EV, NFF)))
        tensors.append((b + "ffn_down.bias", rnd(EV)))
    tensors.append(("mm.0.weight", rnd(D1, EV * MERGE * MERGE).astype(np.float16)))
    tensors.append(("mm.1.weight", rnd(D1, D1).astype(np.float16)))
    tensors.append(("mm.2.weight", rnd(args.text_embd, D1)))
    # patch_embd last, so that truncating the file cuts exactly its data
    if args.brk == "patch-shape":
        tensors.append(("v.patch_embd.weight", rnd(EV // 2, 3, PS, PS)))
    elif args.brk != "patch-missing":
        tensors.append(("v.patch_embd.weight", rnd(EV, 3, PS, PS)))
    for name, a in tensors:
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if args.brk == "patch-short":
        size = os.path.getsize(args.out)
        patch_bytes = EV * 3 * PS * PS * 4
        with open(args.out, "r+b") as f:
            f.truncate(size - patch_bytes // 2)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes, break={args.brk})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
