#!/usr/bin/env bash
# Install raypod into .venv, start it with a 1 head + 2 worker local cluster, run a small Ray job on it
# through Ray's own job API, and print where to look. Stop everything with: .venv/bin/raypod down
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# The CPU build of torch (this machine's wheel) first, so Ray Train's TorchTrainer scripts run unchanged and
# nothing asks for a CUDA one.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[serving,spaces]"
export PATH="$PWD/.venv/bin:$PATH"

raypod up --workers 2
server=$(python -c 'import raypod.client as c; print(c.connection_settings().server)')
echo
echo "Submitting examples/hello_ray.py with plain 'ray job submit', through raypod's authenticated gateway..."
ray job submit --address raypod://local --working-dir examples -- python hello_ray.py
echo
raypod cluster list
echo
echo "Where to look:"
echo "  Ray dashboard:   $server/clusters/default/local/  (log in at $server/login with the token in ~/.raypod/credentials)"
echo "  cluster events:  .venv/bin/raypod cluster events local"
echo "  scale it:        .venv/bin/raypod cluster scale local 3"
echo "  a notebook on it: .venv/bin/raypod space create nb -c local   (JupyterLab; ray.init(address='auto') inside)"
echo "  stop it all:     .venv/bin/raypod down"
