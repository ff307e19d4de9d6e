"""Which address a request comes from: what the login lockout keys on (django-axes'
AXES_CLIENT_IP_CALLABLE), and what anything else that tells clients apart should use.

The peer's address (REMOTE_ADDR) is the client, unless the peer is a reverse proxy the
operator names in DJANGO_TRUSTED_PROXIES (addresses or CIDRs, IPv4 and IPv6, and `unix` for
one that connects through a Unix socket; empty by default). Then X-Forwarded-For is read
from the right, the end each proxy appends to: the first entry that is not itself a trusted
proxy is the client. What lies to its left was written by the client and is never read, so a
forged header can neither choose the address a request is counted under nor take someone
else's. From any other peer the header is ignored. A header that is not addresses where it
is read (up to the client's entry) counts as absent, and the peer's address is the client's.

Behind a proxy and without DJANGO_TRUSTED_PROXIES, every client has the proxy's address
(docs/operations.md, "Behind a reverse proxy").
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SETTING = "DJANGO_TRUSTED_PROXIES"
HEADER = "HTTP_X_FORWARDED_FOR"


UNIX = "unix"  # the entry that trusts a peer on a Unix socket (gunicorn's REMOTE_ADDR is "")


@dataclass(frozen=True, slots=True)
class TrustedProxies:
    networks: tuple[IPNetwork, ...] = ()
    unix_socket: bool = False  # a proxy that reaches us through a Unix socket (no address)

    def trust(self, peer: IPAddress) -> bool:
        return any(peer in network for network in self.networks)


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
        f"(a CIDR without host bits: 10.0.0.0/8, not 10.0.0.1/8), or {UNIX} for a proxy "
        "that connects through a Unix socket."
    )


@lru_cache(maxsize=8)
def _trusted(entries: tuple[str, ...]) -> TrustedProxies:
    unix_socket = any(entry.lower() == UNIX for entry in entries)
    networks = tuple(_proxy_entry(entry) for entry in entries if entry.lower() != UNIX)
    return TrustedProxies(networks, unix_socket)


def trusted_proxies(entries: Iterable[str] | str | None = None) -> TrustedProxies:
    """The trusted proxies of these entries (a comma-separated string or a list), by default
    of the setting; ImproperlyConfigured names a bad entry and the fix."""
    if entries is None:
        entries = getattr(settings, "TRUSTED_PROXIES", ())
    if isinstance(entries, str):
        entries = entries.split(",")
    return _trusted(tuple(e.strip() for e in entries if e.strip()))


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


def forwarded_client(header: str, proxies: TrustedProxies) -> IPAddress | None:
    """The client X-Forwarded-For names behind a trusted peer: its right-most entry that is
    not a trusted proxy (the left-most if all are); None when the header is empty or not
    addresses where it is read."""
    entries = [entry for entry in header.split(",") if entry.strip()]
    found: IPAddress | None = None
    for entry in reversed(entries):
        found = parse_address(entry)
        if found is None:
            return None
        if not proxies.trust(found):
            return found
    return found


def client_address(request: HttpRequest) -> str | None:
    """The address this request comes from (see the module's docstring); None when there is
    none to tell: a peer on a Unix socket not trusted as a proxy, a request made up in code."""
    remote = request.META.get("REMOTE_ADDR")
    peer = parse_address(remote or "")
    proxies = trusted_proxies()
    on_socket = remote == ""  # gunicorn's REMOTE_ADDR for a peer on a Unix socket
    trusted = proxies.trust(peer) if peer is not None else on_socket and proxies.unix_socket
    header = request.META.get(HEADER, "")
    client = forwarded_client(header, proxies) if trusted and header else None
    if client is not None:
        return str(client)
    return str(peer) if peer is not None else None
