"""Tailing a rank's log without ever holding much of it: bounded reads, bounded lines, RE2 matching."""

from __future__ import annotations

import os
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


def last_lines(path: str | None, count: int = TAIL_LINES, max_bytes: int = 64 * 1024) -> list[str]:
    """The file's last ``count`` lines, from at most its last ``max_bytes`` (each cut to 1000 characters)."""
    if not path:
        return []
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read(max_bytes)
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first one is cut
    return [line[:1000] for line in lines[-count:]]


class LogTail:
    """New complete lines of one file since the last read; its offset is what a restarted agent resumes from."""

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self._partial = b""
        self._skipping = False

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
        return data.decode("utf-8", errors="replace").rstrip("\r")
