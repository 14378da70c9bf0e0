#!/usr/bin/env bash
# Set up a development environment from a fresh clone: venv, package (which generates the gRPC
# modules), test tools, and a CUDA compiler from PyPI when the machine has no nvcc.
# Idempotent: a second run only checks that everything is in place.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup: Python >= 3.11 is required ($("$PY" --version 2>&1) found)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.crane-setup
# libvirt-python (the `vm` extra) builds against libvirt's headers: installed only where they are
# (scripts/vm_deps.sh puts them there for `make test`); without it the vm tests skip by name.
vm_extra=""
if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists libvirt 2>/dev/null; then
    vm_extra=",vm"
fi
inputs=$( (cat pyproject.toml setup.py proto/crane/v1/*.proto; echo "$vm_extra") | sha256sum | cut -d' ' -f1)
lib_inputs=$(cat interposer/build_interposer.py interposer/src/* interposer/generated/* pyproject.toml \
    crane/wire/ringcore.c crane/wire/bulkcore.c crane/wire/shm_futex.h crane/wire/shm_build.py \
    crane/backends/sim/fillcore.c crane/guest/callqcore.c | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$inputs" ] || [ ! -f crane/v1/guest_pb2.py ]; then
    .venv/bin/python -m pip install -q --upgrade pip
    extras="test,sim$vm_extra"
    if ! command -v nvcc >/dev/null 2>&1; then
        extras="test,sim,cuda-compiler$vm_extra"   # nvcc, cudart and crt headers from PyPI
    fi
    .venv/bin/python -m pip install -q -e ".[$extras]"
    echo "$inputs" > "$stamp"
    # the install's build hook rebuilt the library as a wheel's (its paths are the installed
    # package's, not this venv's site-packages): build this checkout's own again below
    rm -f .venv/.crane-interposer
fi
# The guest library (libcuda.so.1): rebuilt whenever its C sources or generated stubs change
# (an editable install does not rerun the build hook for those).
lib_stamp=.venv/.crane-interposer
if [ ! -f "$lib_stamp" ] || [ "$(cat "$lib_stamp")" != "$lib_inputs" ] \
        || [ ! -f crane/interposer/_lib/libcuda.so.1 ] \
        || ! ls crane/wire/_ringcore.*.so >/dev/null 2>&1 \
        || ! ls crane/wire/_bulkcore.*.so >/dev/null 2>&1 \
        || ! ls crane/backends/sim/_fillcore.*.so >/dev/null 2>&1 \
        || ! ls crane/guest/_callq.*.so >/dev/null 2>&1; then
    .venv/bin/python interposer/build_interposer.py >/dev/null
    .venv/bin/python crane/wire/shm_build.py >/dev/null  # the call ring's C cores, the guest's call queue, the sim's fill loop
    echo "$lib_inputs" > "$lib_stamp"
fi
