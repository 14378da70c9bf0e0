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

# scripts/vm_deps.sh: the Debian packages of the `vm` tests (QEMU, libvirt), when it can.
test: setup clients
	@scripts/vm_deps.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider

lint: setup
	.venv/bin/ruff check crane tests benchmarks vm-images

# On a GPU host: tests/gpu (marker gpu) and benchmarks/bench_gpu.py, results under $OUT or
# .gpu/results. A GPU machine without network runs scripts/gpu_suite.sh directly, after
# `make gpu-prepare` here has put what it lacks into .gpu/ (see the script's header).
gpu-test: setup
	PYTHON=$${PYTHON:-.venv/bin/python} scripts/gpu_suite.sh

gpu-prepare: setup
	scripts/gpu_suite.sh --prepare
