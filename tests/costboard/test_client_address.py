"""The address a request comes from: the peer's, or behind a trusted proxy the right-most
X-Forwarded-For entry that is not a trusted proxy; a forged or garbled header changes nothing
it should not, and a bad DJANGO_TRUSTED_PROXIES stops start-up naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory

from costboard.client_address import (
    TrustedProxies,
    client_address,
    parse_address,
    trusted_proxies,
)

ROOT = Path(__file__).resolve().parents[2]


def address_of(remote: str | None, forwarded: str | None = None) -> str | None:
    request = RequestFactory().get("/")
    if remote is None:
        del request.META["REMOTE_ADDR"]
    else:
        request.META["REMOTE_ADDR"] = remote
    if forwarded is not None:
        request.META["HTTP_X_FORWARDED_FOR"] = forwarded
    return client_address(request)


@pytest.fixture
def behind_proxies(settings: Any) -> None:
    settings.TRUSTED_PROXIES = ["10.9.9.9", "10.8.0.0/16", "fd00:9::/64"]


def test_without_trusted_proxies_the_header_is_ignored() -> None:
    assert address_of("10.0.0.1") == "10.0.0.1"
    assert address_of("10.0.0.1", "10.0.0.2") == "10.0.0.1"
    assert address_of("10.9.9.9", "10.0.0.2") == "10.9.9.9"  # not named: no proxy of ours


def test_an_untrusted_peer_s_header_is_ignored(behind_proxies: None) -> None:
    assert address_of("203.0.113.7", "10.0.0.2") == "203.0.113.7"
    assert address_of("203.0.113.7", "10.9.9.9") == "203.0.113.7"


def test_a_trusted_proxy_s_header_names_the_client(behind_proxies: None) -> None:
    assert address_of("10.9.9.9", "10.0.0.1") == "10.0.0.1"
    assert address_of("10.9.9.9", " 10.0.0.2 ") == "10.0.0.2"
    assert address_of("10.8.3.4", "2001:db8::5") == "2001:db8::5"  # a proxy of a CIDR
    assert address_of("fd00:9::1", "198.51.100.4") == "198.51.100.4"  # an IPv6 proxy
    assert address_of("10.9.9.9", "") == "10.9.9.9"  # no header: the proxy itself asks


def test_the_right_most_entry_not_a_proxy_is_the_client(behind_proxies: None) -> None:
    # what the client wrote is on the left: never read past the first address not a proxy
    assert address_of("10.9.9.9", "10.0.0.2, 10.0.0.66") == "10.0.0.66"
    assert address_of("10.9.9.9", "garbage, 10.0.0.66") == "10.0.0.66"
    # proxies in a chain append too: they are passed over
    assert address_of("10.9.9.9", "10.0.0.2, 10.0.0.66, 10.8.1.1, 10.9.9.9") == "10.0.0.66"
    # every entry a proxy: the farthest one
    assert address_of("10.9.9.9", "10.8.1.1, 10.9.9.9") == "10.8.1.1"


def test_a_garbled_header_falls_back_to_the_peer(behind_proxies: None) -> None:
    for header in ("not an address", "10.0.0.1, unknown", "10.0.0.300", "10.0.0.1:http", ","):
        assert address_of("10.9.9.9", header) == "10.9.9.9", header
    # garbage where it is read (between the client's entry and us): the peer's, too
    assert address_of("10.9.9.9", "10.0.0.1, bogus, 10.8.1.1") == "10.9.9.9"


def test_addresses_are_read_as_proxies_write_them(behind_proxies: None) -> None:
    assert address_of("10.9.9.9", "10.0.0.1:5123") == "10.0.0.1"
    assert address_of("10.9.9.9", "[2001:db8::7]:443") == "2001:db8::7"
    assert address_of("10.9.9.9", "[2001:db8::7]") == "2001:db8::7"
    assert address_of("10.9.9.9", "2001:DB8:0::7") == "2001:db8::7"  # one spelling per address
    assert address_of("::ffff:10.9.9.9", "10.0.0.1") == "10.0.0.1"  # a dual-stack socket's peer
    assert address_of("10.9.9.9", "::ffff:10.0.0.1") == "10.0.0.1"
    assert address_of("10.9.9.9", "fe80::1%eth0") == "fe80::1"


def test_a_peer_without_an_address_has_none() -> None:
    assert address_of(None) is None  # a request made up in code
    assert address_of("") is None  # a Unix socket
    assert address_of("", "10.0.0.1") is None  # not trusted: its header is ignored
    assert parse_address("[2001:db8::7]x") is None
    assert parse_address("[2001:db8::7") is None


def test_a_proxy_on_a_unix_socket_is_trusted_when_named(settings: Any) -> None:
    settings.TRUSTED_PROXIES = ["unix"]
    assert address_of("", "10.0.0.1") == "10.0.0.1"
    assert address_of("", "10.0.0.2, 10.0.0.1") == "10.0.0.1"
    assert address_of("", "garbage") is None
    assert address_of("", "") is None
    assert address_of("10.9.9.9", "10.0.0.1") == "10.9.9.9"  # an address peer: not named
    assert address_of(None, "10.0.0.1") is None  # made up in code: no socket at all


@pytest.mark.parametrize(
    "entry", ["proxy.internal", "10.0.0.1/8", "10.0.0.0/33", "10.0.0.1:8080", "*"]
)
def test_a_bad_trusted_proxy_is_named_with_the_fix(entry: str) -> None:
    with pytest.raises(ImproperlyConfigured) as raised:
        trusted_proxies(f"10.9.9.9, {entry}")
    assert "DJANGO_TRUSTED_PROXIES" in str(raised.value)
    assert repr(entry) in str(raised.value)
    assert "10.0.0.0/24" in str(raised.value) and "unix" in str(raised.value)  # what to write


def test_trusted_proxies_take_addresses_and_cidrs_of_both_families() -> None:
    proxies = trusted_proxies(" 10.9.9.9 , 10.8.0.0/16,, fd00:9::/64, [::1] ")
    assert [str(n) for n in proxies.networks] == [
        "10.9.9.9/32",
        "10.8.0.0/16",
        "fd00:9::/64",
        "::1/128",
    ]
    assert not proxies.unix_socket
    assert trusted_proxies("10.9.9.9,UNIX").unix_socket
    assert trusted_proxies("") == TrustedProxies()


@pytest.mark.slow
def test_a_bad_setting_stops_start_up_naming_it() -> None:
    env = {
        **os.environ,
        "DJANGO_TRUSTED_PROXIES": "10.9.9.9,proxy.internal",
        "DJANGO_SETTINGS_MODULE": "costboard.settings",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "DJANGO_TRUSTED_PROXIES: 'proxy.internal' is not an address or CIDR" in result.stderr
