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
5. drops every capability (``setpriv``) and execs the node's command, so nothing in the node can undo the mounts.

Usage: sandbox.py CLUSTER_DIR TEMP_ROOT RAYPOD_HOME N KEEP_1 .. KEEP_N M BIND_1 .. BIND_M -- COMMAND ...
"""

from __future__ import annotations

import os
import subprocess
import sys

STAGE = "/run/raypod-stage"


def _run(*command: str) -> None:
    subprocess.run(command, check=True)


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
    drop = ["--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs"]
    os.execvp("setpriv", ["setpriv", *drop, "--", *command])


if __name__ == "__main__":
    main(sys.argv)
