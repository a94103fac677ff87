#!/bin/bash
# Usage (repository root, on the GPU machine; release binaries built here,
# stripped into an ignored folder and carried):
#   BIN=.devbin LAYERS=20 bash tools/h200_decode_bench.sh
# BIN holds qwen4_exp and gpu_ops (the GPU op test:
# `cargo test --release -p platform-cuda --features gpu-tests --test gpu_ops
# --no-run`, the binary under target/release/deps/).
# 1. the op-by-op check of every CUDA kernel against the CPU reference;
# 2. qwen4_exp --device cuda on the llama.cpp goldens, experts staged on
#    pick and all at load: greedy tokens and last-position logits;
# 3. a generated model of the public checkpoint's sizes (LAYERS layers):
#    decode tokens/s with --stage all and on pick, and the per-kernel
#    device times (SEAM_CUDA_KERNEL_TIMES=1) of a short --stage all run.
# Everything goes to $OUT (summary.txt and the logs).
set -u
B=${BIN:?set BIN to the folder of the binaries}; O=${OUT:-/tmp/o}; mkdir -p "$O"
LAYERS=${LAYERS:-20}
S=$O/summary.txt
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$S"; }
source "$(dirname "$0")/h200_lib.sh"
NVRTC=$(nvrtc_ld_path)
export LD_LIBRARY_PATH=$NVRTC:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$S"

say "gpu_ops"
timeout 240 "$B/gpu_ops" --nocapture > "$O/gpu_ops.log" 2>&1; say "gpu_ops rc=$?"
grep -E 'FAIL|cases ok|launches|panicked' "$O/gpu_ops.log" | head -20 | tee -a "$S"

P=5,17,99,3,0,42,7,7,64,1,0,0,9,120,33,2,5,17,99,3
for m in llama-archs-d05 mixed; do
  for st in picked all; do
    timeout 120 "$B/qwen4_exp" "tests/data/qwen4exp/$m.gguf" --device cuda --stage $st --tokens $P --steps 6 \
      --json --dump-logits "$O/$m-$st.bin" > "$O/$m-$st.json" 2>> "$O/goldens.err"
    say "$m --stage $st rc=$?"
  done
done
python3 - "$O" <<'PY' | tee -a "$S"
import json, struct, sys, os
o = sys.argv[1]
for m in ['llama-archs-d05', 'mixed']:
    g = json.loads(open(f'tests/data/qwen4exp/{m}.golden.json').read().replace('-Infinity', 'null').replace('Infinity', 'null').replace('NaN', 'null'))
    for st in ('picked', 'all'):
        p = f'{o}/{m}-{st}.bin'
        if not os.path.exists(p) or not os.path.getsize(p):
            print(m, st, 'no logits'); continue
        b = open(p, 'rb').read(); ours = struct.unpack(f'<{len(b)//4}f', b)
        rows = [g['step_logits'][5]]
        inc = (g.get('incremental') or {}).get('step_logits')
        if inc: rows.append(inc[5])
        d = min(max(abs(a-b) for a, b in zip(ours, r)) for r in rows)
        r = json.load(open(f'{o}/{m}-{st}.json'))
        print(f"{m} --stage {st}: max |logit diff| to llama.cpp {d:.3e}; greedy {r['generated']} golden {g['greedy'][:6]}; weight_read_back {max(r['decode']['weight_read_back_bytes'])}")
PY

F=/tmp/gen$LAYERS.gguf
say "writing the generated model ($LAYERS layers)"
[ -s "$F" ] || timeout 300 "$B/qwen4_exp" --write-generated "$F" --layers "$LAYERS" > "$O/gen.log" 2>&1
ls -la "$F" | tee -a "$S"
say "decode --stage all"
timeout 150 "$B/qwen4_exp" "$F" --device cuda --stage all --tokens 1,2,3 --steps 17 --json > "$O/all.json" 2> "$O/all.err"; say "rc=$?"
say "decode --stage all, kernel times"
SEAM_CUDA_KERNEL_TIMES=1 timeout 150 "$B/qwen4_exp" "$F" --device cuda --stage all --tokens 1,2,3 --steps 5 --json > "$O/times.json" 2> "$O/times.err"; say "rc=$?"
say "decode --stage picked"
timeout 150 "$B/qwen4_exp" "$F" --device cuda --tokens 1,2,3 --steps 9 --json > "$O/picked.json" 2> "$O/picked.err"; say "rc=$?"
python3 - "$O" <<'PY' | tee -a "$S"
import json, sys
o = sys.argv[1]
for n in ('all', 'times', 'picked'):
    try:
        r = json.load(open(f'{o}/{n}.json'))
    except Exception as e:
        print(n, 'no report', e); continue
    d = r['decode']
    print(f"{n}: stage {d['stage']} generated {r['generated']} prefill {d['prefill_seconds']:.3f}s, {d['tokens_per_second']} tok/s, launches/step {d['kernel_launches'][-1]}, read back/step {d['read_back_bytes'][-1]}, weight read back {max(d['weight_read_back_bytes'])}, mapping rss peak {(r.get('decode_residency') or {}).get('mapping_rss_peak_mib')} MiB")
PY
grep -A25 'kernel times' "$O/times.err" | head -30 | tee -a "$S"
# Our paths against each other on a 2-layer model: the host path, and the
# device path with both stagings (greedy tokens).
G=/tmp/gen2.gguf
[ -s "$G" ] || timeout 120 "$B/qwen4_exp" --write-generated "$G" --layers 2 > /dev/null 2>&1
for dv in "host picked" "cuda picked" "cuda all"; do
  set -- $dv
  timeout 120 "$B/qwen4_exp" "$G" --device $1 --stage $2 --tokens 1,2,3 --steps 4 --json 2>/dev/null \
    | python3 -c "import json,sys; r=json.load(sys.stdin); print('2 layers, $1 --stage $2:', r['generated'])" | tee -a "$S"
done
# A process's start to its first token, the kernels compiled (first) and
# read from the kernel cache (second).
for i in 1 2; do
  s0=$(date +%s.%N)
  timeout 120 "$B/qwen4_exp" "$F" --device cuda --stage all --tokens 1,2,3 --steps 1 > /dev/null 2>&1
  echo "first token, process wall, run $i: $(python3 -c "print(round($(date +%s.%N) - $s0, 2))") s" | tee -a "$S"
done
for f in all.err picked.err; do tail -n 2 "$O/$f"; done | tee -a "$S"
say "done"
