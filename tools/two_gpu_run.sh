#!/bin/bash
# The two-GPU acceptance run of issue 20, in one command on the device
# machine (nvidia-h200-x2). Expects the release binaries `seam` and `xtask`
# and tools/check_sharded.py in $BIN (default .devbin); writes its results
# under $OUT. NVLink multicast stays off.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
BIN=${BIN:-.devbin}
OUT=${OUT:-/tmp/seam-out}
mkdir -p "$OUT"
T0=$(date +%s)
stamp() { echo "== $(( $(date +%s) - T0 )) s: $*"; }

stamp machine
nvidia-smi --query-gpu=index,name,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv
nvidia-smi topo -m 2>&1 | head -8
nproc; free -g | head -2

stamp libraries
mkdir -p /tmp/seamlib
roots="/opt /usr/local /usr/lib /usr/lib64 /root"
nccl=$(find $roots \( -name 'libnccl.so.2*' -o -name 'libnccl.so' \) 2>/dev/null | head -1)
nvrtc=$(find $roots -name 'libnvrtc.so.1[2-9]*' 2>/dev/null | grep -v builtins | sort | tail -1)
echo "nccl: $nccl"; echo "nvrtc: $nvrtc"
[ -n "$nccl" ] && ln -sf "$nccl" /tmp/seamlib/libnccl.so
[ -n "$nvrtc" ] && ln -sf "$nvrtc" /tmp/seamlib/libnvrtc.so
export LD_LIBRARY_PATH=/tmp/seamlib:$(dirname "${nvrtc:-/x}"):$(dirname "${nccl:-/x}"):${LD_LIBRARY_PATH:-}
"$BIN/seam" doctor

stamp matmul check
timeout 120 "$BIN/seam" matmul-check --devices cuda:0,cuda:1 --json > "$OUT/matmul.json"; echo "rc=$?"
cat "$OUT/matmul.json"

stamp model
dir=""
for d in /var/tmp /tmp /root "$PWD"; do
  avail=$(df -BG --output=avail "$d" 2>/dev/null | tail -1 | tr -dc 0-9)
  if [ -n "$avail" ] && [ "$avail" -ge 40 ]; then dir=$d/seam-model; break; fi
done
df -BG / /tmp /var/tmp 2>/dev/null
[ -z "$dir" ] && { echo "no disk with 40 GiB free"; exit 1; }
mkdir -p "$dir"; F=${MODEL:-$dir/gen32.gguf}  # MODEL: an existing 32 GiB model to reuse
[ -f "$F" ] || timeout 330 "$BIN/xtask" gen-gguf --size 32GiB --out "$F" || exit 1
"$BIN/seam" inspect "$F" --json > /tmp/inspect.json
stamp warm the page cache
export VT_GGUF_DROP_PAGE_CACHE=0
time cat "$F" > /dev/null
free -g | head -2

load() { # NAME ARGS...: one timed load, its JSON without the per-tensor lines
  local name=$1; shift
  timeout 120 "$BIN/seam" load "$F" "$@" --json > "/tmp/$name.json" 2> "/tmp/$name.err"
  echo "rc=$? $name: $(tail -c 300 /tmp/$name.err | tr '\n' ' ' | tail -c 200)"
}
stamp loads
load one_a --device cuda:0
load one_b --device cuda:0
load s1_a --devices cuda:0
load s1_b --devices cuda:0
load s2_a --devices cuda:0,cuda:1
load s2_b --devices cuda:0,cuda:1
load one_c --device cuda:0
load s2_c --devices cuda:0,cuda:1
load s1_c --devices cuda:0
load rows --devices cuda:0,cuda:1 --shard rows
# The ring tuned for this machine (README, Measured): per device.
export VT_PINNED_H2D_LANES=4 VT_PINNED_H2D_BUFFERS=16 VT_PINNED_H2D_MIB=8 VT_PINNED_H2D_READERS=16
load one_t1 --device cuda:0
load s2_t1 --devices cuda:0,cuda:1
load one_t2 --device cuda:0
load s2_t2 --devices cuda:0,cuda:1
unset VT_PINNED_H2D_LANES VT_PINNED_H2D_BUFFERS VT_PINNED_H2D_MIB VT_PINNED_H2D_READERS
stamp hashed load
load s2_hash --devices cuda:0,cuda:1 --hash
cp /tmp/s2_hash.json "$OUT/sharded_hash.json"
stamp check against the file
timeout 180 python3 "$BIN/check_sharded.py" /tmp/s2_hash.json /tmp/inspect.json; echo "check rc=$?"

stamp summary
python3 - "$OUT/summary.json" <<'PY'
import json, sys
rows = {}
for name in ["one_a", "one_b", "one_c", "s1_a", "s1_b", "s1_c", "s2_a", "s2_b", "s2_c", "rows", "s2_hash", "one_t1", "one_t2", "s2_t1", "s2_t2"]:
    try:
        r = json.load(open(f"/tmp/{name}.json"))
    except Exception as e:
        print(f"{name}: no report ({e})"); continue
    r.pop("per_tensor", None); r.pop("samples", None)
    for rank in r.get("ranks", []):
        rank.pop("per_shard", None)
    rows[name] = r
    if "totals" in r:
        t, rss = r["totals"], r["rss"]
        print(f"{name:8} {','.join(r['devices']):15} {t['seconds']:7.3f} s {t['gbps']:6.2f} GB/s "
              f"read {t['read_bytes']} recv {t['received_bytes']} cover={t['covers_each_tensor_once']} "
              f"rss growth {rss['growth_mib']:.0f} MiB (rings {rss['rings_mib']:.0f}) peak {rss['peak_mib']:.0f}")
    else:
        rss = r["rss"]
        print(f"{name:8} {r['device']:15} {r['seconds']:7.3f} s {r['gbps']:6.2f} GB/s "
              f"rss growth {rss['peak_mib'] - rss['baseline_mib']:.0f} MiB peak {rss['peak_mib']:.0f}")
def best(names, key):
    v = [key(rows[n]) for n in names if n in rows]
    return min(v) if v else None
one = best(["one_a", "one_b", "one_c"], lambda r: r["seconds"])
s1 = best(["s1_a", "s1_b", "s1_c"], lambda r: r["totals"]["seconds"])
s2 = best(["s2_a", "s2_b", "s2_c"], lambda r: r["totals"]["seconds"])
if one and s2:
    print(f"warm: one GPU (seam load --device cuda:0) {one:.3f} s; one GPU (--devices cuda:0) {s1:.3f} s; "
          f"two GPUs {s2:.3f} s; ratio {s2 / one:.3f} (vs --device), {s2 / s1:.3f} (vs --devices cuda:0)")
one_t = best(["one_t1", "one_t2"], lambda r: r["seconds"])
s2_t = best(["s2_t1", "s2_t2"], lambda r: r["totals"]["seconds"])
if one_t and s2_t:
    print(f"warm, tuned ring: one GPU {one_t:.3f} s; two GPUs {s2_t:.3f} s; ratio {s2_t / one_t:.3f}")
json.dump(rows, open(sys.argv[1], "w"), indent=1)
PY
stamp done
