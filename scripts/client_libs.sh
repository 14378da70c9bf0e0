#!/usr/bin/env bash
# The CUDA libraries and frameworks the tests run as guests, installed the way a new user
# installs them: PyPI wheels in the application's own venv (.clients/venv), separate from
# Crane's .venv, on another Python version than Crane's when the machine has one (so the tests
# cover a guest library built for a foreign interpreter). pip's cache keeps the wheels between
# runs where the machine keeps ~/.cache/pip. Idempotent: a second run only checks the stamp.
#
#   scripts/client_libs.sh            set up (or check) .clients/venv
#   scripts/client_libs.sh --python   print the interpreter it would use
#
# CRANE_CLIENT_PYTHON picks the interpreter; default: a pyenv CPython 3.12 if present, else
# python3.
set -euo pipefail
cd "$(dirname "$0")/.."

# What a new user gets with `pip install torch cupy-cuda13x` on 2026-11-23, pinned so that a
# library release cannot change what the tests exercise. torch pulls cuBLAS, cuBLASLt, cuFFT,
# cuDNN, NVRTC, nvJitLink and the CUDA runtime (13.2) as nvidia-* wheels.
PACKAGES=(torch==2.15.0 cupy-cuda13x==14.2.0 numpy)

pick_python() {
    if [ -n "${CRANE_CLIENT_PYTHON:-}" ]; then echo "$CRANE_CLIENT_PYTHON"; return; fi
    local root
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    for p in "$root"/versions/3.12*/bin/python3.12; do
        if [ -x "$p" ]; then echo "$p"; return; fi
    done
    command -v python3
}

PY=$(pick_python)
if [ "${1:-}" = "--python" ]; then echo "$PY"; exit 0; fi

dest=.clients/venv
stamp=.clients/.stamp
want=$(printf '%s\n' "$("$PY" -c 'import sys; print(sys.version)')" "${PACKAGES[@]}" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$dest/bin/python" ]; then
    exit 0
fi
rm -rf "$dest" "$stamp"
mkdir -p .clients
"$PY" -m venv "$dest"
"$dest/bin/python" -m pip install -q --upgrade pip
"$dest/bin/python" -m pip install -q "${PACKAGES[@]}"
echo "$want" > "$stamp"
