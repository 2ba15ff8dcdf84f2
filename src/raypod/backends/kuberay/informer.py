"""A list-then-watch cache of one kind of Kubernetes object, as client-go's informers keep: the control plane reads
this cache on every pass and the API server sees one long watch per kind, not one request per cluster per pass.

It lists (remembering the list's ``resourceVersion``), then watches from there; a watch that ends is resumed from
the last version seen; ``410 Gone`` (the version was compacted away) re-lists. While the API server cannot be
reached the cache keeps what it had and says it is stale, so callers report *unknown* rather than *gone*.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from raypod.backends.kuberay import api_errors

log = logging.getLogger(__name__)

ListCall = Callable[..., Any]
Key = tuple[str, str]  # (namespace, name)

MAX_BACKOFF_S = 30.0


class Gone(Exception):
    """The watch's resourceVersion is too old: list again."""


class Informer:
    def __init__(
        self,
        kind: str,
        list_call: ListCall,
        *,
        watch_timeout_s: int = 300,
        request_timeout_s: float = 30.0,
        on_change: Callable[[Key, dict[str, Any] | None], None] | None = None,
        on_sync_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.kind = kind
        self._list_call = list_call
        self._watch_timeout_s = watch_timeout_s
        self._request_timeout_s = request_timeout_s
        self._on_change = on_change
        self._on_sync_change = on_sync_change
        self._lock = threading.Lock()
        self._objects: dict[Key, dict[str, Any]] = {}
        self._resource_version = ""
        self._synced = False
        self._error = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None  # the watch in flight, closed by stop()
        self.lists = 0  # how many times it listed: once, plus once per 410 or outage

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"raypod-watch-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop watching; waits up to ``timeout_s`` for the thread (a watch in flight ends at its next event, or
        when its connection does)."""
        self._stop.set()
        with self._lock:
            response, self._response = self._response, None
        if response is not None:
            # Shutting the socket down (not closing the response, whose buffer lock the blocked read holds) makes
            # the watch's read return at once.
            sock = getattr(getattr(response, "connection", None), "sock", None)
            with contextlib.suppress(OSError):
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)

    @property
    def synced(self) -> bool:
        """Listed, and the watch since then has not failed: the cache is what the API server has."""
        with self._lock:
            return self._synced

    @property
    def error(self) -> str:
        with self._lock:
            return self._error

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objects.values())

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((namespace, name))

    def wait_synced(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.synced and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.synced

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._list()
                failures = 0
                while not self._stop.is_set():
                    self._watch()  # returns when the server ends the watch: resume from the last version
            except Gone:
                log.info("watch of %s: resourceVersion expired (410); listing again", self.kind)
                continue
            except ApiException as exc:
                if exc.status == 410:
                    continue
                failures = self._failed(exc, failures)
            except Exception as exc:  # an outage, a refusal: keep the cache, say it is stale, try again
                failures = self._failed(exc, failures)

    def _failed(self, exc: Exception, failures: int) -> int:
        failures += 1
        message = api_errors.explain(exc, f"watch {self.kind}")
        with self._lock:
            was_synced, self._synced = self._synced, False
            self._error = message
        if was_synced and self._on_sync_change is not None:
            self._on_sync_change(False)
        delay = min(2.0 ** min(failures, 5) / 4, MAX_BACKOFF_S)
        log.warning("%s; retrying in %.1f s", message, delay)
        self._stop.wait(delay)
        return failures

    def _list(self) -> None:
        response = self._list_call(_preload_content=False, _request_timeout=self._request_timeout_s)
        body = json.loads(response.data)
        fresh = {_key(item): item for item in body.get("items", [])}
        with self._lock:
            previous, self._objects = self._objects, fresh
            self._resource_version = str(body.get("metadata", {}).get("resourceVersion", ""))
            was_synced, self._synced = self._synced, True
            self._error = ""
            self.lists += 1
        if not was_synced and self._on_sync_change is not None:
            self._on_sync_change(True)
        if self._on_change is not None:
            for key in previous.keys() - fresh.keys():
                self._on_change(key, None)
            for key, item in fresh.items():
                if previous.get(key) != item:
                    self._on_change(key, item)

    def _watch(self) -> None:
        response = self._list_call(
            watch=True,
            resource_version=self._resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_timeout_s,
            _preload_content=False,
            _request_timeout=(self._request_timeout_s, self._watch_timeout_s + self._request_timeout_s),
        )
        with self._lock:
            self._response = response
        try:
            for event in _events(response):
                if self._stop.is_set():
                    return
                self._apply(event)
        finally:
            with self._lock:
                self._response = None
            response.release_conn()

    def _apply(self, event: dict[str, Any]) -> None:
        kind, item = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if item.get("code") == 410:
                raise Gone()
            raise ApiException(status=item.get("code", 500), reason=item.get("message", "watch error"))
        version = str(item.get("metadata", {}).get("resourceVersion", ""))
        key = _key(item)
        with self._lock:
            if version:
                self._resource_version = version
            if kind == "BOOKMARK":
                return
            if kind == "DELETED":
                self._objects.pop(key, None)
            else:
                self._objects[key] = item
        if self._on_change is not None:
            self._on_change(key, None if kind == "DELETED" else item)


def _key(item: dict[str, Any]) -> Key:
    metadata = item.get("metadata", {})
    return metadata.get("namespace", ""), metadata.get("name", "")


def _events(response: Any) -> Iterator[dict[str, Any]]:
    for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
        if line.strip():
            yield json.loads(line)
