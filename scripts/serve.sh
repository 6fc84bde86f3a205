#!/usr/bin/env bash
# Sets up .venv (see scripts/setup.sh) and starts the service with the embedded default
# model (on a GPU when there is one, else the CPU). Prints the demo page's URL.
# Arguments go to `python -m realtime` (see --help), e.g. scripts/serve.sh --port 9000
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m realtime "$@"
