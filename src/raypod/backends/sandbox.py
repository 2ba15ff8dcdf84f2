"""The first program of a sandboxed local node, run by ``unshare`` as root inside the node's new mount and PID
namespaces, before anything of the node starts.

It runs as a plain script (``python -I -S sandbox.py``, the standard library only) and:

1. stages the cluster's directory, and the directories of the Python installation that lie under the temporary
   root, on a private ``/run``;
2. covers the temporary root with an empty tmpfs and moves what it staged back to the same paths, so the node
   sees its own cluster's files and the interpreter it runs on, and no other cluster's;
3. covers raypod's home with an empty read-only tmpfs (when it is still visible);
4. puts back, writable and at the same paths, the directories given to bind (a workspace's files, which live in
   raypod's home);
5. execs COMMAND: ``setpriv`` by absolute path, which drops every capability, so nothing in the node can undo
   the mounts, and then ``sandbox.py exec``.

``sandbox.py exec FD -- COMMAND ...`` is that last step: it runs without capabilities, reads the node's
environment from the descriptor FD (see ``privileged.py``) and execs the node's own command with it. Everything
before it runs with the fixed environment the server gave, never with anything from a user's spec.

Usage: sandbox.py CLUSTER_DIR TEMP_ROOT RAYPOD_HOME N KEEP_1 .. KEEP_N M BIND_1 .. BIND_M -- COMMAND ...
       sandbox.py exec FD -- COMMAND ...
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

STAGE = "/run/raypod-stage"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _run(program: str, *arguments: str) -> None:
    found = shutil.which(program, path=SYSTEM_PATH)
    if found is None:
        raise SystemExit(f"{program} is not installed in {SYSTEM_PATH}")
    subprocess.run([found, *arguments], check=True, env={"PATH": SYSTEM_PATH})


def run_dropped(argv: list[str]) -> None:
    """``exec FD -- COMMAND...``: COMMAND with the environment that FD holds (privileges are already gone)."""
    if len(argv) < 5 or argv[3] != "--":
        raise SystemExit("usage: sandbox.py exec FD -- COMMAND...")
    descriptor = int(argv[2])
    with os.fdopen(descriptor, "rb") as carrier:
        environment = json.loads(carrier.read())
    command = argv[4:]
    os.execvpe(command[0], command, environment)


def main(argv: list[str]) -> None:
    cluster_dir, temp_root, home, count = argv[1], argv[2], argv[3], int(argv[4])
    keep = argv[5 : 5 + count]
    bind_count = int(argv[5 + count])
    binds = argv[6 + count : 6 + count + bind_count]
    if argv[6 + count + bind_count] != "--":
        raise SystemExit("usage: sandbox.py CLUSTER_DIR TEMP_ROOT RAYPOD_HOME N KEEP... M BIND... -- COMMAND...")
    command = argv[7 + count + bind_count :]
    _run("mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", "/run")
    staged = []
    for index, path in enumerate([cluster_dir, *keep, *binds]):
        stage = f"{STAGE}/{index}"
        os.makedirs(stage)
        _run("mount", "--bind", path, stage)
        staged.append((stage, path))
    kept, bound = staged[: 1 + len(keep)], staged[1 + len(keep) :]
    _run("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", temp_root)
    for stage, path in kept:
        os.makedirs(path, exist_ok=True)
        _run("mount", "--move", stage, path)
    covered = os.path.isdir(home)
    if covered:
        _run("mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", home)
    for stage, path in bound:
        os.makedirs(path, exist_ok=True)  # on the tmpfs that covers home or the temporary root
        _run("mount", "--move", stage, path)
    if covered:
        _run("mount", "-o", "remount,ro", home)
    os.execv(command[0], command)


if __name__ == "__main__":
    if sys.argv[1:2] == ["exec"]:
        run_dropped(sys.argv)
    else:
        main(sys.argv)
