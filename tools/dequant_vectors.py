#!/usr/bin/env python3
"""Dequantization test vectors for family-ops, with gguf-py as the oracle.

Usage:
    python3 tools/dequant_vectors.py tests/data/dequant
        (re)write TYPE.bin for every type below and index.json there.
    python3 tools/dequant_vectors.py --rust-grids families/ops/src/grids.rs
        (re)write the IQ lattice tables of family-ops from gguf-py's grids.

For each ggml type the oracle can dequantize, TYPE.bin holds a few blocks of
deterministic pseudo-random bytes followed by the f32 values (little-endian)
that ``gguf.quants.dequantize`` (PyPI gguf, pinned 0.19.0) turns them into.
index.json lists, per type, the block count, where the input ends and the
output starts, and the file's sha256.

What the blocks contain:
- block 0 is all zero bytes, block 1 all 0xFF, block 2 all 0x55, block 3
  all 0xAA (bit patterns that hit the extreme codes), with their f16 scale
  fields set to 1.0 where the pattern would make them NaN/Inf;
- the rest are bytes from a sha256 counter stream (seeded by the type
  name), so nothing depends on numpy's generators or on the platform;
- for the IQ types with lattice grids, the grid indices of extra blocks
  sweep the whole grid in order, so every grid entry is checked once;
- any block that gguf-py dequantizes to a NaN or Inf gets new bytes
  (another draw of the stream): scales are f16 or e8m0 fields, and random
  bits can be NaN/Inf there. For F16/BF16/F32 the same applies per element.

Deterministic: two runs give byte-identical files.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Callable

import numpy as np

import gguf
import gguf.quants
from gguf import GGMLQuantizationType as QT

EXPECTED_GGUF_VERSION = "0.19.0"

# Elements per block of the types with 32-element blocks get this many
# blocks; the others scale so each file stays a few KiB (see n_blocks_for).
TYPES: list[str] = [
    "F32", "F16", "BF16",
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
    "IQ4_NL", "IQ4_XS",
    "TQ1_0", "TQ2_0", "MXFP4", "NVFP4",
]

# Byte offsets of the f16 scale fields in one block, used only to repair the
# fixed bit-pattern blocks (random blocks are redrawn instead).
F16_SCALE_OFFSETS: dict[str, list[int]] = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2],
    "Q6_K": [208], "IQ2_XXS": [0], "IQ2_XS": [0], "IQ2_S": [0],
    "IQ3_XXS": [0], "IQ3_S": [0], "IQ1_S": [0], "IQ4_NL": [0],
    "IQ4_XS": [0], "TQ1_0": [52], "TQ2_0": [64],
}

ONE_F16 = b"\x00\x3c"


class Stream:
    """Pseudo-random bytes: sha256(label | counter), concatenated."""

    def __init__(self, label: str) -> None:
        self.label = label.encode()
        self.counter = 0
        self.buf = b""

    def take(self, n: int) -> bytes:
        while len(self.buf) < n:
            h = hashlib.sha256(self.label + b"|" + self.counter.to_bytes(8, "little"))
            self.buf += h.digest()
            self.counter += 1
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def sizes(name: str) -> tuple[int, int]:
    return gguf.GGML_QUANT_SIZES[QT[name]]


def dequant(name: str, raw: bytes) -> np.ndarray:
    arr = np.frombuffer(raw, dtype=np.uint8).copy()
    with np.errstate(all="ignore"):
        vals = gguf.quants.dequantize(arr, QT[name])
    vals = np.asarray(vals, dtype=np.float32).reshape(-1)
    return vals


def finite(name: str, raw: bytes) -> bool:
    return bool(np.all(np.isfinite(dequant(name, raw))))


# --- grid index placement for the lattice types ---------------------------
# Each function writes grid indices idx[0..n) into one block (bytearray) at
# the positions the type's layout keeps them, leaving the other bits as
# drawn. Returns how many indices one block holds.

def _put_iq2_xxs(b: bytearray, idx: list[int]) -> None:
    # qs: 8 pairs of u32 after d; the first u32 of a pair is 4 byte indices.
    for k, v in enumerate(idx):
        b[2 + 8 * (k // 4) + k % 4] = v


def _put_iq2_xs(b: bytearray, idx: list[int]) -> None:
    # qs: 32 u16 after d; index = low 9 bits, sign index = high 7 bits.
    for k, v in enumerate(idx):
        (old,) = struct.unpack_from("<H", b, 2 + 2 * k)
        struct.pack_into("<H", b, 2 + 2 * k, (old & 0xFE00) | v)


def _put_iq2_s(b: bytearray, idx: list[int]) -> None:
    # qs low 8 bits at 2..34, high 2 bits in qh at 66..74 (4 per byte).
    for k, v in enumerate(idx):
        b[2 + k] = v & 0xFF
        sh = 2 * (k % 4)
        b[66 + k // 4] = (b[66 + k // 4] & ~(3 << sh) & 0xFF) | ((v >> 8) << sh)


def _put_iq3_xxs(b: bytearray, idx: list[int]) -> None:
    for k, v in enumerate(idx):
        b[2 + k] = v


def _put_iq3_s(b: bytearray, idx: list[int]) -> None:
    # qs low 8 bits at 2..66, ninth bit in qh at 66..74 (8 per byte).
    for k, v in enumerate(idx):
        b[2 + k] = v & 0xFF
        sh = k % 8
        b[66 + k // 8] = (b[66 + k // 8] & ~(1 << sh) & 0xFF) | ((v >> 8) << sh)


def _put_iq1_s(b: bytearray, idx: list[int]) -> None:
    # qs low 8 bits at 2..34; qh u16[8] at 34..50 holds 3 high bits per index.
    for k, v in enumerate(idx):
        b[2 + k] = v & 0xFF
        off = 34 + 2 * (k // 4)
        sh = 3 * (k % 4)
        (old,) = struct.unpack_from("<H", b, off)
        struct.pack_into("<H", b, off, (old & ~(7 << sh) & 0xFFFF) | ((v >> 8) << sh))


def _put_iq1_m(b: bytearray, idx: list[int]) -> None:
    # qs low 8 bits at 0..32; qh at 32..48 holds a nibble per index whose
    # low 3 bits are the index's high bits (bit 3 is the delta sign).
    for k, v in enumerate(idx):
        b[k] = v & 0xFF
        sh = 4 * (k % 2)
        b[32 + k // 2] = (b[32 + k // 2] & ~(7 << sh) & 0xFF) | ((v >> 8) << sh)


# type -> (grid entries, indices per block, placement)
GRID_SWEEPS: dict[str, tuple[int, int, Callable[[bytearray, list[int]], None]]] = {
    "IQ2_XXS": (256, 32, _put_iq2_xxs),
    "IQ2_XS": (512, 32, _put_iq2_xs),
    "IQ2_S": (1024, 32, _put_iq2_s),
    "IQ3_XXS": (256, 64, _put_iq3_xxs),
    "IQ3_S": (512, 64, _put_iq3_s),
    "IQ1_S": (2048, 32, _put_iq1_s),
    "IQ1_M": (2048, 32, _put_iq1_m),
}


def n_random_blocks(name: str) -> int:
    block, _ = sizes(name)
    if block == 1:
        return 256
    return max(4, 1024 // block)


def make_blocks(name: str) -> bytes:
    block, tsize = sizes(name)
    stream = Stream(f"dequant:{name}")
    blocks: list[bytes] = []

    def redraw_until_finite(fill: Callable[[bytearray], None]) -> bytes:
        for _ in range(10_000):
            b = bytearray(stream.take(tsize))
            fill(b)
            if finite(name, bytes(b)):
                return bytes(b)
        raise RuntimeError(f"no finite block for {name}")

    if block > 1:
        for pattern in (0x00, 0xFF, 0x55, 0xAA):
            b = bytearray([pattern] * tsize)
            if not finite(name, bytes(b)):
                for off in F16_SCALE_OFFSETS.get(name, []):
                    b[off:off + 2] = ONE_F16
            if finite(name, bytes(b)):
                blocks.append(bytes(b))
    for _ in range(n_random_blocks(name)):
        blocks.append(redraw_until_finite(lambda b: None))
    if name in GRID_SWEEPS:
        entries, per_block, put = GRID_SWEEPS[name]
        for start in range(0, entries, per_block):
            idx = list(range(start, start + per_block))
            blocks.append(redraw_until_finite(lambda b, idx=idx: put(b, idx)))
    return b"".join(blocks)


def write_vectors(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    index = {
        "generator": "tools/dequant_vectors.py",
        "oracle": f"gguf.quants.dequantize (gguf {gguf_version()})",
        "layout": "TYPE.bin = input bytes, then the expected f32 values (little-endian)",
        "types": [],
    }
    total = 0
    for name in TYPES:
        block, tsize = sizes(name)
        raw = make_blocks(name)
        vals = dequant(name, raw)
        n_blocks = len(raw) // tsize
        assert len(raw) == n_blocks * tsize
        assert vals.shape == (n_blocks * block,), (name, vals.shape)
        assert np.all(np.isfinite(vals)), name
        data = raw + vals.astype("<f4").tobytes()
        (out_dir / f"{name}.bin").write_bytes(data)
        total += len(data)
        index["types"].append({
            "type": name,
            "id": int(QT[name]),
            "block_size": block,
            "type_size": tsize,
            "n_blocks": n_blocks,
            "input_bytes": len(raw),
            "n_values": int(vals.size),
            "sha256": hashlib.sha256(data).hexdigest(),
        })
    (out_dir / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    print(f"wrote {len(TYPES)} types, {total} bytes, to {out_dir}")


# --- Rust grid tables -------------------------------------------------------

RUST_GRIDS = [
    # (Rust name, gguf-py class, ggml's C name, Rust element type, values/entry)
    ("IQ2XXS_GRID", "IQ2_XXS", "iq2xxs_grid", "u64", 8),
    ("IQ2XS_GRID", "IQ2_XS", "iq2xs_grid", "u64", 8),
    ("IQ2S_GRID", "IQ2_S", "iq2s_grid", "u64", 8),
    ("IQ3XXS_GRID", "IQ3_XXS", "iq3xxs_grid", "u32", 4),
    ("IQ3S_GRID", "IQ3_S", "iq3s_grid", "u32", 4),
    ("IQ1S_GRID", "IQ1_S", "iq1s_grid", "u64", 8),
]


def write_rust_grids(path: Path) -> None:
    lines = [
        "//! The lattice grids of the IQ types, as ggml stores them: one integer",
        "//! per grid entry, its bytes (least significant first) the entry's",
        "//! values (unsigned magnitudes for IQ2/IQ3, `i8` -1/0/1 for IQ1).",
        "//!",
        "//! Generated by `python3 tools/dequant_vectors.py --rust-grids` from the",
        f"//! grids of gguf-py {gguf_version()} (`gguf.quants`), which are ggml's",
        "//! tables re-encoded; do not edit by hand.",
        "",
    ]
    for rust_name, cls_name, c_name, ty, per in RUST_GRIDS:
        cls = getattr(gguf.quants, cls_name)
        cls.init_grid()
        grid = np.asarray(cls.grid).reshape(cls.grid_shape)
        assert grid.shape[1] == per
        words = []
        for row in grid:
            word = 0
            for j, v in enumerate(row):
                iv = int(v)
                assert float(iv) == float(v)
                word |= (iv & 0xFF) << (8 * j)
            words.append(word)
        width = 16 if ty == "u64" else 8
        per_line = 4 if ty == "u64" else 8
        lines.append(f"/// ggml's `{c_name}` ({len(words)} entries).")
        lines.append("#[rustfmt::skip]")
        lines.append(f"pub static {rust_name}: [{ty}; {len(words)}] = [")
        for i in range(0, len(words), per_line):
            chunk = ", ".join(f"0x{w:0{width}x}" for w in words[i:i + per_line])
            lines.append(f"    {chunk},")
        lines.append("];")
        lines.append("")
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


def gguf_version() -> str:
    from importlib.metadata import version
    return version("gguf")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", nargs="?", type=Path, help="where TYPE.bin and index.json go")
    ap.add_argument("--rust-grids", type=Path, help="write the Rust grid tables to this file")
    args = ap.parse_args()
    if gguf_version() != EXPECTED_GGUF_VERSION:
        print(f"warning: gguf {gguf_version()} installed, vectors are pinned to {EXPECTED_GGUF_VERSION}",
              file=sys.stderr)
    if args.rust_grids is None and args.out_dir is None:
        ap.error("give an output directory or --rust-grids")
    if args.rust_grids is not None:
        write_rust_grids(args.rust_grids)
    if args.out_dir is not None:
        write_vectors(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
