#!/usr/bin/env bash
# GPU call 2 (and 3, resuming; one H200, <= 10 min): train the DualAR model on codes.npz
# for $MINUTES of a schedule planned over $TOTAL_MINUTES, and put into $OUT:
#   lm_log.jsonl lm-state/{state.json,params-*}   (fp32 parameters, ~51 MB in 4 files)
# carry: .carry/codes.npz (or $CODES)   (+ the state to resume: $STATE, default .carry/lm-state; with
# more codes in the upload, carry `lm_train half-state`'s fp16 copy instead: 24 MB, not 47)
#
# ARMS="frame_dropout=0.6 frame_dropout=0.75" trains one run per arm side by side (each a
# space-free list of comma-separated LMTrainConfig FIELD=VALUE; the GPU is not the limit at
# this model size: two arms each ran as fast as one) and returns the state of the arm with
# the lowest final held-out slow loss, plus every arm's log (lm_log-<n>.jsonl; two arms at
# most: 8 files come back from a call).
set -euo pipefail
MINUTES=${MINUTES:-9}
TOTAL_MINUTES=${TOTAL_MINUTES:-$MINUTES}
ARMS=${ARMS:-none}
STATE=${STATE:-.carry/lm-state}
CODES=${CODES:-.carry/codes.npz}
OUT=${OUT:?run on the GPU machine, where OUT is set}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader || true
n=0
for arm in $ARMS; do
    W=/tmp/voice-lm-$n
    rm -rf $W && mkdir -p $W   # a warm machine keeps /tmp: never resume a previous call's leftovers
    if [ -d "$STATE" ]; then cp -r "$STATE" $W/state; fi
    sets=()
    if [ "$arm" != none ]; then for kv in ${arm//,/ }; do sets+=(--set "$kv"); done; fi
    python3 -m training.lm_train train --codes "$CODES" --out $W --minutes "$MINUTES" \
        --total-minutes "$TOTAL_MINUTES" "${sets[@]}" ${LM_ARGS:-} > $W/stderr.txt 2>&1 &
    n=$((n + 1))
done
wait
best=""; best_loss=""
for ((i = 0; i < n; i++)); do
    W=/tmp/voice-lm-$i
    echo "== arm $i: $(echo $ARMS | cut -d' ' -f$((i + 1)))"
    awk '/"step"/ && (++k % 4 != 1) {next} {print}' $W/stderr.txt | tail -40
    loss=$(tail -1 $W/stderr.txt | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["test_slow"])' \
           2>/dev/null) || { echo "arm $i did not finish"; continue; }
    if [ $n -gt 1 ]; then cp $W/log.jsonl "$OUT/lm_log-$i.jsonl"; fi  # (8 files come back at most)
    if [ -z "$best" ] || python3 -c "import sys; sys.exit(not $loss < $best_loss)"; then best=$i; best_loss=$loss; fi
done
if [ -z "$best" ]; then echo "no arm finished"; exit 1; fi
echo "== returning arm $best (final held-out slow loss $best_loss)"
if [ $n -eq 1 ]; then cp /tmp/voice-lm-0/log.jsonl "$OUT/lm_log.jsonl"; fi
mkdir -p "$OUT/lm-state" && cp /tmp/voice-lm-$best/state/* "$OUT/lm-state/"
ls -la "$OUT/lm-state"
