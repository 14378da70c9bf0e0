# The two commands a newcomer runs (see README.md); each does its own set-up.
.PHONY: setup clients demo test lint gpu-test gpu-prepare

setup:
	@scripts/setup.sh

# PyPI's CUDA libraries and frameworks (torch, CuPy, cuBLAS, cuFFT, cuDNN) in their own venv,
# .clients/venv, for the tests that run them as guests.
clients:
	@scripts/client_libs.sh

demo: setup
	.venv/bin/crane demo

# scripts/vm_deps.sh first: the Debian packages of the `vm` tests (QEMU, libvirt, and the
# headers libvirt-python builds against, which setup then installs), when it can.
# Two pytest processes (CRANE_TEST_PROCS): most tests wait on daemons and subprocesses, so two
# share a 2-core machine well; tests/conftest.py keeps a file's tests (and all VM tests, all PTX
# tests) in one process. A short --basetemp: xdist adds a level (popen-gwN), and the
# daemons' unix sockets under a test's directory must stay within sun_path's 108 bytes.
test:
	@scripts/vm_deps.sh
	@scripts/setup.sh
	@scripts/client_libs.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider -n $${CRANE_TEST_PROCS:-2} --dist loadscope \
		--basetemp=$$(mktemp -d /tmp/crane-test-XXXXXX)

lint: setup
	.venv/bin/ruff check crane tests benchmarks vm-images

# On a GPU host: tests/gpu (marker gpu) and benchmarks/bench_gpu.py, results under $OUT or
# .gpu/results. A GPU machine without network runs scripts/gpu_suite.sh directly, after
# `make gpu-prepare` here has put what it lacks into .gpu/ (see the script's header).
gpu-test: setup
	PYTHON=$${PYTHON:-.venv/bin/python} scripts/gpu_suite.sh

gpu-prepare: setup
	scripts/gpu_suite.sh --prepare
