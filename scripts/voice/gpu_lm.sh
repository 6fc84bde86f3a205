#!/usr/bin/env bash
# GPU call 2 (and 3, resuming; one H200, <= 10 min): train the DualAR model on codes.npz
# for $MINUTES of a schedule planned over $TOTAL_MINUTES, and put into $OUT:
#   lm_log.jsonl lm-state/{state.json,params-*}   (fp32 parameters, ~51 MB in 4 files)
# carry: .carry/codes.npz   (+ .carry/lm-state to resume)
set -euo pipefail
MINUTES=${MINUTES:-9}
TOTAL_MINUTES=${TOTAL_MINUTES:-$MINUTES}
OUT=${OUT:?run on the GPU machine, where OUT is set}
export PYTHONUNBUFFERED=1
W=/tmp/voice-lm
rm -rf $W && mkdir -p $W   # a warm machine keeps /tmp: never resume a previous call's leftovers
if [ -d .carry/lm-state ]; then cp -r .carry/lm-state $W/state; fi
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 -m engine.train.lm_train train --codes .carry/codes.npz --out $W --minutes "$MINUTES" \
    --total-minutes "$TOTAL_MINUTES" ${LM_ARGS:-} 2>&1 | awk '/"step"/ && (++n % 4 != 1) {next} {print}'
cp $W/log.jsonl "$OUT/lm_log.jsonl"
mkdir -p "$OUT/lm-state" && cp $W/state/* "$OUT/lm-state/"
ls -la "$OUT/lm-state"
