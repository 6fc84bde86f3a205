#!/usr/bin/env bash
# One GPU call (<= 10 min): the release codec config (A) and a wider one (B,
# scripts/voice/codec-wide.json: encoder_dim 32, decoder_dim 512, 12.3M parameters
# against 6.7M) trained from scratch for $MINUTES each on the same data, with the same
# recipe (phone head included), for their mel curves side by side. No export, no codes:
# the question is only which one's log-mel L1 falls towards ~0.2 (scripts/voice/README.md,
# "Where the round trip loses the words"). Returns codec_log-A.jsonl and codec_log-B.jsonl.
# carry: .carry/voice/audio .carry/lib
set -euo pipefail
MINUTES=${MINUTES:-3.5}
OUT=${OUT:?run on the GPU machine, where OUT is set}
AUDIO=${AUDIO:-.carry/voice/audio}
export PYTHONUNBUFFERED=1 OPUS_LIBRARY=$PWD/.carry/lib/libopus.so.0
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
for arm in A B; do
    W=/tmp/voice-codec-$arm
    rm -rf $W && mkdir -p $W
    config=()
    if [ $arm = B ]; then config=(--codec-config scripts/voice/codec-wide.json); fi
    python3 -m engine.train.codec_train train --data "$AUDIO" --out $W --minutes "$MINUTES" --save-minutes 100 \
        --workers 16 --no-moments --half-state ${config[@]+"${config[@]}"} ${CODEC_ARGS:-} 2>&1 \
        | awk '/"step"/ && (++n % 20 != 1) {next} {print}'
    cp $W/log.jsonl "$OUT/codec_log-$arm.jsonl"
done
ls -la "$OUT"
