"""Where a webhook may go: not to this machine, the local network or a cloud metadata service
(a URL typed into the admin must not turn Costboard into a way in), checked when an endpoint
is saved and again at every send.

At send the host is resolved once, every address it resolves to is checked, and the request
connects to those checked addresses only (pinned): a name that resolves to a public address
when saved and to 127.0.0.1 when sent (DNS rebinding) is refused, and one that changes its
answer between the check and the connection is never asked again. The Host header, SNI and
the certificate check still use the URL's host name. No proxy, no redirects.

Refused, unless allowed by COSTBOARD_WEBHOOK_ALLOW_HOSTS: loopback, private, link-local,
shared (100.64.0.0/10), multicast, reserved and unspecified addresses, those carried inside
IPv6 (::ffff:127.0.0.1, NAT64, 6to4), and names of this machine ("localhost", *.localhost).
The allow list holds host names (`hooks.corp.example`; `.corp.example` for a domain and its
subdomains: sent wherever they resolve) and addresses or CIDRs (`10.0.0.0/8`: an address
inside is allowed). Cloud metadata addresses and names are refused whatever the list says.

A failed request keeps its status and a short reason of ours, never what the receiver said —
but for where a redirect points (its Location's scheme, host and path: `redirect_reason`),
which the admin needs to set the final URL.
"""

from __future__ import annotations

import http
import http.client
import ipaddress
import math
import re
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, cast
from urllib.parse import urljoin, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOW_SETTING = "COSTBOARD_WEBHOOK_ALLOW_HOSTS"
REASON_CHARS = 200
_ALLOW_FIX = f"allow it with {ALLOW_SETTING}"
_NEVER = "webhooks never go there"

# Instance metadata (cloud credentials): AWS (IPv4, IPv6, ECS tasks), Azure's wire server,
# Alibaba. No receiver lives there, so no allow list opens them.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",
        "169.254.170.2",
        "fd00:ec2::254",
        "168.63.129.16",
        "100.100.100.200",
    )
)
_METADATA_NAMES = frozenset(
    {"metadata", "metadata.google.internal", "metadata.goog", "instance-data.ec2.internal"}
)
# Names of this machine that need no DNS to say so (RFC 6761; Debian's /etc/hosts).
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT, not private, not public
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


class WebhookRefused(Exception):
    """A URL webhooks may not go to; str() says why and how to allow it."""


# --- the allow list -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AllowList:
    names: frozenset[str] = frozenset()
    domains: tuple[str, ...] = ()  # ".corp.example": that name and every name under it
    networks: tuple[IPNetwork, ...] = ()

    def allows_name(self, host: str) -> bool:
        return host in self.names or any(
            host == domain[1:] or host.endswith(domain) for domain in self.domains
        )

    def allows_address(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)


def _allow_entry(entry: str) -> str | IPNetwork:
    """One entry of the allow list: a host name (lower case, ".domain" kept) or a network."""
    text = entry.strip().lower()
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    name = text.rstrip(".")
    why = "not a host name, address or CIDR"
    # an address or CIDR: a slash, a colon (IPv6; a host name has none) or a numeric last label
    if "/" in bare or ":" in bare or name.rpartition(".")[2].isdigit():
        try:
            return ipaddress.ip_network(bare)
        except ValueError as exc:
            why = f"{why} ({exc})"
    elif all(_LABEL.fullmatch(label) for label in name.removeprefix(".").split(".")):
        return name
    raise ImproperlyConfigured(
        f"{ALLOW_SETTING}: {entry!r} is {why}; list hosts alone, comma-separated, without "
        "scheme, port or wildcard: hooks.corp.example, .corp.example (it and its subdomains), "
        "10.1.2.3, 10.0.0.0/8, fd00::/8."
    )


@lru_cache(maxsize=8)
def _allow_list(entries: tuple[str, ...]) -> AllowList:
    names: set[str] = set()
    domains: list[str] = []
    networks: list[IPNetwork] = []
    for entry in entries:
        parsed = _allow_entry(entry)
        if isinstance(parsed, str):
            (domains.append if parsed.startswith(".") else names.add)(parsed)
        else:
            networks.append(parsed)
    return AllowList(frozenset(names), tuple(domains), tuple(networks))


def webhook_allow_list(entries: Iterable[str] | str | None = None) -> AllowList:
    """The allow list of these entries (a comma-separated string or a list), by default of
    the setting; ImproperlyConfigured names a bad entry and the fix."""
    if entries is None:
        entries = getattr(settings, ALLOW_SETTING, ())
    if isinstance(entries, str):
        entries = entries.split(",")
    return _allow_list(tuple(e.strip() for e in entries if e.strip()))


# --- what an address is -------------------------------------------------------------------


def _carried_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches: mapped (::ffff:a.b.c.d), NAT64, 6to4."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def _kind(address: IPAddress) -> str | None:
    """What makes an address no place for a webhook; None for a public one."""
    if address.is_unspecified:
        return "an unspecified address (it reaches this machine)"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return "a shared (carrier-grade NAT) address"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "not a public address"
    return None


def _subject(address: IPAddress, host: str) -> str:
    carried = _carried_ipv4(address)
    shown = f"{address} ({carried})" if carried else str(address)
    return f"{host} resolves to {shown}," if host else f"{shown} is"


def _is_metadata(address: IPAddress) -> bool:
    return address in METADATA_ADDRESSES or _carried_ipv4(address) in METADATA_ADDRESSES


def address_refusal(address: IPAddress, allow: AllowList, *, host: str = "") -> str | None:
    """Why a webhook may not connect to this address (`host` resolved to it), or None."""
    if _is_metadata(address):
        return f"{_subject(address, host)} a cloud metadata address; {_NEVER}"
    inner = _carried_ipv4(address) or address
    kind = _kind(inner) or _kind(address)
    if kind is None or allow.allows_address(address) or allow.allows_address(inner):
        return None
    return f"{_subject(address, host)} {kind}; {_ALLOW_FIX}"


# --- a URL's destination ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Destination:
    host: str  # as the URL names it: for the Host header, SNI and the certificate
    port: int
    addresses: tuple[IPAddress, ...]  # checked; the request connects to these, in order


def _host_and_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in {"http", "https"}:
        raise WebhookRefused("the URL must start with http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused(
            "the URL has a user name or password in it; remove them (receivers check the "
            "X-Costboard-Signature instead)"
        )
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise WebhookRefused("the URL has no host")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise WebhookRefused("the URL's port must be a number from 1 to 65535")
    return host, port or (443 if parts.scheme == "https" else 80)


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _resolve(host: str, port: int) -> tuple[IPAddress, ...]:
    """Every address `host` resolves to, asked once, in the resolver's order."""
    found: list[IPAddress] = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        if family in (socket.AF_INET, socket.AF_INET6):
            address = ipaddress.ip_address(sockaddr[0])
            if address not in found:
                found.append(address)
    if not found:
        raise socket.gaierror(socket.EAI_NONAME, "no IPv4 or IPv6 address")
    return tuple(found)


def webhook_destination(url: str, *, allow: AllowList | None = None) -> Destination:
    """Where a webhook to `url` may connect: its host resolved once and every address checked.

    Raises WebhookRefused (why, and the fix) for a URL or address webhooks may not go to, and
    OSError (socket.gaierror) or UnicodeError when the host does not resolve."""
    host, port = _host_and_port(url)
    allow = webhook_allow_list() if allow is None else allow
    if host in _METADATA_NAMES:
        raise WebhookRefused(f"{host} is a cloud metadata service; {_NEVER}")
    by_name = allow.allows_name(host)
    if not by_name and (host in _LOOPBACK_NAMES or host.endswith(".localhost")):
        raise WebhookRefused(f"{host} names this machine; {_ALLOW_FIX}")
    literal = _ip_literal(host)
    addresses = (literal,) if literal else _resolve(host, port)
    for address in addresses:
        named = "" if literal else host
        # a host allowed by name goes wherever it resolves, except to a metadata service
        if by_name and _is_metadata(address):
            raise WebhookRefused(f"{_subject(address, named)} a cloud metadata address; {_NEVER}")
        refusal = None if by_name else address_refusal(address, allow, host=named)
        if refusal:
            raise WebhookRefused(refusal)
    return Destination(host, port, addresses)


def trusted_destination(url: str) -> Destination:
    """Where a URL of the operator's settings (COSTBOARD_PAGERDUTY_EVENTS_URL) connects: its
    host resolved once, no address refused — it is not typed into the admin."""
    host, port = _host_and_port(url)
    literal = _ip_literal(host)
    return Destination(host, port, (literal,) if literal else _resolve(host, port))


@dataclass(frozen=True, slots=True)
class UrlCheck:
    refusal: str | None = None  # why the URL may not be saved
    note: str = ""  # worth telling whoever saves it


def webhook_url_check(url: str) -> UrlCheck:
    """The check at save: a refused URL, or a note when its host does not resolve (now) — it
    is saved then, and checked again at every send."""
    try:
        webhook_destination(url)
    except WebhookRefused as exc:
        return UrlCheck(refusal=short(str(exc)))
    except (OSError, UnicodeError) as exc:
        host = urlsplit(url).hostname
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return UrlCheck(
            note=short(
                f"{host} does not resolve from this server ({why}); saved, and checked again "
                "before every send"
            )
        )
    return UrlCheck()


def webhook_url_refusal(url: str) -> str | None:
    """Why a webhook may not use this URL, or None (also when its host does not resolve)."""
    return webhook_url_check(url).refusal


# --- connecting to the checked addresses only ---------------------------------------------


class _Deadline:
    """A socket whose every wait is cut to what is left of its request's deadline: the
    timeout bounds the whole request, so a receiver that trickles its reply a byte at a time
    (each within a socket timeout, which is per wait) cannot hold a dispatcher past it. Mixed
    into the TCP socket and, as the context's `sslsocket_class`, the TLS one."""

    deadline = math.inf  # time.monotonic()'s

    def cut_to_deadline(self) -> None:
        if self.deadline == math.inf:
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took longer than its timeout in all")
        cast(socket.socket, self).settimeout(left)

    def recv_into(self, *args: Any) -> int:
        self.cut_to_deadline()
        return cast(int, super().recv_into(*args))  # type: ignore[misc]

    def sendall(self, *args: Any) -> None:
        self.cut_to_deadline()
        super().sendall(*args)  # type: ignore[misc]


class _DeadlineSocket(_Deadline, socket.socket):
    pass


class _DeadlineSSLSocket(_Deadline, ssl.SSLSocket):
    pass


def _pinned_socket(
    addresses: tuple[IPAddress, ...],
    port: int,
    timeout: float | None,
) -> _DeadlineSocket:
    """A TCP connection to the first of `addresses` that answers (as socket.create_connection
    tries each address a name resolves to), without resolving anything again. `timeout`
    bounds the connecting and everything read and sent on it after (_DeadlineSocket)."""
    deadline = time.monotonic() + timeout if isinstance(timeout, int | float) else math.inf
    error: OSError | None = None
    for address in addresses:
        family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
        sock = _DeadlineSocket(family, socket.SOCK_STREAM)
        sock.deadline = deadline
        try:
            sock.cut_to_deadline()
            sock.connect((str(address), port))
        except OSError as exc:
            sock.close()
            error = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise error or OSError("no address to connect to")


class _PinnedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, *, addresses: tuple[IPAddress, ...], **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._addresses = addresses

    def connect(self) -> None:
        self.sock = _pinned_socket(self._addresses, self.port, self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(
        self,
        host: str,
        *,
        addresses: tuple[IPAddress, ...],
        context: ssl.SSLContext,
        **kwargs: Any,
    ) -> None:
        super().__init__(host, context=context, **kwargs)
        self._addresses = addresses
        self._tls = context

    def connect(self) -> None:
        sock = _pinned_socket(self._addresses, self.port, self.timeout)
        self._tls.sslsocket_class = _DeadlineSSLSocket
        try:  # SNI and the certificate check are for the URL's host name, not the address
            sock.cut_to_deadline()  # the handshake within what is left
            tls = self._tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        assert isinstance(tls, _DeadlineSSLSocket)  # noqa: S101 — the class set above
        tls.deadline = sock.deadline
        self.sock = tls


class _PinnedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, destination: Destination) -> None:
        super().__init__()
        self._destination = destination

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = partial(_PinnedHTTPConnection, addresses=self._destination.addresses)
        return self.do_open(connection, req)


class _PinnedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, destination: Destination) -> None:
        super().__init__()
        self._destination = destination

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        connection = partial(
            _PinnedHTTPSConnection,
            addresses=self._destination.addresses,
            context=ssl.create_default_context(),  # read afresh: SSL_CERT_FILE, a new CA
        )
        return self.do_open(connection, req)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A webhook is POSTed where it is configured and checked: a redirect could point
    anywhere (127.0.0.1 too), and urllib would re-send the POST as a GET without its body."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def webhook_opener(destination: Destination) -> urllib.request.OpenerDirector:
    """A urllib opener that connects only to the destination's checked addresses: through no
    proxy (one would resolve the name itself), following no redirect."""
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}),
        _NoRedirects,
        _PinnedHTTPHandler(destination),
        _PinnedHTTPSHandler(destination),
    )


# --- what a failure keeps -----------------------------------------------------------------


def short(reason: str) -> str:
    """A reason cut to REASON_CHARS."""
    return reason if len(reason) <= REASON_CHARS else reason[: REASON_CHARS - 1] + "…"


def status_reason(code: int) -> str:
    """ "HTTP 500 Internal Server Error": the status and its standard phrase — never the
    receiver's own reason phrase or body, which may echo secrets back into our admin."""
    try:
        phrase = http.HTTPStatus(code).phrase
    except ValueError:
        return f"HTTP {code}"
    return f"HTTP {code} {phrase}"


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def redirect_reason(code: int, location: str | None, url: str, *, path_secret: bool) -> str:
    """Why a 3xx answer fails at once, and where the URL redirects (`location` resolved
    against `url`): the admin sets the final URL, as a retry would be redirected the same.
    Only the scheme, host and path of it are shown — a query may hold a token — and with
    `path_secret` (a Slack URL, whose path is its secret) no path either."""
    fix = "redirects are not followed: use the final URL"
    status = status_reason(code)
    if not location or not location.strip():
        return short(f"{status}: the URL redirects (no Location given); {fix}")
    parts, host, port = None, "", ""
    try:
        parts = urlsplit(urljoin(url, location.strip()))
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is no number, a bad IPv6 literal
        parts = None
    if parts is None or parts.scheme not in {"http", "https"} or not host:
        return short(f"{status}: the URL redirects to an address that is no http(s) URL; {fix}")
    host = f"[{host}]" if ":" in host else host
    if path_secret:
        where = f"{parts.scheme}://{host}{port}/…"
    else:
        where = f"{parts.scheme}://{host}{port}{parts.path}" + ("?…" if parts.query else "")
    return f"{status}: the URL redirects to {short(_printable(where))}; {fix}"


_REDIRECT_PATH = re.compile(
    r"(the URL redirects to [A-Za-z][A-Za-z0-9+.-]*://[^/]*)/.*?(?=; redirects are not followed)"
)


def redirect_pathless(reason: str) -> str:
    """A failure's reason with the path a redirect names left out (`https://host/…`), for
    whoever is shown a webhook's URL without its path: it may hold a token."""
    return _REDIRECT_PATH.sub(r"\1/…", reason)
