#!/usr/bin/env bash
# One GPU call (<= 10 min): train the codec arms of $ARMS side by side on the one GPU, each
# for $MINUTES of a learning-rate schedule planned over TOTAL_MINUTES (TOTAL_<arm> per arm),
# and put each arm's training state (fp16 parameters, no optimizer moments, its log inside
# as state/log.jsonl) into $OUT as state-<arm>.tar.part-* pieces of at most 15 MB. Here:
#   cat state-<arm>.tar.part-* | tar -x -C .carry/codec-<arm>      # -> .carry/codec-<arm>/state
# FROM_<arm>=<state folder> resumes an arm (moments restart with a short re-warm).
# The arms of the shipped codec (training/recipe/README.md, "Codec"):
#   I:  from scratch: istft decoder + stft encoder with lookahead 3 (training/recipe/codec.json),
#       lr 1e-3, warm-up 200, head-spectrum loss x4
#   Iu: I with unit codes (codec_forward._quantize: latents and codebook rows at unit
#       length in every quantizer term), resumed from I's state; Ia: the same recipe, resumed
#       from Iu's
#   Db: the decoding side only (every code unchanged) from a state-from-export of the
#       packaged codec, batch 64, lr 5e-4
# carry: .carry/voice/audio (or $AUDIO) .carry/lib, and every FROM_ folder
set -euo pipefail
MINUTES=${MINUTES:-7}
ARMS=${ARMS:?name the arms, e.g. ARMS=I}
OUT=${OUT:?run on the GPU machine, where OUT is set}
AUDIO=${AUDIO:-.carry/voice/audio}
export PYTHONUNBUFFERED=1 OPUS_LIBRARY=$PWD/.carry/lib/libopus.so.0
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
arm_args() {
    case $1 in
    I) echo "--set lr=1e-3 --set warmup=200 --set head_spectrum_weight=4 --codec-config training/recipe/codec.json" ;;
    Iu | Ia) echo "$(arm_args I) --set unit_codes=1" ;;
    Db) echo "--set decoder_only=1 --set lr=5e-4 --set warmup=100 --set batch=64" ;;
    *) echo "unknown arm $1" >&2; exit 2 ;;
    esac
}
n_arms=$(echo $ARMS | wc -w)
workers=$(( $(nproc) / n_arms ))
pids=()
for arm in $ARMS; do
    W=/tmp/voice-codec-$arm
    rm -rf $W && mkdir -p $W
    # FROM_<arm>: a state folder the arm resumes from; TOTAL_<arm>: its own schedule length
    from=FROM_$arm total=TOTAL_$arm
    if [ -n "${!from:-}" ]; then cp -r "${!from}" $W/state; fi
    # shellcheck disable=SC2046
    python3 -m training.codec_train train --data "$AUDIO" --out $W --minutes "$MINUTES" --total-minutes "${!total:-${TOTAL_MINUTES:-15}}" --save-minutes 100 \
        --workers $workers --no-moments --half-state $(arm_args $arm) ${CODEC_ARGS:-} > $W/stdout.log 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait $pid || status=1; done
for arm in $ARMS; do
    W=/tmp/voice-codec-$arm
    # the log travels inside the state's tar: three arms' logs and states as separate
    # files would pass the device tool's 8 files
    cp $W/log.jsonl $W/state/log.jsonl || status=1
    tar -C $W -cf - state | split -b 15m - "$OUT/state-$arm.tar.part-" || status=1
    echo "== arm $arm"; awk '/"step"/ && (++n % 20 != 1) {next} {print}' $W/stdout.log | tail -n 30
done
ls -la "$OUT"
exit $status
