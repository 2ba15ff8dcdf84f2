"""Port allocation for local Ray nodes sees ports held on any address, not only on loopback."""

from __future__ import annotations

import socket

from raypod.backends import _ports


def host_address() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
        return str(probe.getsockname()[0])


def test_a_port_held_on_the_host_address_is_not_free() -> None:
    with socket.socket() as holder:
        holder.bind((host_address(), 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert not _ports.is_bindable(port)
    assert _ports.is_bindable(port)


def test_allocate_skips_reserved_and_held_ports() -> None:
    allowed = set(range(_ports.PORT_RANGE.stop - 10, _ports.PORT_RANGE.stop))
    held_port = next(port for port in sorted(allowed) if _ports.is_bindable(port))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", held_port))
        holder.listen()
        chosen = _ports.allocate(3, set(_ports.PORT_RANGE) - allowed)
    assert len(set(chosen)) == 3 and set(chosen) <= allowed - {held_port}
