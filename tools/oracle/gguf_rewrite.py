#!/usr/bin/env python3
"""Rewrite a GGUF (usually a test-llama-archs model) into an oracle fixture
variant: override or drop keys, keep the first N entries of a tensor along
one axis, and convert tensors to other ggml types (mixed-type fixtures).

    PYTHONPATH=$LCP/vendor/llama.cpp/gguf-py python3 tools/oracle/gguf_rewrite.py IN.gguf OUT.gguf \
        [--set KEY=VALUE[:TYPE]]... [--drop-key KEY]... \
        [--slice REGEX:AXIS:N]... [--type REGEX=TYPE]... [--drop-tensor REGEX]... \
        [--copy REGEX=REPLACEMENT]...

KEY is written without the architecture prefix when it starts with '.'
(".attention.indexer.top_k" -> "<arch>.attention.indexer.top_k").
VALUE: a number, true/false, or a comma list in brackets ("[1,0]"). TYPE is
u32|i32|f32|bool|u64 (arrays: the element type); without TYPE an existing
key keeps its type, a new one is u32/f32/bool by its look.
--slice keeps the first N entries of numpy axis AXIS (numpy = reversed ggml
dims) of every tensor whose name matches REGEX (re.search); N may instead be
ranges A-B,C-D (kept in order: a latent's first rows and its rope tail).
--type converts every matching F32/F16 tensor (re.search, first match wins)
to F32, F16, BF16, Q8_0, Q5_0, Q5_1, Q4_0 or Q4_1 with gguf.quants.quantize.
--copy adds, for every tensor whose name matches REGEX (re.fullmatch), a copy
named re.sub(REGEX, REPLACEMENT, name) (e.g. 'blk\.0\.(.*)=blk.2.\1' to grow
a model by a layer); the copies get the same --type/--slice treatment.
Everything else is copied value for value; the result is deterministic.
"""
from __future__ import annotations

import argparse
import re

import numpy as np
import gguf
from gguf.quants import dequantize, quantize

VT = gguf.GGUFValueType
TYPES = {"u32": VT.UINT32, "i32": VT.INT32, "f32": VT.FLOAT32, "bool": VT.BOOL, "u64": VT.UINT64}


def field_value(f):
    t0 = f.types[0]
    if t0 == VT.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    if t0 == VT.ARRAY:
        st = f.types[1] if len(f.types) > 1 else None
        if st == VT.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i][0].item() for i in f.data]
    return f.parts[f.data[0]][0].item()


def parse_scalar(s: str):
    s = s.strip()
    if s in ("true", "false"):
        return s == "true"
    try:
        return int(s)
    except ValueError:
        return float(s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inp")
    ap.add_argument("out")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--drop-key", action="append", default=[])
    ap.add_argument("--slice", action="append", default=[])
    ap.add_argument("--type", action="append", default=[])
    ap.add_argument("--drop-tensor", action="append", default=[])
    ap.add_argument("--copy", action="append", default=[])
    args = ap.parse_args()

    r = gguf.GGUFReader(args.inp)
    arch = field_value(r.fields["general.architecture"])

    def full(key: str) -> str:
        return arch + key if key.startswith(".") else key

    overrides = {}
    for item in args.set:
        key, _, rest = item.partition("=")
        key = full(key)
        ty = None
        if ":" in rest and rest.rsplit(":", 1)[1] in TYPES:
            rest, ty = rest.rsplit(":", 1)
        if rest.startswith("["):
            vals = [parse_scalar(x) for x in rest.strip("[]").split(",") if x.strip()]
            overrides[key] = ("array", vals, ty)
        else:
            overrides[key] = ("scalar", parse_scalar(rest), ty)
    drops = {full(k) for k in args.drop_key}

    def guess(v):
        return VT.BOOL if isinstance(v, bool) else (VT.UINT32 if isinstance(v, int) else VT.FLOAT32)

    w = gguf.GGUFWriter(args.out, arch)
    seen = set()
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drops:
            continue
        seen.add(name)
        t0 = f.types[0]
        st = f.types[1] if t0 == VT.ARRAY and len(f.types) > 1 else None
        if name in overrides:
            kind, v, ty = overrides[name]
            if kind == "array":
                sub = TYPES[ty] if ty else (st or guess(v[0]))
                w.add_key_value(name, v, VT.ARRAY, sub_type=sub)
            else:
                w.add_key_value(name, v, TYPES[ty] if ty else (t0 if t0 != VT.ARRAY else guess(v)))
            continue
        if t0 == VT.ARRAY:
            if st is None or len(f.data) == 0:
                continue  # empty arrays carry nothing the loaders need
            w.add_key_value(name, field_value(f), VT.ARRAY, sub_type=st)
        else:
            w.add_key_value(name, field_value(f), t0)
    for name, (kind, v, ty) in overrides.items():
        if name in seen:
            continue
        if kind == "array":
            w.add_key_value(name, v, VT.ARRAY, sub_type=TYPES[ty] if ty else guess(v[0]))
        else:
            w.add_key_value(name, v, TYPES[ty] if ty else guess(v))

    slices = []
    for s in args.slice:
        rx, axis, n = s.rsplit(":", 2)
        if n.isdigit():
            keep = slice(0, int(n))
        else:  # ranges: "0-64,512-576" keeps [0, 64) and [512, 576)
            keep = np.concatenate([np.arange(int(a), int(b)) for a, b in
                                   (r.split("-") for r in n.split(","))])
        slices.append((re.compile(rx), int(axis), keep))
    types = []
    for t in args.type:
        rx, _, ty = t.rpartition("=")
        types.append((re.compile(rx), gguf.GGMLQuantizationType[ty]))
    drop_t = [re.compile(x) for x in args.drop_tensor]

    copies = []
    for c in args.copy:
        rx, _, repl = c.partition("=")
        copies.append((re.compile(rx), repl))
    items = [(t.name, t) for t in r.tensors]
    for rx, repl in copies:
        items += [(rx.sub(repl, t.name), t) for t in r.tensors if rx.fullmatch(t.name)]

    counts: dict[str, int] = {}
    for name, t in items:
        if any(rx.search(name) for rx in drop_t):
            continue
        shape = tuple(int(x) for x in reversed(t.shape))
        a = None
        for rx, axis, n in slices:
            if rx.search(name):
                if a is None:
                    a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
                idx = [slice(None)] * a.ndim
                idx[axis] = n
                a = np.ascontiguousarray(a[tuple(idx)])
        target = None
        for rx, ty in types:
            if rx.search(name):
                target = ty
                break
        if a is None and target is None:
            # unchanged: copy the stored bytes with the stored type
            w.add_tensor(name, np.asarray(t.data), raw_dtype=t.tensor_type)
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
            continue
        if a is None:
            a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        ty = target or gguf.GGMLQuantizationType.F32
        if ty == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, a.astype(np.float32))
        elif ty == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, a.astype(np.float16))
        else:
            q = quantize(a, ty)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=ty)
        counts[ty.name] = counts.get(ty.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}: tensors by type {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
