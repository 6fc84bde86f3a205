#!/usr/bin/env bash
# Sets up .venv (see scripts/setup.sh) and runs the test suite on the CPU.
# Extra arguments go to pytest, e.g. scripts/test.sh -k codec -x
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/setup.sh"
cd "$root"
exec .venv/bin/python -m pytest -q "$@"
