"""A pass of work repeated on a daemon thread: the job supervisor and the hang collector run on one each."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class Periodic:
    """Calls ``run_once`` every ``interval_s`` until stopped; a pass that raises is logged, and the next one runs."""

    thread_name = "raypod-periodic"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._woken = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._woken.set()
        self._thread.join(timeout=30)

    def wake(self) -> None:
        """Run the next pass now: a request stored work for it (a job to submit, a stop to carry out)."""
        self._woken.set()

    def run_once(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while True:
            self._woken.wait(self.interval_s)
            self._woken.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception:
                log.exception("%s: pass failed", self.thread_name)
