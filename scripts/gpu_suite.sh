#!/usr/bin/env bash
# Crane's GPU suite in one command: set-up, the backend conformance suite and `pytest -m gpu
# tests/gpu`, benchmarks/bench_gpu.py.
#
#   scripts/gpu_suite.sh --prepare   on a machine with network, before the GPU run (see below)
#   scripts/gpu_suite.sh             on the GPU host: set-up, tests, benchmarks (`make gpu-test`)
#
# Results and logs go to $OUT when it is set (the device tool's folder), else .gpu/results:
#   suite.log (everything), pytest.log, junit.xml, bench_gpu.json, bench_gpu.md, logs.tar.gz
#   (craned logs of every daemon the tests and benchmarks started). Six files, <= 2 folders deep.
#
# Plan for the lent GPU machine (the `device` tool: an H100/H200, fresh copy of the repo, no
# network, one command of <= 10 minutes). Its python3 (3.12) already has torch, cuda-bindings,
# nvidia-ml-py, numpy, rich, pytest, pytest-timeout, hypothesis and typing-extensions, and there
# are nvcc and gcc. It lacks cffi, zstandard and lz4, and its grpcio/protobuf may be older than
# what generated crane/v1 (the generated modules refuse an older grpcio). Nothing can be fetched
# there, so:
#   1. --prepare (here, with pip and network) downloads cp312 manylinux wheels of exactly the
#      versions .venv runs (grpcio, protobuf, cffi, pycparser, zstandard, lz4, setuptools, which
#      cffi needs to compile on Python 3.12: ~16 MB) into
#      .gpu/wheels and copies the generated crane/v1 into .gpu/v1. .gpu/ is git-ignored, so the
#      device call names it in `carry`.
#   2. On the GPU machine this script uses $PYTHON (default: .venv/bin/python if there is one,
#      else python3), puts the repo on PYTHONPATH (crane is not pip-installed: everything runs
#      as `python -m crane...`), restores crane/v1 from .gpu/v1 if missing, and only when
#      crane's imports fail with that interpreter's own packages installs .gpu/wheels with
#      `pip install --no-index --no-deps --target .gpu/site` and puts .gpu/site first.
#   3. It builds the interposer (libcuda.so.1, cffi embedding: needs a C compiler, Python.h and
#      libpython) recording .gpu/site and the interpreter's site-packages as its import paths,
#      so a guest program's embedded Python finds crane's dependencies.
#   4. pytest (programs, then checkpoint/migration, then PyTorch), then the benchmarks with the
#      time left; each under `timeout`, within $GPU_SUITE_BUDGET_S (default 560 s) in all.
#      Extra pytest arguments: $GPU_SUITE_PYTEST_ARGS (e.g. "-k torch"); bench_gpu.py's:
#      $GPU_BENCH_ARGS (e.g. "--sections torch --quick"); the backend: $CRANE_GPU_SUITE_BACKEND
#      (default cuda:0; sim:h100-80gb checks this script and the suite on a CPU-only host).
# The device call (carry .gpu; its command line):
#   scripts/gpu_suite.sh
# Exit status: pytest's, or the benchmark's when pytest passed; 3 when set-up failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
START=$(date +%s)

proto_sha() { cat proto/crane/v1/*.proto | sha256sum | cut -d' ' -f1; }

prepare() {
    local py="${PYTHON:-.venv/bin/python}" pyver="${GPU_PY_VERSION:-3.12}"
    [ -x "$py" ] || { echo "prepare: $py missing: run make setup first" >&2; exit 2; }
    [ -f crane/v1/guest_pb2.py ] || { echo "prepare: crane/v1 not generated: make setup" >&2; exit 2; }
    local pins
    pins=$("$py" -c 'from importlib.metadata import version as v
names = ("grpcio", "protobuf", "cffi", "pycparser", "zstandard", "lz4", "setuptools")
print(" ".join(f"{n}=={v(n)}" for n in names))') || exit 2
    rm -rf .gpu/wheels .gpu/v1 .gpu/site .gpu/results .gpu/pylib  # only what travels stays
    mkdir -p .gpu/wheels
    echo "prepare: downloading for CPython $pyver manylinux x86_64: $pins"
    # shellcheck disable=SC2086
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .gpu/wheels $pins || exit 2
    mkdir -p .gpu/v1
    cp crane/v1/*.py crane/v1/*.pyi .gpu/v1/ 2>/dev/null || cp crane/v1/*.py .gpu/v1/
    proto_sha >.gpu/v1/.proto-sha256
    du -sh .gpu
    echo "prepare: done; on the GPU machine run scripts/gpu_suite.sh with .gpu carried"
}

if [ "${1:-}" = "--prepare" ]; then
    prepare
    exit 0
fi

OUTDIR="${OUT:-$ROOT/.gpu/results}"
mkdir -p "$OUTDIR"
LOG="$OUTDIR/suite.log"
: >"$LOG"
BUDGET="${GPU_SUITE_BUDGET_S:-560}"
BT=/tmp/crane-gpu-bt
LOGS=/tmp/crane-gpu-logs
rm -rf "$BT" "$LOGS"
mkdir -p "$LOGS"
say() { echo "gpu_suite: $*" | tee -a "$LOG"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }

if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x .venv/bin/python ]; then
    PY="$ROOT/.venv/bin/python"
else
    PY=$(command -v python3)
fi
export PYTHONUNBUFFERED=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
if ! command -v nvcc >/dev/null 2>&1; then
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
        if [ -x "$d/nvcc" ]; then export PATH="$PATH:$d"; break; fi
    done
fi

setup() {
    say "python: $PY ($("$PY" -V 2>&1))"
    {
        echo "--- host"
        uname -a
        nvidia-smi 2>&1 | head -20 || echo "no nvidia-smi"
        nvcc --version 2>&1 | tail -2 || echo "no nvcc"
        "$PY" - <<'EOF'
from importlib.metadata import PackageNotFoundError, version
for n in ("torch", "cuda-bindings", "cuda-python", "nvidia-ml-py", "numpy", "grpcio",
          "protobuf", "cffi", "zstandard", "lz4", "rich", "pytest", "pytest-timeout"):
    try:
        print(f"{n} {version(n)}")
    except PackageNotFoundError:
        print(f"{n} -")
EOF
    } >>"$LOG" 2>&1
    if [ ! -f crane/v1/guest_pb2.py ]; then
        if [ -f .gpu/v1/guest_pb2.py ]; then
            if [ "$(cat .gpu/v1/.proto-sha256 2>/dev/null)" != "$(proto_sha)" ]; then
                say ".gpu/v1 was generated from other proto files: rerun" \
                    "scripts/gpu_suite.sh --prepare (make gpu-prepare) and carry .gpu again"
                return 1
            fi
            mkdir -p crane/v1 && cp .gpu/v1/* crane/v1/
            say "crane/v1 restored from .gpu/v1"
        elif "$PY" -c "import grpc_tools" 2>/dev/null; then
            "$PY" -m crane.codegen.protos >>"$LOG" 2>&1 || { say "protobuf generation failed"; return 1; }
        else
            say "crane/v1 is missing and neither .gpu/v1 nor grpc_tools is here: run" \
                "scripts/gpu_suite.sh --prepare where there is network, and carry .gpu"
            return 1
        fi
    fi
    local check='import cffi, setuptools, grpc, google.protobuf, zstandard, lz4, numpy, rich
import crane.v1.guest_pb2_grpc, crane.v1.control_pb2_grpc, crane.craned.main, crane.cli.main'
    SITE=""
    if ! "$PY" -c "$check" >>"$LOG" 2>&1; then
        if ! ls .gpu/wheels/*.whl >/dev/null 2>&1; then
            say "crane's dependencies are not importable by $PY and there is no .gpu/wheels" \
                "(scripts/gpu_suite.sh --prepare); see $LOG"
            return 1
        fi
        SITE="$ROOT/.gpu/site"
        rm -rf "$SITE"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$SITE" .gpu/wheels/*.whl >>"$LOG" 2>&1 || { say "wheel install failed"; return 1; }
        export PYTHONPATH="$SITE:$PYTHONPATH"
        say "installed $(ls .gpu/wheels | wc -l) carried wheels into .gpu/site"
        "$PY" -c "$check" >>"$LOG" 2>&1 || { say "crane still not importable; see $LOG"; return 1; }
    fi
    if [ ! -f crane/interposer/_lib/libcuda.so.1 ] || [ -n "$SITE" ]; then
        "$PY" - "$SITE" >>"$LOG" 2>&1 <<'EOF' || { say "interposer build failed (needs cc, Python.h, libpython); see $LOG"; return 1; }
import glob, os, sys, sysconfig
inc = sysconfig.get_config_var("INCLUDEPY")
print("Python.h:", os.path.exists(os.path.join(inc, "Python.h")), inc)
libdir, ver = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("LDVERSION")
print("libpython:", libdir, sysconfig.get_config_var("LDLIBRARY"),
      "shared" if sysconfig.get_config_var("Py_ENABLE_SHARED") else "static")
# cffi links -lpython<ver>: without the -dev symlink, link the runtime library (same soname)
dirs = [libdir, "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
if not any(os.path.exists(f"{d}/libpython{ver}.so") for d in dirs):
    runtime = [p for d in dirs for p in glob.glob(f"{d}/libpython{ver}.so.1*")]
    print("no libpython .so link; runtime libraries:", runtime)
    if runtime:
        os.makedirs(".gpu/pylib", exist_ok=True)
        link = f".gpu/pylib/libpython{ver}.so"
        if not os.path.lexists(link):
            os.symlink(runtime[0], link)
        os.environ["LIBRARY_PATH"] = os.path.abspath(".gpu/pylib") + ":" + os.environ.get(
            "LIBRARY_PATH", "")
sys.path.insert(0, "interposer")
from build_interposer import build
paths = sysconfig.get_paths()
site = [p for p in (sys.argv[1], paths["purelib"], paths["platlib"]) if p]
print("built", build(site_dirs=list(dict.fromkeys(site))))
EOF
        say "interposer built"
    fi
    return 0
}

say "set-up ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))"
if ! setup; then
    tail -n 30 "$LOG"
    exit 3
fi
say "set-up done in $(($(date +%s) - START)) s"

# --- tests -------------------------------------------------------------------------------
BENCH_RESERVE="${GPU_SUITE_BENCH_S:-200}"
T_TESTS=$(($(left) - BENCH_RESERVE))
[ "$T_TESTS" -lt 60 ] && T_TESTS=60
say "pytest -m 'gpu or conformance' (at most ${T_TESTS} s)"
# the backend conformance suite first (against the cuda backend on this GPU, and the simulator),
# then the programs, checkpoint/migration and PyTorch
# shellcheck disable=SC2086
timeout --kill-after=10 "$T_TESTS" "$PY" -m pytest -m "gpu or conformance" -p no:cacheprovider \
    --basetemp="$BT" -rfEsx --durations=15 --junitxml="$OUTDIR/junit.xml" \
    ${GPU_SUITE_PYTEST_ARGS:-} tests/conformance/test_backends.py \
    tests/gpu/test_programs.py tests/gpu/test_migrate_gpu.py tests/gpu/test_torch.py tests/gpu/test_frameworks.py \
    2>&1 | tee "$OUTDIR/pytest.log" >>"$LOG"
TESTS_RC=${PIPESTATUS[0]}
say "pytest exit $TESTS_RC after $(($(date +%s) - START)) s"

# --- benchmarks --------------------------------------------------------------------------
T_BENCH=$(($(left) - 15))
BENCH_RC=0
if [ "$T_BENCH" -ge 30 ]; then
    say "bench_gpu (at most ${T_BENCH} s)"
    BENCH_ARGS=()
    [ -n "${CRANE_GPU_SUITE_BACKEND:-}" ] && BENCH_ARGS+=(--backend "$CRANE_GPU_SUITE_BACKEND")
    # shellcheck disable=SC2086
    timeout --kill-after=10 "$T_BENCH" "$PY" benchmarks/bench_gpu.py "${BENCH_ARGS[@]}" \
        --json "$OUTDIR/bench_gpu.json" --md "$OUTDIR/bench_gpu.md" --logs "$LOGS" \
        ${GPU_BENCH_ARGS:-} >>"$LOG" 2>&1
    BENCH_RC=$?
    say "bench_gpu exit $BENCH_RC after $(($(date +%s) - START)) s"
else
    say "no time left for the benchmarks"
fi

# --- collect -----------------------------------------------------------------------------
(find "$BT" "$LOGS" -name '*.log' -print0 2>/dev/null | tar --null -czf "$OUTDIR/logs.tar.gz" \
    -T - 2>/dev/null) || true
echo
echo "===== pytest summary ====="
sed -n '/short test summary info/,$p' "$OUTDIR/pytest.log" | cut -c1-400 | tail -n 60
echo
echo "===== benchmarks ($OUTDIR/bench_gpu.md) ====="
cat "$OUTDIR/bench_gpu.md" 2>/dev/null || grep -h "^bench_gpu" "$LOG" | tail -n 5
echo
say "done in $(($(date +%s) - START)) s; results in $OUTDIR: $(ls "$OUTDIR" | tr '\n' ' ')"
if [ "$TESTS_RC" -ne 0 ]; then exit "$TESTS_RC"; fi
exit "$BENCH_RC"
