#!/usr/bin/env python3
"""Interop fixtures for seam: GGUF files written by an independent
implementation (PyPI ``gguf``, pinned to 0.19.0) plus "golden" JSON that
records what gguf-py's own reader reports about each file.

Usage:
    python3 tools/gguf_interop.py tests/data/interop
        (re)write every sample NAME.gguf and its NAME.expected.json there.
    python3 tools/gguf_interop.py --golden-for FILE.gguf OUT.json
        write the golden for an existing file (e.g. the real gemma model).

The golden is produced by reading the written file back with
``gguf.GGUFReader`` (the reader is the oracle, not what this script meant to
write), cross-checked against a small independent parse of the raw header
bytes and against the ggml type table in shared/reference/gguf.md.

Everything is deterministic: fixed numpy seeds, no timestamps, stable key
order. Running the script twice yields byte-identical files.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

EXPECTED_GGUF_VERSION = "0.19.0"

# ggml's type table (shared/reference/gguf.md): id -> (elements per block,
# bytes per block). Independent of gguf-py's GGML_QUANT_SIZES on purpose.
GGML_TYPE_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
    8: (32, 34), 9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144),
    13: (256, 176), 14: (256, 210), 15: (256, 292), 16: (256, 66),
    17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
    22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4),
    27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54),
    35: (256, 66), 39: (32, 17),
}
# Types only some forks define (gguf.md: "Some forks add ..."). gguf-py
# 0.19.0 knows 40 and 41; they go into a separate sample, fork_types.gguf.
FORK_TYPE_SIZES: dict[int, tuple[int, int]] = {
    40: (64, 36), 41: (128, 18), 42: (64, 18),
}

SUMMARIZE_ARRAYS_OVER = 64  # only for --golden-for (real models)


# --------------------------------------------------------------------------
# golden generation (reader is the oracle)
# --------------------------------------------------------------------------

def _pad(x: int, n: int) -> int:
    return ((x + n - 1) // n) * n


def _type_name(vt: VT) -> str:
    return VT(vt).name


def _field_elem_type(field: Any) -> VT:
    # KV field parts: [key_len, key_bytes, value_type, item_type, count, ...].
    # Take the element type from the raw item_type part: for an empty array
    # gguf-py's field.types is just [ARRAY] (it records the element type only
    # from element 0).
    return VT(int(field.parts[3][0]))


def _json_scalar(vt: VT, v: Any) -> Any:
    if vt in (VT.FLOAT32, VT.FLOAT64):
        f = float(v)
        if not math.isfinite(f):
            raise ValueError(f"non-finite float {f!r} cannot go into a golden")
        return f
    if vt == VT.BOOL:
        return bool(v)
    if vt == VT.STRING:
        return str(v)
    return int(v)


def _metadata(reader: gguf.GGUFReader, summarize: bool) -> tuple[dict, dict]:
    values: dict[str, Any] = {}
    types: dict[str, str] = {}
    fields = list(reader.fields.values())
    # The first three fields are gguf-py's pseudo-fields for the header
    # (GGUF.version, GGUF.tensor_count, GGUF.kv_count), not metadata.
    assert [f.name for f in fields[:3]] == ["GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"]
    for field in fields[3:]:
        key = field.name
        main = VT(field.types[0])
        if main == VT.ARRAY:
            elem = _field_elem_type(field)
            if len(field.types) > 1:
                assert VT(field.types[1]) == elem, (key, field.types)
                if elem == VT.ARRAY:
                    raise ValueError(f"{key}: arrays of arrays are not supported")
            n = int(field.parts[4][0])
            assert n == len(field.data) or (n == 0 and field.data == []), key
            types[key] = f"ARRAY[{_type_name(elem)}]"
            if summarize and n > SUMMARIZE_ARRAYS_OVER:
                values[key] = {"array_len": n, "elem_type": _type_name(elem)}
            else:
                items = field.contents() if n > 0 else []
                assert len(items) == n, key
                values[key] = [_json_scalar(elem, x) for x in items]
        else:
            types[key] = _type_name(main)
            values[key] = _json_scalar(main, field.contents())
    return values, types


def _raw_tensor_info(blob: bytes, off: int) -> tuple[str, list[int], int, int]:
    """Independent parse of one tensor info record at byte offset off."""
    (nlen,) = struct.unpack_from("<Q", blob, off)
    off += 8
    name = blob[off:off + nlen].decode("utf-8")
    off += nlen
    (n_dims,) = struct.unpack_from("<I", blob, off)
    off += 4
    dims = list(struct.unpack_from(f"<{n_dims}q", blob, off))
    off += 8 * n_dims
    gtype, rel = struct.unpack_from("<iQ", blob, off)
    return name, dims, gtype, rel


def _tensors(path: Path, reader: gguf.GGUFReader, split: int) -> list[dict]:
    out = []
    header_len = reader.data_offset  # infos end before this point
    with open(path, "rb") as fh:
        head = fh.read(header_len)
        expect_rel = 0
        for t in reader.tensors:
            name, raw_dims, raw_type, raw_rel = _raw_tensor_info(head, t.field.offset)
            assert name == t.name
            # gguf-py 0.19.0: ReaderTensor.shape is the raw stored dims
            # (ne0 first, n_dims entries); .data is reshaped the numpy way.
            dims = [int(d) for d in t.shape]
            assert dims == raw_dims, (name, dims, raw_dims)
            assert raw_type == int(t.tensor_type)
            qt = QT(raw_type)
            block, tsize = GGML_TYPE_SIZES.get(raw_type) or FORK_TYPE_SIZES[raw_type]
            assert dims[0] % block == 0, name
            n_elems = math.prod(dims)
            n_bytes = n_elems // block * tsize
            assert n_bytes == int(t.n_bytes), (name, qt.name, n_bytes, t.n_bytes)
            # data_offset is absolute in 0.19.0: data section start + offset
            offset = int(t.data_offset)
            assert offset == int(reader.data_offset) + raw_rel, name
            assert raw_rel == expect_rel, (name, raw_rel, expect_rel)
            expect_rel += _pad(n_bytes, int(reader.alignment))
            fh.seek(offset)
            data = fh.read(n_bytes)
            assert len(data) == n_bytes, f"{name}: file truncated"
            digest = hashlib.sha256(data).hexdigest()
            assert hashlib.sha256(t.data.tobytes()).hexdigest() == digest, name
            out.append({
                "name": name,
                "ggml_type": qt.name,
                "dims": dims,
                "offset": offset,
                "n_bytes": n_bytes,
                "sha256": digest,
                "split": split,
            })
    return out


def golden_for(path: Path, summarize: bool = False, shards: list[Path] | None = None) -> dict:
    """Golden for one file, or for a split model (shards in order, path = first)."""
    shards = shards or [path]
    assert shards[0] == path
    reader = gguf.GGUFReader(path)
    version = int(reader.fields["GGUF.version"].contents())
    metadata, metadata_types = _metadata(reader, summarize)
    tensors = []
    for i, shard in enumerate(shards):
        r = reader if i == 0 else gguf.GGUFReader(shard)
        if len(shards) > 1:
            assert r.fields["split.no"].contents() == i, shard
            assert r.fields["split.count"].contents() == len(shards), shard
        tensors += _tensors(shard, r, i)
    if len(shards) > 1:
        assert metadata["split.tensors.count"] == len(tensors)
    return {
        "file": path.name,
        "version": version,
        "alignment": int(reader.alignment),
        "metadata": metadata,
        "metadata_types": metadata_types,
        "tensors": tensors,
    }


def write_json(obj: dict, out: Path) -> None:
    text = json.dumps(obj, indent=1, ensure_ascii=False, allow_nan=False)
    out.write_text(text + "\n", encoding="utf-8")


# --------------------------------------------------------------------------
# sample writers
# --------------------------------------------------------------------------

class _Writer(gguf.GGUFWriter):
    """GGUFWriter that can also encode an empty array.

    gguf-py refuses empty arrays (add_array() silently drops them and
    _pack_val raises "Empty array"), but the format allows them. This adds
    only that case: item type (u32) + count 0, no elements.
    """

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == VT.ARRAY and sub_type is not None and len(val) == 0:
            out = bytearray()
            if add_vtype:
                out += self._pack("I", vtype)
            out += self._pack("I", sub_type)
            out += self._pack("Q", 0)
            return bytes(out)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _random_blocks(rng: np.random.Generator, qt: QT, n_blocks: int) -> np.ndarray:
    """n_blocks pseudo-random blocks of qt, kept dequantizable to finite values
    where gguf-py can dequantize (re-rolls blocks whose f16/e8m0 scales turn
    out NaN/Inf), so the data also passes llama.cpp's --check-tensors."""
    block, tsize = gguf.GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(n_blocks, tsize), dtype=np.uint8)
    if qt == QT.Q8_K:  # no dequantizer in gguf-py; d is the leading f32
        d = rng.uniform(-0.05, 0.05, size=n_blocks).astype("<f4")
        raw[:, :4] = d.view(np.uint8).reshape(n_blocks, 4)
        return raw
    for _ in range(1000):
        with np.errstate(all="ignore"):
            try:
                vals = gguf.quants.dequantize(raw, qt).reshape(n_blocks, block)
            except NotImplementedError:
                return raw
            bad = ~np.all(np.isfinite(vals) & (np.abs(vals) < 1e30), axis=1)
        if not bad.any():
            return raw
        raw[bad] = rng.integers(0, 256, size=(int(bad.sum()), tsize), dtype=np.uint8)
    raise RuntimeError(f"could not make finite blocks for {qt.name}")


def _quant_tensor(rng: np.random.Generator, qt: QT, dims: list[int]) -> np.ndarray:
    """uint8 array for qt with GGUF dims (ne0 first); numpy shape reversed,
    last axis in bytes (what add_tensor(raw_dtype=...) expects)."""
    block, tsize = gguf.GGML_QUANT_SIZES[qt]
    assert dims[0] % block == 0
    n_blocks = math.prod(dims) // block
    blocks = _random_blocks(rng, qt, n_blocks)
    np_shape = tuple(reversed(dims[1:])) + (dims[0] // block * tsize,)
    return blocks.reshape(np_shape)


def _numpy_tensor(rng: np.random.Generator, qt: QT, dims: list[int]) -> tuple[np.ndarray, QT | None]:
    np_shape = tuple(reversed(dims))
    if qt == QT.F32:
        return rng.standard_normal(np_shape).astype(np.float32), None
    if qt == QT.F16:
        return rng.standard_normal(np_shape).astype(np.float16), None
    if qt == QT.F64:
        return rng.standard_normal(np_shape).astype(np.float64), None
    if qt == QT.BF16:
        # gguf-py has no numpy bfloat16: pass the bit patterns as uint16 with
        # raw_dtype=BF16 (shape is then taken as-is, not byte-converted).
        f = rng.standard_normal(np_shape).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16), QT.BF16
    ints = {QT.I8: np.int8, QT.I16: np.int16, QT.I32: np.int32, QT.I64: np.int64}
    if qt in ints:
        dt = ints[qt]
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, size=np_shape, dtype=dt, endpoint=True)
        a.flat[0] = info.min
        a.flat[-1] = info.max
        return a, None
    raise ValueError(qt)


def _add(w: gguf.GGUFWriter, rng: np.random.Generator, name: str, qt: QT, dims: list[int]) -> None:
    if gguf.GGML_QUANT_SIZES[qt][0] == 1:
        arr, raw = _numpy_tensor(rng, qt, dims)
        w.add_tensor(name, arr, raw_dtype=raw)
    else:
        w.add_tensor(name, _quant_tensor(rng, qt, dims), raw_dtype=qt)


def sample_all_metadata_types(path: Path) -> None:
    w = _Writer(path, "interop")
    w.add_uint8("scalar.u8.max", 255)
    w.add_uint8("scalar.u8.min", 0)
    w.add_int8("scalar.i8.min", -128)
    w.add_int8("scalar.i8.max", 127)
    w.add_uint16("scalar.u16.max", 65535)
    w.add_int16("scalar.i16.min", -32768)
    w.add_int16("scalar.i16.max", 32767)
    w.add_uint32("scalar.u32.max", 4294967295)
    w.add_int32("scalar.i32.min", -2147483648)
    w.add_int32("scalar.i32.max", 2147483647)
    w.add_float32("scalar.f32.one_and_half", 1.5)
    w.add_float32("scalar.f32.neg_zero", -0.0)
    w.add_float32("scalar.f32.big", 3.4e38)  # not exact in f32: golden has the f32 value
    w.add_float32("scalar.f32.tiny", 1e-45)  # smallest f32 subnormal
    w.add_bool("scalar.bool.true", True)
    w.add_bool("scalar.bool.false", False)
    w.add_string("scalar.string.ascii", "hello, gguf")
    w.add_string("scalar.string.unicode", "héllo wörld · 你好 · Ελληνικά · 🦀🚀")
    w.add_string("scalar.string.multiline", "line one\nline \"two\"\ttab\\")
    w.add_key_value("scalar.string.empty", "", VT.STRING)  # add_string("") is a no-op
    w.add_uint64("scalar.u64.max", 18446744073709551615)
    w.add_uint64("scalar.u64.big", 1 << 53 | 1)  # not representable in f64
    w.add_int64("scalar.i64.min", -9223372036854775808)
    w.add_int64("scalar.i64.max", 9223372036854775807)
    w.add_float64("scalar.f64.pi", 3.141592653589793)
    w.add_float64("scalar.f64.max", 1.7976931348623157e308)
    w.add_float64("scalar.f64.neg_zero", -0.0)
    w.add_float64("scalar.f64.min_subnormal", 5e-324)
    w.add_string("ключ.unicode.key", "a key that is not ASCII")

    arrays = [
        ("array.u8", VT.UINT8, [0, 1, 127, 128, 255]),
        ("array.i8", VT.INT8, [-128, -1, 0, 1, 127]),
        ("array.u16", VT.UINT16, [0, 1, 65535]),
        ("array.i16", VT.INT16, [-32768, 0, 32767]),
        ("array.u32", VT.UINT32, [0, 7, 4294967295]),
        ("array.i32", VT.INT32, [-2147483648, -1, 0, 2147483647]),
        ("array.f32", VT.FLOAT32, [1.5, -0.0, 3.4e38, -2.25, 0.1]),
        ("array.bool", VT.BOOL, [True, False, True, True]),
        ("array.string", VT.STRING, ["alpha", "", "βeta", "🦀", "with space"]),
        ("array.u64", VT.UINT64, [0, 18446744073709551615]),
        ("array.i64", VT.INT64, [-9223372036854775808, 0, 9223372036854775807]),
        ("array.f64", VT.FLOAT64, [3.141592653589793, -0.0, 1e300, -2.5]),
    ]
    for key, vt, vals in arrays:
        w.add_key_value(key, vals, VT.ARRAY, sub_type=vt)
    # add_array() infers the element type: int -> INT32, float -> FLOAT32
    w.add_array("array.inferred.ints", [1, 2, 3])
    w.add_array("array.inferred.floats", [0.5, 0.25])
    w.add_array("array.inferred.strings", ["x", "y"])
    # an empty array (needs _Writer, see its docstring)
    w.add_key_value("array.empty.u32", [], VT.ARRAY, sub_type=VT.UINT32)
    w.add_key_value("array.empty.string", [], VT.ARRAY, sub_type=VT.STRING)
    # a single tiny tensor so the file is an ordinary model file
    w.add_tensor("only.weight", np.arange(6, dtype=np.float32).reshape(2, 3))
    _finish(w)


def sample_no_tensors(path: Path) -> None:
    w = _Writer(path, "interop")
    w.add_string("general.name", "metadata only, zero tensors")
    w.add_uint32("vocab.size", 3)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "hi"])
    _finish(w)


def sample_alignment(path: Path, alignment: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = _Writer(path, "interop")
    w.add_custom_alignment(alignment)
    w.add_string("general.name", f"alignment {alignment}, odd-sized tensors")
    w.add_string("odd", "x" * 3)  # odd-length key/value so infos end unaligned
    odd = [
        ("a.f32_7", QT.F32, [7]),
        ("bb.i8_13", QT.I8, [13]),
        ("ccc.f16_5x3", QT.F16, [5, 3]),
        ("d.q8_0_1blk", QT.Q8_0, [32]),
        ("ee.i16_3", QT.I16, [3]),
        ("f.q4_k_1blk", QT.Q4_K, [256]),
        ("g.bf16_3x1x3", QT.BF16, [3, 1, 3]),
        ("hh.f64_1", QT.F64, [1]),
        ("i.mxfp4_3blk", QT.MXFP4, [32, 3]),
        ("last.i8_1", QT.I8, [1]),
    ]
    for name, qt, dims in odd:
        _add(w, rng, name, qt, dims)
    _finish(w)


def _quant_type_list(fork: bool) -> tuple[list[QT], list[tuple[str, str]]]:
    """Types gguf-py can write whose sizes agree with ggml's table."""
    chosen, skipped = [], []
    for qt in QT:
        sizes = gguf.GGML_QUANT_SIZES.get(qt)
        if sizes is None:
            skipped.append((qt.name, "no entry in gguf.GGML_QUANT_SIZES"))
            continue
        table = FORK_TYPE_SIZES if fork else GGML_TYPE_SIZES
        other = GGML_TYPE_SIZES if fork else FORK_TYPE_SIZES
        if int(qt) in other:
            continue
        want = table.get(int(qt))
        if want is None:
            skipped.append((qt.name, "not in the ggml type table of gguf.md"))
        elif tuple(sizes) != want:
            skipped.append((qt.name, f"gguf-py says {sizes[0]} elems/{sizes[1]} bytes per block, ggml {want[0]}/{want[1]}"))
        else:
            chosen.append(qt)
    return chosen, skipped


def _shapes(block: int, i: int) -> list[int]:
    # rotate over 1-D..4-D; ne0 always a multiple of the block size
    return [
        [block * 3],
        [block * 2, 3],
        [block, 2, 3],
        [block, 3, 1, 2],
    ][i % 4]


def sample_quant_types(path: Path, types: list[QT], seed: int) -> None:
    rng = np.random.default_rng(seed)
    w = _Writer(path, "interop")
    w.add_string("general.name", "one tensor per ggml type, pseudo-random data")
    w.add_array("interop.types", [qt.name for qt in types])
    for i, qt in enumerate(types):
        block = gguf.GGML_QUANT_SIZES[qt][0]
        dims = _shapes(block, i)
        _add(w, rng, f"t{i:02d}.{qt.name.lower()}", qt, dims)
        # every type also once as 4-D and once as 1-D
        if len(dims) != 4:
            _add(w, rng, f"t{i:02d}.{qt.name.lower()}.4d", qt, [block, 1, 2, 2])
        if len(dims) != 1:
            _add(w, rng, f"t{i:02d}.{qt.name.lower()}.1d", qt, [block])
    _finish(w)


def sample_split(base: Path, seed: int) -> list[Path]:
    """base = .../split.gguf; gguf-py writes split-0000N-of-00003.gguf."""
    rng = np.random.default_rng(seed)
    # default alignment on purpose: gguf-py writes general.alignment only into
    # shard 0 but pads every shard with it (see tools/README.md)
    w = _Writer(base, "interop", split_max_tensors=3)
    w.add_string("general.name", "split model, 3 shards")
    w.add_uint32("interop.block_count", 2)
    names = [
        ("token_embd.weight", QT.Q8_0, [64, 5]),
        ("blk.0.attn_norm.weight", QT.F32, [64]),
        ("blk.0.ffn_down.weight", QT.Q4_K, [256, 2]),
        ("blk.1.attn_norm.weight", QT.F32, [64]),
        ("blk.1.ffn_down.weight", QT.Q6_K, [256, 2]),
        ("output_norm.weight", QT.F32, [64]),
        ("output.weight", QT.F16, [64, 5]),
    ]
    for name, qt, dims in names:
        _add(w, rng, name, qt, dims)
    _finish(w)
    shards = w.format_shard_names(base)
    assert [p.name for p in shards] == [f"split-{i:05d}-of-00003.gguf" for i in (1, 2, 3)], shards
    return shards


def write_samples(outdir: Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    written: list[tuple[Path, list[Path]]] = []

    def single(name: str, fn, *args) -> None:
        p = outdir / name
        fn(p, *args)
        written.append((p, [p]))

    single("all_metadata_types.gguf", sample_all_metadata_types)
    single("no_tensors.gguf", sample_no_tensors)
    for k, a in enumerate((1, 8, 64, 256)):
        single(f"align_{a}.gguf", sample_alignment, a, 100 + k)
    std, skipped = _quant_type_list(fork=False)
    single("quant_types.gguf", sample_quant_types, std, 200)
    fork, _ = _quant_type_list(fork=True)
    single("fork_types.gguf", sample_quant_types, fork, 300)
    shards = sample_split(outdir / "split.gguf", 400)
    written.append((shards[0], shards))

    for first, shards in written:
        g = golden_for(first, summarize=False, shards=shards)
        out = first.with_name(first.name[: -len(".gguf")] + ".expected.json")
        write_json(g, out)
        for s in shards:
            print(f"{s.stat().st_size:8d}  {s.name}")
        print(f"{out.stat().st_size:8d}  {out.name}  ({len(g['tensors'])} tensors)")
    print("standard types:", " ".join(q.name for q in std))
    print("fork types (fork_types.gguf):", " ".join(q.name for q in fork))
    for name, why in skipped:
        print(f"skipped {name}: {why}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir", nargs="?", help="folder for the samples and goldens")
    ap.add_argument("--golden-for", nargs=2, metavar=("FILE.gguf", "OUT.json"),
                    help="write the golden for an existing file (arrays over 64 elements summarized)")
    args = ap.parse_args(argv)
    try:
        from importlib.metadata import version
        v = version("gguf")
        if v != EXPECTED_GGUF_VERSION:
            print(f"warning: gguf {v} installed, fixtures were made with {EXPECTED_GGUF_VERSION}", file=sys.stderr)
    except Exception:
        pass
    if args.golden_for:
        src, out = (Path(p) for p in args.golden_for)
        g = golden_for(src, summarize=True)
        write_json(g, out)
        print(f"{out}: {len(g['tensors'])} tensors")
        return 0
    if not args.outdir:
        ap.error("give an output folder or --golden-for FILE OUT")
    write_samples(Path(args.outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
