#!/usr/bin/env python3
"""Records and summary of tools/h200_peer_bench.sh (ours against llama.cpp).

    peer_summary.py rec FILE.jsonl NAME RC T0 T1 STDOUT [KEY=VALUE ...]
    peer_summary.py summary DIR          (reads DIR/ours.jsonl, DIR/llama.jsonl)

`rec` appends one line: name, rc, wall_s (T1 - T0, epoch seconds), the
extras, and `json`: the run's stdout parsed as JSON (an object or
llama-bench's array; seam load's per-tensor list left out), else null with
the tails of its stdout and stderr (STDOUT with .out replaced by .err).
`summary` takes, for each name, its last record.
"""
import json
import os
import statistics
import sys


def rec(args):
    path, name, rc, t0, t1, out = args[:6]
    r = {"name": name, "rc": int(rc), "wall_s": round(float(t1) - float(t0), 6)}
    for kv in args[6:]:
        if "=" in kv:
            k, v = kv.split("=", 1)
            try:
                v = json.loads(v)
            except ValueError:
                pass
            r[k] = v
    text = open(out, errors="replace").read() if os.path.exists(out) else ""
    try:
        j = json.loads(text)
        if isinstance(j, dict):
            j.pop("per_tensor", None)
        r["json"] = j
    except ValueError:
        r["json"] = None
        r["stdout_tail"] = text[-400:]
    err = out[:-4] + ".err" if out.endswith(".out") else out + ".err"
    if (r["json"] is None or r["rc"] != 0) and os.path.exists(err):
        r["stderr_tail"] = open(err, errors="replace").read()[-600:]
    with open(path, "a") as f:
        f.write(json.dumps(r) + "\n")


def load(path):
    last = {}
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                last[r["name"]] = r
    return last


def ok(r):
    return r is not None and r.get("rc") == 0 and r.get("json") is not None


def series(recs, prefix):
    return [r for n, r in sorted(recs.items()) if n.startswith(prefix) and ok(r)]


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, nd=3):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def bench_ts(r, gen):
    """avg_ts (and its samples) of llama-bench's decode (gen) or prefill entry."""
    if not ok(r) or not isinstance(r["json"], list):
        return None, []
    for e in r["json"]:
        if (e.get("n_gen", 0) > 0) == gen and (e.get("n_prompt", 0) > 0) != gen:
            return e.get("avg_ts"), e.get("samples_ts") or []
    return None, []


def greedy_cmp(ours_tokens, llama, label):
    """One line comparing our greedy tokens with llama.cpp's steps (greedy_top2)."""
    if ours_tokens is None or not ok(llama):
        return f"greedy vs llama.cpp {label}: not compared (a run is missing)"
    steps = llama["json"]["steps"]
    theirs = [s["token"] for s in steps]
    n = min(len(ours_tokens), len(theirs))
    for k in range(n):
        if ours_tokens[k] != theirs[k]:
            (a, la), (b, lb) = steps[k]["top2"]
            margin = None if la is None or lb is None else la - lb
            small = margin is not None and margin < 1e-3
            rel = margin / abs(la) if margin is not None and la else None
            return (f"greedy vs llama.cpp {label}: first difference at step {k} "
                    f"(ours {ours_tokens[k]}, llama.cpp {theirs[k]}); llama.cpp's top two "
                    f"{a}: {fmt(la, 6)}, {b}: {fmt(lb, 6)}, margin {fmt(margin, 6)} "
                    f"({'below' if small else 'NOT below'} 1e-3; "
                    f"{'-' if rel is None else f'{rel:.2e}'} of the top logit)\n"
                    f"  ours     {ours_tokens[:n]}\n  llama.cpp {theirs[:n]}")
    return f"greedy vs llama.cpp {label}: tokens equal for {n} steps {theirs[:n]}"


def summary(d):
    ours = load(os.path.join(d, "ours.jsonl"))
    lcp = load(os.path.join(d, "llama.jsonl"))
    out = []
    info = ours.get("info") or lcp.get("info")
    if info:
        out.append("model: " + ", ".join(f"{k} {v}" for k, v in info.items()
                                          if k not in ("name", "rc", "wall_s", "json", "stdout_tail")))

    dec = series(ours, "ours_decode_")
    o_dec = med([r["json"]["decode"]["tokens_per_second"] for r in dec])
    l_dec, l_dec_s = bench_ts(lcp.get("lb_decode"), True)

    pre = series(ours, "ours_prefill_")
    o_pre = med([r["json"]["decode"]["prompt_tokens"] / r["json"]["decode"]["prefill_seconds"]
                 for r in pre if r["json"]["decode"]["prefill_seconds"]])
    l_pre, l_pre_s = bench_ts(lcp.get("lb_prefill"), False)

    ow = series(ours, "ours_warm_")
    lw = series(lcp, "gt_warm_")
    oc, lc = ours.get("ours_cold"), lcp.get("gt_cold")
    sl = series(ours, "seam_load_")

    def wall(rs):
        return min(r["wall_s"] for r in rs) if rs else None

    def j(r, k):
        return r["json"].get(k) if ok(r) else None

    rows = [
        ("decode tokens/s (32 steps after the prompt)", o_dec, l_dec),
        ("prefill tokens/s (512-token prompt)", o_pre, l_pre),
        ("first token, warm: process wall s (best)", wall(ow), wall(lw)),
        ("first token, warm: since main s (llama.cpp in-process)", None,
         min((j(r, "first_token_seconds_since_process_start") for r in lw), default=None)),
        ("first token, cold: process wall s", oc["wall_s"] if ok(oc) else None,
         lc["wall_s"] if ok(lc) else None),
        ("first token, cold: since main s", None, j(lc, "first_token_seconds_since_process_start")),
        ("load s, warm (ours: seam load --device cuda; llama.cpp: model load, best)",
         min((r["json"]["seconds"] for r in sl), default=None),
         min((j(r, "load_seconds") for r in lw), default=None)),
        ("load s, cold (llama.cpp: model load)", None, j(lc, "load_seconds")),
    ]
    w = max(len(r[0]) for r in rows)
    out.append(f"{'':{w}}  {'ours':>10}  {'llama.cpp':>10}")
    for name, a, b in rows:
        out.append(f"{name:{w}}  {fmt(a):>10}  {fmt(b):>10}")
    if o_dec and l_dec:
        out.append(f"decode ours / llama.cpp: {o_dec / l_dec:.3f}")
    else:
        out.append("decode ours / llama.cpp: -")
    out.append("ours decode tok/s per run: " + ", ".join(
        fmt(r["json"]["decode"]["tokens_per_second"], 1) for r in dec)
        + f"; llama-bench samples: {', '.join(fmt(float(x), 1) for x in l_dec_s)}")
    out.append("ours prefill tok/s per run: " + ", ".join(
        fmt(r["json"]["decode"]["prompt_tokens"] / r["json"]["decode"]["prefill_seconds"], 1)
        for r in pre if r["json"]["decode"]["prefill_seconds"])
        + f"; llama-bench samples: {', '.join(fmt(float(x), 1) for x in l_pre_s)}")
    for label, r in (("ours", oc), ("llama.cpp", lc)):
        if r:
            out.append(f"cold {label}: Cached {r.get('cached_before_kb', '-')} -> "
                       f"{r.get('cached_after_kb', '-')} kB, drop_caches {r.get('drop', '-')}, "
                       f"file resident after drop {r.get('resident_after', '-')}")
    busy = [n for n, r in list(ours.items()) + list(lcp.items())
            if r.get("build_running") and n != "ours_check8"]
    if busy:
        out.append("timed while the llama.cpp build ran (disturbed): " + ", ".join(busy))

    chk = ours.get("ours_check8")
    ot = chk["json"].get("generated") if ok(chk) else None
    out.append(greedy_cmp(ot, lcp.get("gt_cpu8"), "CPU (ngl 0)"))
    out.append(greedy_cmp(ot, lcp.get("gt_gpu8"), "CUDA (ngl 999)"))
    out.append(greedy_cmp(ot, lcp.get("gt_cpu8_kvf32"), "CPU, F32 K/V caches"))
    g = lcp.get("gt_gpu8")
    lt = [s["token"] for s in g["json"]["steps"]] if ok(g) else None
    out.append("llama.cpp's own CUDA tokens as 'ours': "
               + greedy_cmp(lt, lcp.get("gt_cpu8"), "CPU (ngl 0)"))

    bad = [f"{n} rc={r['rc']}" for n, r in list(ours.items()) + list(lcp.items())
           if n != "info" and (r.get("rc") != 0 or r.get("json") is None)]
    if bad:
        out.append("failed or unparsed runs: " + ", ".join(bad))
    print("\n".join(out))


def main():
    if len(sys.argv) >= 8 and sys.argv[1] == "rec":
        rec(sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "summary":
        summary(sys.argv[2])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
