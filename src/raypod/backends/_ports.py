"""Free-port allocation for Ray nodes on one host, outside the kernel's ephemeral range and Ray's worker range."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterable

from raypod import errors

PORT_RANGE = range(20000, 30000)


def is_bindable(port: int) -> bool:
    """Whether nothing holds ``port`` on any address: Ray binds its gRPC ports to the host's address, not
    loopback, so a loopback-only probe would miss them (and another installation's nodes)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As Ray's servers do: connections in TIME_WAIT do not keep a port from being reused, listeners do.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def is_listening(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


def allocate(count: int, reserved: Iterable[int]) -> list[int]:
    """Return ``count`` distinct ports that are neither reserved nor bound right now.

    Raises:
        TransientError: the range is exhausted.
    """
    taken = set(reserved)
    candidates = [port for port in PORT_RANGE if port not in taken]
    random.shuffle(candidates)
    chosen: list[int] = []
    for port in candidates:
        if is_bindable(port):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise errors.TransientError(f"no free ports left in {PORT_RANGE.start}-{PORT_RANGE.stop - 1}")
