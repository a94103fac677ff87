#!/bin/bash
# The issue-19 benchmark on the H200 machine, in one command within 540 s:
# generates a 32 GiB model, then runs the sections named in $1 (comma-
# separated, in that order; default all):
#   gen             xtask gen-gguf --size 32GiB (skipped when the file exists)
#   warm            seam bench, median of 3: read ceiling, pinned h2d, default
#                   (no knob), buffered ring, registered windows, naive
#   hash            registered path (VT_REGISTERED_WINDOWS=on): every tensor's
#                   device sha256 against `seam inspect --hash`
#   cold            seam bench, median of 3, caches dropped before each run:
#                   read ceiling, default, direct (4 readers)
#   naive-cold      one cold naive run (for the ratio)
#   reload          three back-to-back `seam load` with no knob set (issue
#                   26), each one's process wall, GB/s and page-cache
#                   decision, then `seam bench --paths reload-warm`
# Each section is skipped (and says so in $OUT/sections.txt) when the time
# left cannot hold its estimate; every command runs under `timeout`.
# Usage (from the repository root): bash .devbin/bench_h200.sh [SECTIONS]
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=${BIN:-.devbin}; O=${OUT:-/tmp/o}; mkdir -p "$O"
F=${BENCH_FILE:-/tmp/m32.gguf}
SECTIONS=${1:-gen,warm,hash,cold,naive-cold}
BUDGET=${BUDGET_S:-540}
T0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - T0))); }
note() { echo "$(($(date +%s) - T0))s $*" | tee -a "$O/sections.txt"; }
# Unset every ring knob so "default" means no knob.
for v in $(env | grep -o '^VT_[A-Z0-9_]*'); do unset "$v"; done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$O/gpu.txt" 2>&1
nproc > "$O/nproc.txt"; grep -E 'MemTotal|MemAvailable' /proc/meminfo >> "$O/nproc.txt"
df -h "$(dirname "$F")" >> "$O/nproc.txt"
run() { # NAME ESTIMATE_S COMMAND...
  local name=$1 est=$2; shift 2
  if [ "$(left)" -lt "$est" ]; then note "SKIP $name (needs ~${est}s, $(left)s left)"; return 1; fi
  note "START $name"
  timeout "$(left)" "$@"; local rc=$?
  note "END $name rc=$rc"; return $rc
}
DEV=${DEVICE:-cuda:0}
THREADS=${THREADS:-$(nproc)}  # the read ceiling with one thread per core
BENCH="$B/seam bench $F --device $DEV --threads $THREADS --repeat 3 --json"
IFS=, read -ra want <<< "$SECTIONS"
for s in "${want[@]}"; do
  case $s in
    gen) if [ -f "$F" ]; then note "gen: $F exists"; else
           run gen 120 "$B/xtask" gen-gguf --size 32GiB --out "$F" > "$O/gen.txt" 2>&1; sync; fi ;;
    warm) run warm 90 bash -c "$BENCH --paths read-warm,h2d,default-warm,buffered-warm,registered-warm,naive-warm > $O/warm.json 2> $O/warm.err" ;;
    hash) run hash 90 bash -c "VT_REGISTERED_WINDOWS=on $B/seam load $F --device $DEV --hash --json > /tmp/reg.json 2> $O/hash.err && $B/seam inspect $F --hash --json > /tmp/insp.json" &&
          python3 - "$O/hash.json" <<'PY'
import json, sys
i = json.load(open('/tmp/insp.json')); l = json.load(open('/tmp/reg.json'))
ih = {t['name']: t['sha256'] for t in i['tensors']}
lh = {t['name']: t['sha256'] for t in l['per_tensor']}
out = {'tensors': len(ih), 'equal': sum(ih[k] == lh.get(k) for k in ih),
       'gbps_with_hashing': l['gbps'], 'ring': l.get('ring'), 'policy_line': l['policy_line'],
       'rss': l['rss']}
json.dump(out, open(sys.argv[1], 'w'), indent=1); print(out['tensors'], 'tensors,', out['equal'], 'equal hashes')
PY
          ;;
    cold) run cold 200 bash -c "$BENCH --paths read-cold,default-cold,direct-cold > $O/cold.json 2> $O/cold.err" ;;
    naive-cold) run naive-cold 30 bash -c "$B/seam bench $F --device $DEV --threads $THREADS --repeat 1 --json --paths naive-cold > $O/naive_cold.json 2> $O/naive_cold.err" ;;
    reload) run reload 60 bash -c '
          for i in 1 2 3; do
            t0=$(date +%s.%N)
            "$0" load "$1" --device "$2" --json > "$3/reload$i.json" 2>> "$3/reload.err"
            awk -v a="$(date +%s.%N)" -v b="$t0" -v i="$i" "BEGIN{printf \"%d %.3f s wall\\n\", i, a - b}" >> "$3/reload_wall.txt"
          done' "$B/seam" "$F" "$DEV" "$O" &&
        run reload-bench 60 bash -c "$BENCH --paths reload-warm > $O/reload_bench.json 2> $O/reload_bench.err" ;;
    *) note "unknown section $s" ;;
  esac
done
python3 - "$O" <<'PY'
import json, os, sys
o = sys.argv[1]; acc = {}
for i in (1, 2, 3):
    p = os.path.join(o, f'reload{i}.json')
    if os.path.exists(p) and os.path.getsize(p):
        j = json.load(open(p))
        acc.setdefault('reload', []).append({'seconds': j['seconds'], 'gbps': j['gbps'],
            'drop_page_cache': j['policy']['drop_page_cache'], 'rss': j['rss']})
for f in ['warm.json', 'cold.json', 'naive_cold.json', 'reload_bench.json']:
    p = os.path.join(o, f)
    if os.path.exists(p) and os.path.getsize(p):
        j = json.load(open(p))
        acc[f] = {k: v for k, v in j['acceptance'].items() if v is not None}
        acc[f]['medians_gbps'] = {k: v['gbps']['median'] for k, v in j['paths'].items() if 'gbps' in v}
        acc[f]['cpu_s_per_gib'] = {k: v['cpu_seconds_per_gib']['median'] for k, v in j['paths'].items() if 'cpu_seconds_per_gib' in v}
        acc[f]['host_growth_max_mib'] = {k: v['host_growth_mib']['max'] for k, v in j['paths'].items() if 'host_growth_mib' in v}
json.dump(acc, open(os.path.join(o, 'summary.json'), 'w'), indent=1)
print(json.dumps(acc, indent=1))
PY
note "done"
