#!/usr/bin/env bash
# One GPU call (<= 10 min): codec arms trained from scratch side by side, at the same
# time on the one GPU, on the same data with the same recipe (phone head included), for
# their mel curves. No export, no codes: the question is only which arm's log-mel L1 falls
# towards ~0.2 fastest per step (scripts/voice/README.md, "Where the round trip loses the
# words"). The arms share the GPU, so compare them at equal steps (each log line has its
# step), not at equal minutes.
#   A: the release config (engine.train.presets.VOICE_CODEC), its training defaults
#   B: scripts/voice/codec-wide.json (encoder_dim 32, decoder_dim 512: 12.3M parameters
#      against 6.7M), the same training defaults
#   C: the release config with a higher learning rate and a short warm-up (the best of
#      A, B, C in their first call, 2026-12-01)
#   D: C with the quantizers bypassed (the decoder gets the unquantized latent): the
#      autoencoder's ceiling at this size, no bits limit; its export is no codec
#   E: C with scripts/voice/codec-wide-decoder.json (decoder_dim 768: decoder 10.9M,
#      codec 14.7M against 6.7M): is the decoder's width the limit?
#   F: C with scripts/voice/codec-istft.json (decoder_kind "istft": 6 ConvNeXt blocks of
#      256 at the latent rate and a spectral head, inverse FFT + overlap-add; 7.5M in all,
#      the budget): a decoder whose output is the spectrum the loss compares
#   G: F with the "stft" encoder too (scripts/voice/codec-istft-stft.json: each hop's
#      log-magnitude spectrum -> 2 ConvNeXt blocks of 256; 7.55M in all): an encoder that
#      starts from the spectrum instead of learning it from samples
#   H: G with the head-spectrum loss (--set head_spectrum_weight=4: the istft head's
#      log-magnitude against the target's on the same frames, codec_losses.
#      head_spectrum_loss): the magnitude trained directly, not only through overlap-add
#   I: H with istft_lookahead 3 (scripts/voice/codec-istft-stft-look3.json): a head frame's
#      window ends at its own hop, so no hop is guessed before its code is in (README,
#      "The blind hops"); a stream lags by 3 hops (35 ms)
#   J: H with a 2-hop window and istft_lookahead 1 (codec-istft2-stft-look1.json): no
#      guessed hop either, a 12 ms lag
#   K: I with unit codes (--set unit_codes=1: the quantizers' latents and codes at unit
#      length in the losses too, codec_forward._quantize): in H, I and J the commitment
#      went 2 -> 150 and the gradient norm 15 -> 220 over steps 2,000-3,000
#   L: J with unit codes
# Returns, for each arm in $ARMS (default "H I J"), its log (state/log.jsonl: compare the
# arms at equal steps; F's curve from 2026-12-01 is run-2026-12-01/codec_log-abc2-F.jsonl,
# and C's codec_log-abc-C.jsonl + codec_log-C-resume.jsonl) and its
# training state (fp16 parameters, no moments) as state-<arm>.tar.part-* pieces of at
# most 15 MB (the device tool returns 8 files of at most 16 MiB), so the best arm can be
# resumed in the next call: cat the pieces | tar -x -C .carry/codec-<arm>
# (gives .carry/codec-<arm>/state, the STATE folder for scripts/voice/gpu_codec.sh, or
# the FROM_<arm> folder of an arm resumed here, beside arms from scratch: e.g.
# ARMS="Ir Iu K" FROM_Ir=.carry/codec-I/state FROM_Iu=.carry/codec-I/state).
# carry: .carry/voice/audio .carry/lib
set -euo pipefail
MINUTES=${MINUTES:-7}
# the learning-rate schedule is planned over TOTAL_MINUTES, so the best arm can go on in
# a second call (gpu_codec.sh with STATE and the same TOTAL_MINUTES) without a re-warm
# from the top
ARMS=${ARMS:-H I J}
OUT=${OUT:?run on the GPU machine, where OUT is set}
AUDIO=${AUDIO:-.carry/voice/audio}
export PYTHONUNBUFFERED=1 OPUS_LIBRARY=$PWD/.carry/lib/libopus.so.0
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
arm_args() {
    case $1 in
    A) ;;
    B) echo "--codec-config scripts/voice/codec-wide.json" ;;
    C) echo "--set lr=1e-3 --set warmup=200" ;;
    D) echo "--set lr=1e-3 --set warmup=200 --set bypass_quantizer=1" ;;
    E) echo "--set lr=1e-3 --set warmup=200 --codec-config scripts/voice/codec-wide-decoder.json" ;;
    F) echo "--set lr=1e-3 --set warmup=200 --codec-config scripts/voice/codec-istft.json" ;;
    G) echo "--set lr=1e-3 --set warmup=200 --codec-config scripts/voice/codec-istft-stft.json" ;;
    H) echo "--set lr=1e-3 --set warmup=200 --set head_spectrum_weight=4 --codec-config scripts/voice/codec-istft-stft.json" ;;
    I) echo "--set lr=1e-3 --set warmup=200 --set head_spectrum_weight=4 --codec-config scripts/voice/codec-istft-stft-look3.json" ;;
    J) echo "--set lr=1e-3 --set warmup=200 --set head_spectrum_weight=4 --codec-config scripts/voice/codec-istft2-stft-look1.json" ;;
    K) echo "$(arm_args I) --set unit_codes=1" ;;
    Ir) arm_args I ;;  # with FROM_Ir: I resumed as it was
    Iu) arm_args K ;;  # with FROM_Iu: I resumed with unit codes from here on
    # with FROM_ a unit-codes state (Iu's): the same recipe, twice the batch, twice the
    # head-spectrum weight
    Ia) arm_args K ;;
    Ib) echo "$(arm_args K) --set batch=64" ;;
    Ic) echo "$(arm_args K) --set head_spectrum_weight=8" ;;
    L) echo "$(arm_args J) --set unit_codes=1" ;;
    # with FROM_Dd a state-from-export of the packaged codec (scripts/voice/README.md,
    # "The codec's decoding side fine-tuned"): the decoding side fine-tuned, every code unchanged
    Dd) echo "--set decoder_only=1 --set lr=3e-4 --set warmup=100" ;;
    # Dd with twice the head-spectrum weight (the magnitude the blame probe blames), and
    # Dd at twice the batch with a higher peak learning rate (the CPU run's batch 16 plateaued)
    Dh) echo "$(arm_args Dd) --set head_spectrum_weight=8" ;;
    Db) echo "--set decoder_only=1 --set lr=5e-4 --set warmup=100 --set batch=64" ;;
    # with FROM_ Db's state (its round trip 0.198, 2026-12-03): a second cycle at a lower
    # peak, and one at twice the batch again
    Dc) echo "--set decoder_only=1 --set lr=3e-4 --set warmup=100 --set batch=64" ;;
    De) echo "--set decoder_only=1 --set lr=4e-4 --set warmup=100 --set batch=128" ;;
    # with FROM_ a state-from-export of the shipped codec (step 20,958): Db's recipe plus
    # the head's phase derivatives (codec_losses.head_phase_loss; the codec's phase is what
    # cost the speaker features, scripts/voice/run-2026-12-05), at two weights
    Pp) echo "$(arm_args Db) --set head_phase_weight=2" ;;
    Pq) echo "$(arm_args Db) --set head_phase_weight=6" ;;
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
    python3 -m engine.train.codec_train train --data "$AUDIO" --out $W --minutes "$MINUTES" --total-minutes "${!total:-${TOTAL_MINUTES:-15}}" --save-minutes 100 \
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
