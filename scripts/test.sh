#!/usr/bin/env bash
# Install raypod with its test dependencies into .venv and run the whole suite (lint, types, tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# The CPU build of torch, from this machine's wheel, before anything could ask for a CUDA one.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[test,checkpoint,s3,train]"
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
