#!/usr/bin/env bash
# Fixtures and llama.cpp goldens for muse_glimmer (#18) and glm5_next (#17).
#
#   tools/oracle/fixtures_muse_glm5.sh BIN_DIR LCP_DIR OUT_DIR [MM_ENCODE]
#
# BIN_DIR holds test-llama-archs and the llama/ggml shared libraries; LCP_DIR
# is the untarred llama-cpp-python 0.3.36 sdist (llama_cpp/ and
# vendor/llama.cpp/gguf-py); MM_ENCODE is tools/oracle/mm_encode.cpp built
# (optional: the projector embeddings). Writes OUT_DIR/{muse_glimmer,glm5_next}/.
# Every step is deterministic for one C++ library (test-llama-archs seeds
# std::mt19937 with std::hash of the tensor name): the committed fixture and
# the goldens' sha256 are the record, not this script.
set -euo pipefail
BIN=$(cd "$1" && pwd); LCP=$(cd "$2" && pwd); OUTD=$3; MM=${4:-}
HERE=$(cd "$(dirname "$0")" && pwd)
RAW=${RAW_DIR:-$OUTD/raw}
mkdir -p "$OUTD/muse_glimmer" "$OUTD/glm5_next" "$RAW"
export PYTHONPATH="$HERE:$LCP:$LCP/vendor/llama.cpp/gguf-py${PYTHONPATH:+:$PYTHONPATH}"
export LLAMA_CPP_LIB_PATH=${LLAMA_CPP_LIB_PATH:-$BIN}
PY=${PYTHON:-python3}
RW="$PY $HERE/gguf_rewrite.py"
GOLD="$PY $HERE/llama_goldens.py"

# prompts: fixed pseudo-random ids below the test vocabulary (128)
P40=$($PY -c "import random; r=random.Random(17); print(','.join(str(r.randrange(128)) for _ in range(40)))")
P30=$($PY -c "import random; r=random.Random(18); print(','.join(str(r.randrange(128)) for _ in range(30)))")

# ---------------- muse-glimmer (dense only: muse-glimmer-dense.gguf)
"$BIN/test-llama-archs" -a muse-glimmer -o "$RAW" -s 42        && mv "$RAW/muse-glimmer-dense.gguf" "$RAW/muse-s42.gguf"
"$BIN/test-llama-archs" -a muse-glimmer -o "$RAW" -s 7 -d 0.5 && mv "$RAW/muse-glimmer-dense.gguf" "$RAW/muse-s7d05.gguf"
M=$OUTD/muse_glimmer
cp "$RAW/muse-s42.gguf" "$M/s42.gguf"
# seed 7, stdev 0.5, with a logit scale and a softcap (the stock file has scale 1, no softcap)
$RW "$RAW/muse-s7d05.gguf" "$M/s7-d05-softcap.gguf" --set .logit_scale=0.8:f32 --set .final_logit_softcapping=4.0:f32
# the same weights, logit scale 3 and NO softcap key: llama.cpp then caps at 30 (hparams default)
$RW "$RAW/muse-s7d05.gguf" "$M/s7-d05-nocap.gguf" --set .logit_scale=3.0:f32 --drop-key muse-glimmer.final_logit_softcapping
# the same weights in mixed ggml types (llama.cpp quantizes activations for these)
$RW "$M/s7-d05-softcap.gguf" "$M/s7-d05-mixed.gguf" \
    --type 'token_embd=Q8_0' --type 'attn_(q|k|v|gate)\.weight=F16' --type 'attn_output\.weight=BF16' \
    --type 'ffn_(gate|up)\.weight=Q8_0' --type 'ffn_down\.weight=Q4_0' --type '^output\.weight=Q8_0'
for f in s42 s7-d05-softcap s7-d05-nocap s7-d05-mixed; do
    $GOLD "$M/$f.gguf" "$M/$f.golden.json" --tokens "$P40" --steps 8 --incremental --note "tools/oracle/fixtures_muse_glm5.sh"
done

# projector fixtures (section 7 of docs/families/muse_glimmer.md)
for b in none patch-missing patch-shape patch-short other-model; do
    $PY "$HERE/muse_glimmer_mmproj.py" "$M/mmproj-$b.gguf" --break "$b" --text-embd 256
done
if [ -n "$MM" ]; then
    "$MM" "$M/mmproj-none.gguf" 32 24 > "$M/mmproj-none.embd.json" || echo "mm_encode failed" >&2
fi

# ---------------- glm5-next (MoE only: glm5-next-moe.gguf)
"$BIN/test-llama-archs" -a glm5-next -o "$RAW" -s 42        && mv "$RAW/glm5-next-moe.gguf" "$RAW/glm5-s42.gguf"
"$BIN/test-llama-archs" -a glm5-next -o "$RAW" -s 7 -d 0.5 && mv "$RAW/glm5-next-moe.gguf" "$RAW/glm5-s7d05.gguf"
G=$OUTD/glm5_next
# 8 indexer heads instead of 64 (the 64-head q_b alone is 16 MiB)
SLIM=(--slice 'indexer\.attn_q_b\.weight:0:1024' --slice 'indexer\.proj\.weight:0:8' --set .attention.indexer.head_count=8)
$RW "$RAW/glm5-s42.gguf" "$G/s42.gguf" "${SLIM[@]}"
# seed 7, stdev 0.5: sparse k-pool selection (top_k 8 tokens = 2 pools), 1 of 2 experts
# routed by the biased score, routed weights x 2.5, clamped SwiGLU (shexp and the dense
# leading FFN inherit the expert clamp)
$RW "$RAW/glm5-s7d05.gguf" "$G/s7-d05-sparse.gguf" "${SLIM[@]}" \
    --set .attention.indexer.top_k=8 --set .expert_used_count=1 --set .expert_weights_scale=2.5:f32 \
    --set '.swiglu_clamp_exp=[1.5,1.5]:f32' --drop-key glm5-next.swiglu_clamp_shexp
# a third layer: MLA with a SHARED indexer (reuses layer 0's pick), weights copied from
# layer 0 (attention, mHC) and layer 1 (MoE)
$RW "$G/s7-d05-sparse.gguf" "$G/s7-d05-shared3.gguf" \
    --copy 'blk\.0\.(attn_norm.*|ffn_norm.*|hc_.*|attn_q_a.*|attn_q_b.*|attn_kv_a.*|attn_k_b.*|attn_v_b.*|attn_output.*)=blk.2.\1' \
    --copy 'blk\.1\.(ffn_gate_inp.*|exp_probs_b.*|ffn_.*_exps.*|ffn_.*_shexp.*)=blk.2.\1' \
    --set .block_count=3 --set '.attention.head_count_kv=[1,0,1]:u32' --set '.attention.indexer.types=[1,1,0]:u32' \
    --set '.swiglu_clamp_exp=[1.5,1.5,1.5]:f32' \
    --drop-key glm5-next.attention.recurrent_layers --drop-key glm5-next.attention.compress_ratios
# s7-d05-shared3 slimmed to 1.9 MiB so it can be committed: q/kv LoRA 64, 2 indexer heads,
# FFN and expert widths 64, KDA head dim 32 (a different model, with its own golden)
$RW "$G/s7-d05-shared3.gguf" "$G/s7-d05-shared3-slim.gguf" \
    --slice '\d\.attn_q_a\.weight:0:64' --slice 'attn_q_a_norm\.weight:0:64' --slice '\d\.attn_q_b\.weight:1:64' \
    --slice 'indexer\.attn_q_b\.weight:1:64' --slice 'indexer\.attn_q_b\.weight:0:256' --slice 'indexer\.proj\.weight:0:2' \
    --slice 'attn_kv_a_mqa\.weight:0:64' --slice 'attn_kv_a_norm\.weight:0:64' --slice 'attn_k_b\.weight:0:64' --slice 'attn_v_b\.weight:1:64' \
    --slice 'ffn_(gate|up)\.weight:0:64' --slice 'ffn_down\.weight:1:64' \
    --slice 'ffn_(gate|up)_exps\.weight:1:64' --slice 'ffn_down_exps\.weight:2:64' \
    --slice 'ffn_(gate|up)_shexp\.weight:0:64' --slice 'ffn_down_shexp\.weight:1:64' \
    --slice '\d\.attn_(q|k|v)\.weight:0:32' --slice '\d\.attn_(q|k|v)\.bias:0:32' --slice 'ssm_conv1d_(q|k|v)\.weight:0:32' \
    --slice 'ssm_(f|g)_a\.weight:0:32' --slice 'ssm_(f|g)_b\.weight:0:32' --slice 'ssm_(f|g)_b\.weight:1:32' \
    --slice 'ssm_dt\.bias:0:32' --slice 'ssm_norm\.weight:0:32' --slice 'blk\.1\.attn_output\.weight:1:32' \
    --set .attention.q_lora_rank=64 --set .attention.kv_lora_rank=64 --set .attention.key_length=64 --set .attention.value_length=64 \
    --set .attention.indexer.head_count=2 --set .feed_forward_length=64 --set .expert_feed_forward_length=64 --set .kda.head_dim=32
$RW "$G/s7-d05-sparse.gguf" "$G/s7-d05-mixed.gguf" \
    --type 'token_embd\.weight$=Q8_0' --type 'attn_(q|k|v)\.weight$=F16' --type '(attn_q_b|attn_kv_a_mqa)\.weight$=BF16' \
    --type 'ffn_(gate|up)_exps\.weight$=Q8_0' --type 'ffn_down_exps\.weight$=Q4_0' --type '_shexp\.weight$=F16' --type '^output\.weight$=Q8_0'
$GOLD "$RAW/glm5-s42.gguf" "$G/s42-stock64.golden.json" --tokens "$P30" --steps 6
for f in s42 s7-d05-sparse s7-d05-shared3 s7-d05-shared3-slim s7-d05-mixed; do
    $GOLD "$G/$f.gguf" "$G/$f.golden.json" --tokens "$P30" --steps 6 --incremental --note "tools/oracle/fixtures_muse_glm5.sh"
done
ls -la "$M" "$G"
