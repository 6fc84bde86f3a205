#!/usr/bin/env bash
# Creates ./.venv (once) and installs the project into it with the extras named in
# $EXTRAS (default "dev"). Re-runs pip only when pyproject.toml changed since the last
# install, so the quick-start commands stay fast after the first run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
extras="${EXTRAS:-dev}"
python="${PYTHON:-python3}"

# Debian packages the Python packages need at run time (opuslib loads libopus); haproxy:
# the load balancer of python -m realtime.replicas and tests/test_scaleout.py.
debs=(libopus0 chromium haproxy)
missing=()
for deb in "${debs[@]}"; do
    dpkg -s "$deb" >/dev/null 2>&1 || missing+=("$deb")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "[setup] installing Debian packages: ${missing[*]}"
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq && $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv with $($python --version)"
    "$python" -m venv .venv
fi

stamp=".venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
    echo "[setup] installing the project ($extras extras); the first run takes a few minutes"
    .venv/bin/python -m pip install -q --upgrade pip
    # torch first and alone: pip then resolves the rest against the pinned CPU wheel
    # instead of pulling a multi-GB CUDA build (see README, "GPU install").
    .venv/bin/python -m pip install -q "torch==2.13.0"
    .venv/bin/python -m pip install -q -e ".[${extras}]"
    rm -f .venv/.installed-*
    touch "$stamp"
fi
