#!/usr/bin/env bash
# Sets up .venv (see scripts/setup.sh) and speaks a sentence with the embedded default
# model into out.wav. Arguments go to `python -m engine` (see --help), e.g.
#   scripts/speak.sh --text "Good morning." --out morning.wav
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
if [ $# -eq 0 ]; then
    set -- --text "Hello! This is the realtime voice service speaking." --out out.wav
fi
exec .venv/bin/python -m engine "$@"
