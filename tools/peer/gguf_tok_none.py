#!/usr/bin/env python3
"""Rewrite a GGUF's `tokenizer.ggml.model` value `test` to `none`, in place.

    python3 tools/peer/gguf_tok_none.py FILE.gguf

llama.cpp refuses a file whose tokenizer model is `test` and that has no
tokens; with `none` it builds a dummy vocabulary of `vocab_size` tokens.
Only those four bytes change (no copy of a 23 GiB file). The header is
parsed to the end of the metadata; the key with its string value `test` must
occur exactly once there as raw bytes, else nothing is written (exit 2).
A file already at `none` is left as is (exit 0), so reruns are harmless.
"""
import os
import struct
import sys

KEY = b"tokenizer.ggml.model"
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def kv_section(f):
    """(bytes of the header up to the end of the metadata, {key: (type, value offset)})."""
    buf = bytearray()

    def need(n):
        while len(buf) < n:
            chunk = f.read(max(1 << 20, n - len(buf)))
            if not chunk:
                raise SystemExit("truncated GGUF header")
            buf.extend(chunk)

    def u(fmt, off):
        n = struct.calcsize(fmt)
        need(off + n)
        return struct.unpack_from(fmt, buf, off)[0], off + n

    need(24)
    if bytes(buf[:4]) != b"GGUF":
        raise SystemExit("not a GGUF file")
    n_kv, off = u("<Q", 16)
    keys = {}

    def skip(t, off):
        if t in SIZES:
            return off + SIZES[t]
        if t == 8:
            n, off = u("<Q", off)
            return off + n
        if t == 9:
            et, off = u("<I", off)
            n, off = u("<Q", off)
            if et in SIZES:
                return off + n * SIZES[et]
            for _ in range(n):
                off = skip(et, off)
            return off
        raise SystemExit(f"unknown metadata type {t}")

    for _ in range(n_kv):
        klen, off = u("<Q", off)
        need(off + klen)
        key = bytes(buf[off:off + klen])
        off += klen
        t, off = u("<I", off)
        keys[key] = (t, off)
        off = skip(t, off)
        need(off)
    return bytes(buf[:off]), keys


def main():
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    path = sys.argv[1]
    with open(path, "r+b") as f:
        head, keys = kv_section(f)
        if KEY not in keys or keys[KEY][0] != 8:
            print(f"{path}: no string key {KEY.decode()}", file=sys.stderr)
            sys.exit(2)
        voff = keys[KEY][1]
        n = struct.unpack_from("<Q", head, voff)[0]
        val = head[voff + 8:voff + 8 + n]
        if val == b"none":
            print(f"{path}: {KEY.decode()} is already none")
            return
        pat = KEY + struct.pack("<IQ", 8, 4) + b"test"
        hits = head.count(pat)
        if val != b"test" or hits != 1:
            print(f"{path}: {KEY.decode()} = {val!r}, pattern found {hits} times: not rewritten",
                  file=sys.stderr)
            sys.exit(2)
        at = head.index(pat) + len(pat) - 4
        assert at == voff + 8
        f.seek(at)
        f.write(b"none")
        f.flush()
        os.fsync(f.fileno())
    print(f"{path}: {KEY.decode()} test -> none at byte {at}")


if __name__ == "__main__":
    main()
