#!/usr/bin/env python3
"""Derive a qwen4exp fixture variant from test-llama-archs' tiny model.

The tiny model (E 256, 2 heads, Hv = Hk = 2, n_head_kv = n_head, top_k
131072) leaves several paths untested: GQA, V-head -> K-head mapping with
Hv != Hk (llama.cpp: j mod Hk), and sparse QSA selection. This script
rewrites it with gguf-py (PyPI gguf):

    python3 tools/oracle/qwen4exp_variant.py IN.gguf OUT.gguf \
        [--hv 4] [--n-head-kv 1] [--top-k 8] [--sections 8,8,8,8] [--seed 1] [--stdev 0.5]

Changed tensors are redrawn N(0, stdev) from numpy's default_rng(seed);
ssm_a is -|N|. Everything else is copied byte for byte. Keys are copied with
their original types except those overridden.
"""
from __future__ import annotations

import argparse

import numpy as np
import gguf


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--hv", type=int, default=None, help="ssm.time_step_rank (V heads)")
    ap.add_argument("--n-head-kv", type=int, default=None)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--sections", default=None, help="rope.dimension_sections, 4 ints")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stdev", type=float, default=0.5)
    args = ap.parse_args()

    r = gguf.GGUFReader(args.inp)
    arch = "qwen4exp"

    def val(name):
        f = r.fields[name]
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            return [f.parts[i][0].item() for i in f.data]
        return f.parts[f.data[0]][0].item()

    E = val(f"{arch}.embedding_length")
    S = val(f"{arch}.ssm.state_size")
    Hk = val(f"{arch}.ssm.group_count")
    Hv = args.hv or val(f"{arch}.ssm.time_step_rank")
    hd = val(f"{arch}.attention.key_length")
    nkv = args.n_head_kv or val(f"{arch}.attention.head_count_kv")
    assert Hv % Hk == 0

    over = {
        f"{arch}.ssm.time_step_rank": (Hv, gguf.GGUFValueType.UINT32),
        f"{arch}.ssm.inner_size": (S * Hv, gguf.GGUFValueType.UINT32),
        f"{arch}.attention.head_count_kv": (nkv, gguf.GGUFValueType.UINT32),
    }
    if args.top_k is not None:
        over[f"{arch}.attention.indexer.top_k"] = (args.top_k, gguf.GGUFValueType.UINT32)
    sections = [int(x) for x in args.sections.split(",")] if args.sections else None

    w = gguf.GGUFWriter(args.out, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        t0 = f.types[0]
        if name in over:
            v, vt = over[name]
            w.add_key_value(name, v, vt)
        elif name == f"{arch}.rope.dimension_sections" and sections:
            w.add_key_value(name, sections, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        elif t0 == gguf.GGUFValueType.STRING:
            w.add_key_value(name, bytes(f.parts[f.data[0]]).decode(), t0)
        elif t0 == gguf.GGUFValueType.ARRAY:
            st = f.types[1] if len(f.types) > 1 else None
            if st is None or len(f.data) == 0:
                continue  # empty arrays: not needed by the loader
            if st == gguf.GGUFValueType.STRING:
                vals = [bytes(f.parts[i]).decode() for i in f.data]
            else:
                vals = [f.parts[i][0].item() for i in f.data]
            w.add_key_value(name, vals, t0, sub_type=st)
        else:
            w.add_key_value(name, f.parts[f.data[0]][0].item(), t0)

    rng = np.random.default_rng(args.seed)
    key_dim, value_dim = S * Hk, S * Hv
    # numpy (reversed ggml) shapes of the tensors that depend on Hv / n_head_kv
    new_shapes = {
        "attn_qkv.weight": (2 * key_dim + value_dim, E),
        "attn_gate.weight": (value_dim, E),
        "ssm_conv1d.weight": (2 * key_dim + value_dim, 4),
        "ssm_dt.bias": (Hv,),
        "ssm_a": (Hv,),
        "ssm_alpha.weight": (Hv, E),
        "ssm_beta.weight": (Hv, E),
        "ssm_out.weight": (E, value_dim),
        "attn_k.weight": (hd * nkv, E),
        "attn_v.weight": (hd * nkv, E),
        "attn_k.bias": (hd * nkv,),
        "attn_v.bias": (hd * nkv,),
    }
    for t in r.tensors:
        suffix = t.name.split(".", 2)[2] if t.name.startswith("blk.") else t.name
        if suffix in new_shapes:
            shape = new_shapes[suffix]
            if suffix == "ssm_conv1d.weight":
                shape = (shape[0], int(t.shape[0]))
            a = rng.normal(0.0, args.stdev, size=shape).astype(np.float32)
            if suffix == "ssm_a":
                a = -np.abs(a)
            w.add_tensor(t.name, a)
        else:
            assert t.tensor_type == gguf.GGMLQuantizationType.F32, t.name
            w.add_tensor(t.name, np.array(t.data, dtype=np.float32).reshape(tuple(int(x) for x in reversed(t.shape))))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}: Hv={Hv} Hk={Hk} n_head_kv={nkv} top_k={args.top_k} sections={sections}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
