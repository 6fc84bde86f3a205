#!/usr/bin/env bash
# GPU call 1 (one H200, <= 10 min): train the codec for $MINUTES, export it (fp16), encode
# every teacher utterance into codes.npz for the model, and put into $OUT:
#   codec.pth codec_config.json codes.npz codec_log.jsonl codec-state/{state.json,params-*} (fp16, ~13 MB)
# carry: .carry/voice/audio .carry/lib   (+ .carry/codec-state to resume a previous call)
# AUDIO / STATE name other folders (a trimmed copy of the audio and an fp16 state for a
# resumed call: scripts/voice/README.md, "2. GPU call 1"). PROFILE_STEPS=N also returns
# codec_profile.txt: where N training steps' GPU time goes (torch.profiler, by kernel).
set -euo pipefail
MINUTES=${MINUTES:-7.5}
TOTAL_MINUTES=${TOTAL_MINUTES:-$MINUTES}
OUT=${OUT:?run on the GPU machine, where OUT is set}
AUDIO=${AUDIO:-.carry/voice/audio}
STATE=${STATE:-.carry/codec-state}
export PYTHONUNBUFFERED=1 OPUS_LIBRARY=$PWD/.carry/lib/libopus.so.0
W=/tmp/voice-codec
rm -rf $W && mkdir -p $W   # a warm machine keeps /tmp: never resume a previous call's leftovers
if [ -d "$STATE" ]; then cp -r "$STATE" $W/state; fi
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
python3 -m engine.train.codec_train train --data "$AUDIO" --out $W --minutes "$MINUTES" \
    --total-minutes "$TOTAL_MINUTES" --workers 16 --no-moments --half-state --profile-steps "${PROFILE_STEPS:-0}" \
    ${CODEC_ARGS:-} 2>&1 \
    | awk '/"step"/ && (++n % 10 != 1) {next} {print}'   # every 10th log line
python3 -m engine.train.codec_train export --out $W --to $W/export
python3 -m engine.train.codec_train encode --codec $W/export --data "$AUDIO" --to $W/codes.npz --workers 16
cp $W/export/codec.pth $W/export/codec_config.json $W/codes.npz "$OUT/"
cp $W/log.jsonl "$OUT/codec_log.jsonl"
if [ -f $W/profile.txt ]; then cp $W/profile.txt "$OUT/codec_profile.txt"; fi
mkdir -p "$OUT/codec-state" && cp $W/state/* "$OUT/codec-state/"
ls -la "$OUT" "$OUT/codec-state"
