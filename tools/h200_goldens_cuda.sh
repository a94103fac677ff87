#!/bin/bash
# Issues 25 and 28, "on mixed-type goldens no farther from llama.cpp's CPU
# logits than llama.cpp's own CUDA build is on the same file, measured in the
# same run": for every generated golden of FAMILY (tests/data/DIR/gen-*; the
# flash-attention ones, `-fa`, are skipped: the device path has none) and
# each of its one-token runs (f32 and f16 caches), the largest difference to
# llama.cpp's CPU logits at every position of llama.cpp's CUDA build
# (tools/oracle/dump_tensors.cpp, every layer offloaded) and of ours (the
# family's device path, its gpu_goldens test binary).
#
# Usage (repository root, on the GPU machine, after tools/h200_peer_bench.sh
# built llama.cpp with CUDA into /tmp/peer/build in the same machine session):
#   BIN=.devbin [FAMILY=qwen4_exp|glm_moe_dsa|glm5_next|muse_glimmer] bash tools/h200_goldens_cuda.sh
# BIN holds xtask (for `generated-model --golden`) and the family's
# gpu_goldens test binary (built here: `cargo test --release -p FAMILY
# --features gpu-tests --test gpu_goldens --no-run`), plain or .gz, named
# gpu_goldens (qwen4_exp), gpu_goldens_dsa, gpu_goldens_glm5 or
# gpu_goldens_muse. $OUT gets goldens_cuda[_FAMILY].txt and ours[_FAMILY].txt
# (the test's own lines).
set -u
B=${BIN:?set BIN to the folder of the binaries}
B=$(readlink -f "$B"); O=${OUT:-/tmp/o}; mkdir -p "$O"
FAMILY=${FAMILY:-qwen4_exp}
case $FAMILY in
  qwen4_exp) DIR=qwen4exp GB=gpu_goldens SUF= ;;
  glm_moe_dsa) DIR=glm_moe_dsa GB=gpu_goldens_dsa SUF=_glm_moe_dsa ;;
  glm5_next) DIR=glm5_next GB=gpu_goldens_glm5 SUF=_glm5_next ;;
  muse_glimmer) DIR=muse_glimmer GB=gpu_goldens_muse SUF=_muse_glimmer ;;
  *) echo "FAMILY: qwen4_exp, glm_moe_dsa, glm5_next or muse_glimmer"; exit 2 ;;
esac
source "$(dirname "$0")/h200_lib.sh"
S=${PEER_STATE:-/tmp/peer}; D=/tmp/goldens/$FAMILY; mkdir -p "$D/bin"
DT=$S/build/bin/dump_tensors
[ -x "$DT" ] || { echo "no $DT: run tools/h200_peer_bench.sh first"; exit 1; }
bin() { unpack_bin "$B" "$1" "$D/bin"; }
XT=$(bin xtask) || { echo "no xtask in $B"; exit 1; }
GG=$(bin "$GB") || { echo "no $GB in $B"; exit 1; }
NVRTC=$(nvrtc_ld_path)
GOLDENS=()
for g in tests/data/"$DIR"/gen-*.golden.json; do
  case $g in *-fa.golden.json) ;; *) GOLDENS+=("$g") ;; esac
done
for g in "${GOLDENS[@]}"; do
  n=$(basename "$g" .golden.json)
  "$XT" generated-model --golden "$g" --out "$D/$n.gguf" || { echo "$n: no model"; continue; }
  for c in f32 f16; do
    toks=$(python3 -c "import json,sys; g=json.load(open('$g')); r=[r for r in g['runs'] if not r['batched'] and r['cache_type_k']=='$c'][0]; print(','.join(map(str, g['prompt'] + r['greedy'][:-1])))")
    DUMP_NGL=999 DUMP_CACHE=$c "$DT" "$D/$n.gguf" "$toks" -1 "$D/$n-$c.bin" > "$D/$n-$c.err" 2>&1 || echo "$n $c: llama.cpp failed"
  done
done
LD_LIBRARY_PATH=$NVRTC:${LD_LIBRARY_PATH:-} SEAM_GOLDEN_DEVICE=cuda "$GG" --nocapture > "$D/ours.txt" 2>&1
echo "gpu_goldens rc=$?"
cp "$D/ours.txt" "$O/ours$SUF.txt"
python3 - "$D" "${GOLDENS[@]}" > "$O/goldens_cuda$SUF.txt" <<'PY'
import json, glob, os, sys
import numpy as np
d = sys.argv[1]
ours = {}
for line in open(f"{d}/ours.txt"):
    if line.startswith("{"):
        j = json.loads(line)
        # (muse_glimmer's test also prints its projector's checks)
        if "golden" in j and "run" in j:
            ours[(j["golden"], j["run"])] = j
print("golden cache | llama.cpp CUDA vs CPU | ours (CUDA) vs llama.cpp CPU | greedy equal (llama CUDA, ours)")
for g in sorted(sys.argv[2:]):
    n = os.path.basename(g)[: -len(".golden.json")]
    G = json.load(open(g))
    nv = G["model"]["n_vocab"]
    allrows = np.fromfile(os.path.join(os.path.dirname(g), G["logits_file"]), dtype="<f4").reshape(-1, nv)
    for r in G["runs"]:
        if r["batched"]:
            continue
        c = r["cache_type_k"]
        want = allrows[r["row_offset"]: r["row_offset"] + r["rows"]]
        p = f"{d}/{n}-{c}.bin.logits"
        if os.path.exists(p) and os.path.getsize(p) == want.nbytes:
            got = np.fromfile(p, dtype="<f4").reshape(-1, nv)
            lc = float(np.max(np.abs(got - want)))
            np_ = len(G["prompt"])
            lg = all(int(np.argmax(got[np_ - 1 + i])) == t for i, t in enumerate(r["greedy"]))
        else:
            lc, lg = float("nan"), None
        label = f"one-token k={c} v={c}"
        o = ours.get((n, label), {})
        print(f"{n} {c} | {lc:.3e} | {o.get('max_abs_diff', float('nan')):.3e} | {lg}, {o.get('greedy_equal')} {o.get('error', '')}")
PY
cat "$O/goldens_cuda$SUF.txt"
