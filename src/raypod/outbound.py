"""The one policy for what raypod's server fetches or posts on a user's behalf (catalog sources, hang webhooks).

A URL a user gives is refused when its host resolves to a loopback, link-local, private, shared, multicast or
otherwise reserved address, unless the operator allows that host or network (``RAYPOD_OUTBOUND_ALLOW``: a
comma-separated list of host names, addresses and CIDR networks). The check resolves the name once and returns
the addresses it checked; HTTP requests then connect to a checked address (``pinned_request``), so a name that
resolves elsewhere a moment later (DNS rebinding) cannot redirect the connection. Redirects are never followed.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from raypod import errors

ALLOW_VARIABLE = "RAYPOD_OUTBOUND_ALLOW"
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Policy:
    hosts: frozenset[str] = frozenset()
    networks: tuple[Network, ...] = field(default_factory=tuple)

    @classmethod
    def from_env(cls) -> Policy:
        return cls.parse(os.environ.get(ALLOW_VARIABLE, ""))

    @classmethod
    def parse(cls, text: str) -> Policy:
        hosts: set[str] = set()
        networks: list[Network] = []
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                hosts.add(item.lower().rstrip("."))
        return cls(frozenset(hosts), tuple(networks))

    def allows(self, host: str, address: Address) -> bool:
        if host.lower().rstrip(".") in self.hosts:
            return True
        return any(address in network for network in self.networks)


def is_public(address: Address) -> bool:
    return address.is_global and not address.is_multicast


def check_host(host: str, port: int | None, policy: Policy) -> list[Address]:
    """The addresses ``host`` resolves to, each allowed by the policy.

    Raises:
        Forbidden: an address the policy refuses (the message names the host, not the address).
        InvalidSpec: the name does not resolve."""
    try:
        found = socket.getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise errors.InvalidSpec(f"cannot resolve host '{host[:255]}'") from None
    addresses: list[Address] = []
    for *_, sockaddr in found:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if not (is_public(address) or policy.allows(host, address)):
            raise errors.Forbidden(
                f"host '{host[:255]}' is a loopback, link-local or private address, which raypod does not contact "
                f"unless an operator allows it ({ALLOW_VARIABLE})"
            )
        addresses.append(address)
    if not addresses:
        raise errors.InvalidSpec(f"cannot resolve host '{host[:255]}'")
    return addresses


def check_url(url: str, policy: Policy, schemes: Iterable[str] = ("http", "https")) -> tuple[str, list[Address]]:
    """(host, its checked addresses) of an http(s) URL. Raises InvalidSpec or Forbidden."""
    parts = urlsplit(url)
    if parts.scheme not in set(schemes) or not parts.hostname:
        raise errors.InvalidSpec(f"only {', '.join(schemes)} URLs are fetched, not '{url[:80]}'")
    return parts.hostname, check_host(parts.hostname, parts.port, policy)


def pinned_request(client: httpx.Client, method: str, url: str, policy: Policy, **kwargs: Any) -> httpx.Response:
    """One request to ``url`` connected to an address the policy checked (TLS still verifies the host name).

    Raises:
        InvalidSpec, Forbidden (the policy), httpx.HTTPError (the request)."""
    host, addresses = check_url(url, policy)
    parts = urlsplit(url)
    address = str(addresses[0])
    netloc = f"[{address}]" if ":" in address else address
    if parts.port:
        netloc += f":{parts.port}"
    pinned = urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    headers = {**kwargs.pop("headers", {}), "Host": parts.netloc.rsplit("@", 1)[-1]}
    extensions = {"sni_hostname": host} if parts.scheme == "https" else {}
    return client.request(method, pinned, headers=headers, extensions=extensions, follow_redirects=False, **kwargs)
