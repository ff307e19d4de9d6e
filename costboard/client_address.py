"""Which address a request comes from: what the login lockout keys on (django-axes'
AXES_CLIENT_IP_CALLABLE), and what anything else that tells clients apart should use.

The peer's address (REMOTE_ADDR) is the client, unless the peer is a reverse proxy the
operator names in DJANGO_TRUSTED_PROXIES (addresses or CIDRs, IPv4 and IPv6; empty by
default). Then X-Forwarded-For is read from the right, the end each proxy appends to: the
first entry that is not itself a trusted proxy is the client. What lies to its left was
written by the client and is never read, so a forged header cannot choose the address a
request is counted under, nor take someone else's. From any other peer the header is
ignored. A header that is not addresses where it is read (before the client's entry) counts
as absent: the peer's address it is.

Behind a proxy and without DJANGO_TRUSTED_PROXIES, every client has the proxy's address
(docs/operations.md, "Behind a reverse proxy").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SETTING = "DJANGO_TRUSTED_PROXIES"
HEADER = "HTTP_X_FORWARDED_FOR"


def _proxy_entry(entry: str) -> IPNetwork:
    text = entry.strip()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return ipaddress.ip_network(bare)
    except ValueError as exc:
        why = str(exc)
    raise ImproperlyConfigured(
        f"{SETTING}: {entry!r} is not an address or CIDR ({why}); list the reverse proxies "
        "in front of Costboard, comma-separated, e.g. 10.0.0.5, 10.0.0.0/24, fd00::/8 "
        "(a CIDR without host bits: 10.0.0.0/8, not 10.0.0.1/8)."
    )


@lru_cache(maxsize=8)
def _proxy_networks(entries: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return tuple(_proxy_entry(entry) for entry in entries)


def trusted_proxies(entries: Iterable[str] | str | None = None) -> tuple[IPNetwork, ...]:
    """The trusted proxies' networks of these entries (a comma-separated string or a list),
    by default of the setting; ImproperlyConfigured names a bad entry and the fix."""
    if entries is None:
        entries = getattr(settings, "TRUSTED_PROXIES", ())
    if isinstance(entries, str):
        entries = entries.split(",")
    return _proxy_networks(tuple(e.strip() for e in entries if e.strip()))


def parse_address(text: str) -> IPAddress | None:
    """An address as peers and proxies write it (`10.0.0.1`, `10.0.0.1:5678`, `2001:db8::1`,
    `[2001:db8::1]:443`), IPv4 inside IPv6 (::ffff:10.0.0.1) as the IPv4 address it is, no
    zone; None for anything else."""
    host = text.strip()
    if host.startswith("["):  # [v6] or [v6]:port
        inside, bracket, port = host[1:].partition("]")
        if not bracket or (port and not (port[0] == ":" and port[1:].isdigit())):
            return None
        host = inside
    elif host.count(":") == 1:  # v4:port
        host, _, port = host.partition(":")
        if not port.isdigit():
            return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.scope_id:
            return ipaddress.IPv6Address(int(address))
    return address


def _is_trusted(address: IPAddress, proxies: tuple[IPNetwork, ...]) -> bool:
    return any(address in network for network in proxies)


def forwarded_client(header: str, proxies: tuple[IPNetwork, ...]) -> IPAddress | None:
    """The client X-Forwarded-For names behind this trusted peer: its right-most entry that is
    not a trusted proxy (the left-most if all are); None when the header is empty or not
    addresses where it is read."""
    entries = [entry for entry in header.split(",") if entry.strip()]
    found: IPAddress | None = None
    for entry in reversed(entries):
        found = parse_address(entry)
        if found is None:
            return None
        if not _is_trusted(found, proxies):
            return found
    return found


def client_address(request: HttpRequest) -> str | None:
    """The address this request comes from (see the module's docstring); None when the peer
    has no IP address (a Unix socket, a request made up in code)."""
    peer = parse_address(request.META.get("REMOTE_ADDR") or "")
    if peer is None:
        return None
    proxies = trusted_proxies()
    header = request.META.get(HEADER, "")
    if header and _is_trusted(peer, proxies):
        client = forwarded_client(header, proxies)
        if client is not None:
            return str(client)
    return str(peer)
