#!/bin/bash
# Usage (repository root, on the GPU machine; binaries built here and carried in an
# ignored folder): BIN=DIR bash tools/h200_qwen4_exp_decode.sh
# qwen4_exp --device cuda on the H200: the F32 and mixed goldens (greedy
# tokens and last-position logits against llama.cpp's), then a generated
# model of the public checkpoint's sizes (2 layers) for decode figures.
set -u
B=${BIN:?set BIN to the folder of the release binaries}; O=${OUT:-/tmp/o}; mkdir -p "$O"
source "$(dirname "$0")/h200_lib.sh"
NVRTC=$(nvrtc_ld_path)
export LD_LIBRARY_PATH=$NVRTC:${LD_LIBRARY_PATH:-}
P=5,17,99,3,0,42,7,7,64,1,0,0,9,120,33,2,5,17,99,3
for m in llama-archs-d05 mixed; do
  for s in 1 6; do
    $B/qwen4_exp tests/data/qwen4exp/$m.gguf --device cuda --tokens $P --steps $s --json --dump-logits "$O/$m-$s.bin" > "$O/$m-$s.json" 2> "$O/$m-$s.err"
    echo "$m steps $s rc=$?"
  done
done
python3 - "$O" <<'PY'
import json, struct, sys, os
o = sys.argv[1]
for m in ['llama-archs-d05', 'mixed']:
    g = json.loads(open(f'tests/data/qwen4exp/{m}.golden.json').read().replace('-Infinity', 'null').replace('Infinity', 'null').replace('NaN', 'null'))
    for s in (1, 6):
        p = f'{o}/{m}-{s}.bin'
        if not os.path.exists(p) or not os.path.getsize(p):
            print(m, s, 'no logits'); continue
        b = open(p, 'rb').read(); ours = struct.unpack(f'<{len(b)//4}f', b)
        rows = [g['step_logits'][s-1]]
        inc = (g.get('incremental') or {}).get('step_logits')
        if inc: rows.append(inc[s-1])
        d = min(max(abs(a-b) for a, b in zip(ours, r)) for r in rows)
        r = json.load(open(f'{o}/{m}-{s}.json'))
        print(f"{m} steps {s}: max |logit diff| to llama.cpp {d:.3e}; greedy {r['generated']} golden {g['greedy'][:s]}; decode {r['decode']['tokens_per_second']} tok/s, weight_read_back {r['decode']['weight_read_back_bytes']}, launches/step {r['decode']['kernel_launches'][-1]}, device {r['device']}")
PY
timeout 150 $B/qwen4_exp --write-generated /tmp/g2.gguf --layers 2 > "$O/gen.txt" 2>&1; ls -la /tmp/g2.gguf
timeout 200 $B/qwen4_exp /tmp/g2.gguf --device cuda --tokens 1,2,3 --steps 8 --json > "$O/g2-cuda.json" 2> "$O/g2-cuda.err"; echo "g2 rc=$?"
python3 -c "import json;r=json.load(open('$O/g2-cuda.json'));d=r['decode'];print('g2 cuda', r['generated'], d['prefill_seconds'], d['seconds'], d['tokens_per_second'], d['weight_read_back_bytes'], d['read_back_bytes'])"
tail -3 "$O/g2-cuda.err"
