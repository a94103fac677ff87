#!/usr/bin/env python3
"""Checks a sharded load's report against the model file itself.

Usage: check_sharded.py REPORT.json INSPECT.json

REPORT.json is `seam load FILE --devices A,B --hash --json`; INSPECT.json is
`seam inspect FILE --json`. Checks, independently of seam's own accounting:
- every shard's sha256 equals the sha256 of the file's bytes at its
  absolute range (hashed here, from the file, in parallel);
- the split shards of each tensor partition the tensor's bytes (each byte on
  exactly one rank), and each replicated tensor is on every rank, read from
  the file by exactly one rank and received by the others;
- the ranks read, together, exactly the model's tensor bytes.
Prints one line per check and exits 1 when any fails.
"""
import hashlib
import json
import sys
from concurrent.futures import ProcessPoolExecutor

CHUNK = 16 << 20


def sha_of(args):
    path, start, end = args
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(start)
        left = end - start
        while left:
            b = f.read(min(CHUNK, left))
            if not b:
                raise SystemExit(f"{path}: short read at {end - left}")
            h.update(b)
            left -= len(b)
    return h.hexdigest()


def main():
    report = json.load(open(sys.argv[1]))
    inspect = json.load(open(sys.argv[2]))
    path = report["file"]
    tensors = {t["name"]: t for t in inspect["tensors"]}
    ok = True

    def check(cond, line):
        nonlocal ok
        ok &= bool(cond)
        print(("PASS " if cond else "FAIL ") + line)

    shards = [(r["rank"], s) for r in report["ranks"] for s in r["per_shard"]]
    jobs = [(path, s["file_bytes"][0], s["file_bytes"][1]) for _, s in shards]
    with ProcessPoolExecutor() as pool:
        want = list(pool.map(sha_of, jobs, chunksize=4))
    bad = [(r, s["name"]) for (r, s), w in zip(shards, want) if s.get("sha256") != w]
    check(not bad and len(shards) > 0,
          f"{len(shards)} shard hashes equal the file's bytes at their ranges ({len(bad)} differ: {bad[:3]})")

    n = len(report["ranks"])
    by_name = {}
    for r, s in shards:
        by_name.setdefault(s["name"], []).append((r, s))
    cover_bad = []
    for name, t in tensors.items():
        got = by_name.get(name, [])
        start, end = t["offset"], t["offset"] + t["n_bytes"]
        whole = [s for _, s in got if s["part"] == "whole"]
        if whole:
            ranks = sorted(r for r, s in got)
            readers = [r for r, s in got if s["source"] == "file"]
            if (ranks != list(range(n)) or len(readers) != 1
                    or any(s["file_bytes"] != [start, end] for s in whole)):
                cover_bad.append(name)
            continue
        spans = sorted(tuple(s["file_bytes"]) for _, s in got)
        at = start
        for a, b in spans:
            if a != at:
                break
            at = b
        if at != end or any(s["source"] != "file" for _, s in got):
            cover_bad.append(name)
    check(not cover_bad and len(by_name) == len(tensors),
          f"{len(tensors)} tensors: split ones partitioned over the ranks, replicated ones on every rank "
          f"and read by one ({len(cover_bad)} wrong: {cover_bad[:3]})")

    t = report["totals"]
    model_bytes = sum(x["n_bytes"] for x in tensors.values())
    check(t["read_bytes"] == model_bytes == t["bytes"],
          f"bytes read from the file over all ranks {t['read_bytes']} == model tensor bytes {model_bytes}")
    check(t["received_bytes"] == t["replicated_bytes"] * (n - 1),
          f"bytes received by broadcast {t['received_bytes']} == replicated {t['replicated_bytes']} x {n - 1}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
