"""Tailing a rank's log without ever holding much of it: bounded reads, bounded lines, RE2 matching."""

from __future__ import annotations

import os
from collections import deque
from typing import Any

import re2

MAX_LINE_BYTES = 16 * 1024  # a longer line is cut here; the rest of it up to its newline is skipped
MAX_READ_BYTES = 4 * 2**20  # per poll and log: a log that grows faster is caught up over several polls
TAIL_LINES = 20

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


def compile_pattern(pattern: str) -> Any:
    """A linear-time matcher: no pattern (``(a+)+$`` included) can make a line take long."""
    return re2.compile(pattern, _OPTIONS)


class LogTail:
    """New complete lines of one file since the last read; its offset is what a restarted agent resumes from."""

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self._partial = b""
        self._skipping = False
        self.last_lines: deque[str] = deque(maxlen=TAIL_LINES)

    def read(self) -> list[str]:
        try:
            size = os.path.getsize(self.path)
        except OSError:
            return []
        if size < self.offset:  # truncated or replaced: start over
            self.offset, self._partial, self._skipping = 0, b"", False
        if size == self.offset:
            return []
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read(min(size - self.offset, MAX_READ_BYTES))
        except OSError:
            return []
        self.offset += len(chunk)
        lines: list[str] = []
        pieces = chunk.split(b"\n")
        for index, piece in enumerate(pieces):
            is_last = index == len(pieces) - 1
            if self._skipping:
                if not is_last:
                    self._skipping = False
                continue
            data = self._partial + piece
            if is_last:
                self._partial = data[:MAX_LINE_BYTES]
                if len(data) > MAX_LINE_BYTES:
                    lines.append(self._finish(self._partial))
                    self._partial, self._skipping = b"", True
                continue
            self._partial = b""
            lines.append(self._finish(data[:MAX_LINE_BYTES]))
        return lines

    def _finish(self, data: bytes) -> str:
        line = data.decode("utf-8", errors="replace").rstrip("\r")
        self.last_lines.append(line[:1000])
        return line
