# The two commands a newcomer runs (see README.md); each does its own set-up.
.PHONY: setup demo test lint

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/crane demo

test: setup
	.venv/bin/python -m pytest -q -p no:cacheprovider

lint: setup
	.venv/bin/ruff check crane tests benchmarks
