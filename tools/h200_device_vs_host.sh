#!/bin/bash
# Usage: BIN=DIR [DEV=cuda] bash tools/h200_device_vs_host.sh (DIR holds release
# dflash and qwen4_exp built here; DEV=fake runs it on this machine)
# dflash on the H200: the built-in draft over the built-in target, --device
# cuda against --device host (the CPU reference path): greedy tokens,
# last-position logits, speculation, weight bytes read back.
set -u
B=${BIN:?set BIN to the folder of the release binaries}; O=${OUT:-/tmp/o}; mkdir -p "$O"
source "$(dirname "$0")/h200_lib.sh"
NVRTC=$(nvrtc_ld_path)
export LD_LIBRARY_PATH=$NVRTC:${LD_LIBRARY_PATH:-}
for d in host ${DEV:-cuda}; do
  $B/dflash --device $d --steps 8 --json --dump-logits "$O/df-$d.bin" > "$O/df-$d.json" 2> "$O/df-$d.err"; echo "$d rc=$?"
done
python3 - "$O" "${DEV:-cuda}" <<'PY'
import json, struct, sys
o, dev = sys.argv[1], sys.argv[2]
def logits(p):
    b = open(p, 'rb').read(); return struct.unpack(f'<{len(b)//4}f', b)
h, c = logits(f'{o}/df-host.bin'), logits(f'{o}/df-{dev}.bin')
rh, rc = json.load(open(f'{o}/df-host.json')), json.load(open(f'{o}/df-{dev}.json'))
print('max |logit diff|', dev, 'vs host', max(abs(a - b) for a, b in zip(h, c)), 'max |logit|', max(abs(a) for a in h))
print('greedy', rc['generated'], 'host', rh['generated'])
print('family', {k: v for k, v in rc['family'].items() if k in ('speculation_on_device', 'acceptance', 'speculated', 'equal_to_target', 'tokens')})
print('decode', rc['decode']['weight_read_back_bytes'], rc['decode']['kernel_launches'], rc['device'])
PY
# the qwen4_exp built-in fixture (IQ2_XXS, IQ4_NL, Q4_K, Q6_K, Q8_0, BF16, F16) on cuda against host
for d in host ${DEV:-cuda}; do $B/qwen4_exp --device $d --steps 8 --json --dump-logits "$O/q4-$d.bin" > "$O/q4-$d.json" 2> "$O/q4-$d.err"; echo "qwen4_exp $d rc=$?"; done
python3 - "$O" "${DEV:-cuda}" <<'PY'
import json, struct, sys
o, dev = sys.argv[1], sys.argv[2]
L = lambda p: struct.unpack(f'<{len(open(p,"rb").read())//4}f', open(p,'rb').read())
h, c = L(f'{o}/q4-host.bin'), L(f'{o}/q4-{dev}.bin')
rh, rc = json.load(open(f'{o}/q4-host.json')), json.load(open(f'{o}/q4-{dev}.json'))
print('qwen4_exp fixture max |logit diff|', dev, 'vs host', max(abs(a-b) for a, b in zip(h, c)), 'max |logit|', max(abs(a) for a in h))
print('greedy', rc['generated'], 'host', rh['generated'], 'wrb', rc['decode']['weight_read_back_bytes'])
PY
