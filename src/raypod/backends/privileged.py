"""How the local backend runs the root helpers that build a node's sandbox (``unshare``, ``nsenter``, ``setpriv``,
``mount``): by absolute path, found once in the system's own directories, with a fixed environment.

Nothing a user supplies reaches a process that still holds privileges. A node's environment (its spec's ``env``
among it) travels to the node's command in an anonymous memory file that the last step, ``sandbox.py exec``,
reads only after ``setpriv`` has dropped every capability; a ``PATH`` or ``LD_PRELOAD`` in a spec therefore
shapes the node's own programs and never the helpers.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from raypod import errors

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
FIXED_ENVIRONMENT = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"}
SANDBOX_SCRIPT = str(Path(__file__).with_name("sandbox.py"))
UNSHARE_FLAGS = ("--mount", "--pid", "--fork", "--mount-proc", "--propagation", "private")
DROP_PRIVILEGES = ("--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--no-new-privs")


@functools.cache
def helper(name: str) -> str:
    """The absolute path of a system program in the system's own directories (never the server's ``PATH``).

    Raises:
        PermanentError: it is not installed."""
    found = shutil.which(name, path=SYSTEM_PATH)
    if found is None:
        raise errors.PermanentError(f"{name} is not installed in {SYSTEM_PATH} (util-linux)")
    return os.path.realpath(found)


def available(*names: str) -> bool:
    try:
        for name in names:
            helper(name)
    except errors.PermanentError:
        return False
    return True


@dataclass(frozen=True)
class Launch:
    """A command to start with ``subprocess``: its argv, its environment (the fixed one where a helper runs
    first), and the descriptor that carries the real environment, if any (inherited by the child; the parent
    closes it once the child runs)."""

    argv: list[str]
    env: dict[str, str]
    carrier: int | None = None

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return () if self.carrier is None else (self.carrier,)

    def close(self) -> None:
        if self.carrier is not None:
            os.close(self.carrier)


def dropped_exec(environment: Mapping[str, str], argv: list[str]) -> tuple[list[str], int]:
    """The tail that runs ``argv`` with ``environment`` once privileges are gone: ``setpriv`` (dropping every
    capability) then ``sandbox.py exec``, which reads the environment from the returned descriptor."""
    carrier = os.memfd_create("raypod-node-env", 0)  # not close-on-exec: it must reach sandbox.py exec
    try:
        os.write(carrier, json.dumps(dict(environment)).encode())
        os.lseek(carrier, 0, os.SEEK_SET)
    except BaseException:
        os.close(carrier)
        raise
    tail = [
        helper("setpriv"),
        *DROP_PRIVILEGES,
        "--",
        sys.executable,
        "-I",
        "-S",
        SANDBOX_SCRIPT,
        "exec",
        str(carrier),
        "--",
        *argv,
    ]
    return tail, carrier


def sandboxed(setup: list[str], environment: Mapping[str, str], argv: list[str], markers: Mapping[str, str]) -> Launch:
    """A new node: ``unshare`` (new mount and PID namespaces) runs ``sandbox.py`` with ``setup`` (its mounts), which
    execs the dropped tail that runs ``argv`` with ``environment``. ``markers`` are raypod's own names for the
    node (never a user's): the helpers carry them too, so every process of the node is found from its start."""
    tail, carrier = dropped_exec(environment, argv)
    head = [helper("unshare"), *UNSHARE_FLAGS, "--kill-child=SIGTERM", "--", sys.executable, "-I", "-S"]
    return Launch([*head, SANDBOX_SCRIPT, *setup, "--", *tail], {**FIXED_ENVIRONMENT, **markers}, carrier)


def in_namespaces_of(pid: int, environment: Mapping[str, str], argv: list[str], markers: Mapping[str, str]) -> Launch:
    """``argv`` inside the mount and PID namespaces of ``pid`` (a sandboxed node's), without capabilities, with
    ``environment`` (``markers``: as for ``sandboxed``)."""
    tail, carrier = dropped_exec(environment, argv)
    head = [helper("nsenter"), f"--target={pid}", "--mount", "--pid", "--"]
    return Launch([*head, *tail], {**FIXED_ENVIRONMENT, **markers}, carrier)
