"""A user's health check in a Ray pod: ``/bin/sh -c`` through the API server's ``pods/exec`` (a websocket), in
the Ray container, as the pod's user; killed at its timeout by ``timeout`` in the container, and abandoned by
raypod at the timeout in any case."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client
from kubernetes.stream import stream

from raypod.backends.commands import MAX_OUTPUT_BYTES, CommandResult
from raypod.backends.kuberay import api_errors


class PodExec:
    def __init__(self, configuration: client.Configuration) -> None:
        # ``stream`` swaps its ApiClient's transport for a websocket while it runs: a client of its own, so the
        # informers' watches never see that.
        self._core = client.CoreV1Api(client.ApiClient(configuration))

    def run(self, namespace: str, pod: str, container: str, command: str, timeout_s: float) -> CommandResult:
        """Raises TransientError (the API server cannot be reached), PermanentError (RBAC: pods/exec)."""
        started = time.monotonic()
        # coreutils' timeout kills it in the container (Ray's images have it); raypod stops waiting in any case.
        argv = ["timeout", "-s", "KILL", str(max(1, int(timeout_s))), "/bin/sh", "-c", command]
        try:
            response: Any = stream(
                self._core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                container=container,
                command=argv,
                stderr=True,
                stdin=False,
                stdout=True,
                tty=False,
                _preload_content=False,
            )
        except Exception as exc:
            raise api_errors.to_raypod(exc, f"exec in pod {namespace}/{pod}") from None
        output = ""
        try:
            deadline = started + timeout_s
            while response.is_open() and time.monotonic() < deadline:
                response.update(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
                if response.peek_stdout():
                    output = (output + response.read_stdout())[-MAX_OUTPUT_BYTES:]
                if response.peek_stderr():
                    output = (output + response.read_stderr())[-MAX_OUTPUT_BYTES:]
            timed_out = response.is_open()
            code = None if timed_out else response.returncode
        finally:
            response.close()
        return CommandResult(code, output, time.monotonic() - started)
