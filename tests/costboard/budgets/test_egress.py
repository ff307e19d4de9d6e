"""Webhook egress: no webhook reaches this machine, the local network or a cloud metadata
service unless COSTBOARD_WEBHOOK_ALLOW_HOSTS allows it — refused at save (the admin, any
ModelForm) and again at send, after resolving the host, with the connection pinned to the
address that was checked. A failed delivery keeps its status and a short reason of ours.

DNS is outside the machine, so names under .test are answered by a fake socket.getaddrinfo
(every other lookup goes to the real one). Receivers are real HTTP(S) servers on 127.0.0.1
that count what reaches them.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django import forms
from django.core.exceptions import ImproperlyConfigured
from django.forms.models import model_to_dict
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from costboard.budgets.alert_senders import webhook_send as _webhook_send
from costboard.budgets.alerts import DISPATCH, alerts_dispatch
from costboard.egress import (
    REASON_CHARS,
    redirect_pathless,
    redirect_reason,
    webhook_allow_list,
    webhook_url_check,
    webhook_url_refusal,
)
from costboard.models import AlertDelivery, BudgetEvent, Project, Session, WebhookEndpoint
from costboard.outbox import outbox_add, outbox_dispatch
from tests.waiting import wait_until

SECRET = "whsec-test-0123456789abcdef"
PUBLIC = "93.184.216.34"
ALLOW_FIX = "allow it with COSTBOARD_WEBHOOK_ALLOW_HOSTS"
LEAK = "sk-live-RECEIVER-SECRET-4242"


# --- a fake DNS for names under .test -------------------------------------------------------


@dataclass
class FakeDNS:
    """Answers per name, one list of addresses per lookup (the last one repeats; an empty
    one is "no such name"); records every lookup of a name it answers."""

    answers: dict[str, list[list[str]]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    def answer(self, name: str, *lookups: list[str]) -> None:
        self.answers[name] = [list(addresses) for addresses in lookups]


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> FakeDNS:
    fake = FakeDNS()
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        if name not in fake.answers:
            return real(host, port, *args, **kwargs)
        fake.asked.append(name)
        lookups = fake.answers[name]
        addresses = lookups.pop(0) if len(lookups) > 1 else lookups[0]
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        port_no = int(port or 0)
        return [
            (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (a, port_no, 0, 0))
            if ":" in a
            else (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port_no))
            for a in addresses
        ]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return fake


# --- a receiver that counts what reaches it -------------------------------------------------


@dataclass
class Receiver:
    port: int = 0
    scheme: str = "http"
    requests: list[dict[str, str]] = field(default_factory=list)  # path and headers of each
    server_names: list[str | None] = field(default_factory=list)  # SNI of each TLS handshake
    status: int = 200
    reason: str | None = None
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)

    def url(self, host: str = "127.0.0.1", path: str = "/hook") -> str:
        return f"{self.scheme}://{host}:{self.port}{path}"


def _serve(state: Receiver, tls: ssl.SSLContext | None = None) -> Iterator[Receiver]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.requests.append({"path": self.path, **dict(self.headers.items())})
            self.send_response(state.status, state.reason)
            for name, value in state.headers.items():
                self.send_header(name, value.format(port=state.port))
            self.send_header("Content-Length", str(len(state.body)))
            self.end_headers()
            self.wfile.write(state.body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
        state.scheme = "https"
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from _serve(Receiver())


@pytest.fixture
def tls_receiver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """HTTPS with a self-signed certificate for rebind.test, trusted through SSL_CERT_FILE."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=rebind.test"),
            *("-addext", "subjectAltName=DNS:rebind.test"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    state = Receiver()
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)

    def remember_sni(sock: Any, name: str | None, context: ssl.SSLContext) -> None:
        state.server_names.append(name)

    tls.sni_callback = remember_sni
    yield from _serve(state, tls)


# --- sending ----------------------------------------------------------------------------------


def exhausted(project: Project) -> BudgetEvent:
    session = Session.objects.create(project=project, external_id=f"s{Session.objects.count()}")
    return BudgetEvent.objects.create(
        project=project, session=session, kind="exhausted", at=timezone.now(), tokens_used=1
    )


def send(project: Project, url: str) -> AlertDelivery:
    """An exhausted event, dispatched and delivered in-process to the project's one webhook,
    at `url` (created as stored, past the check at save, as if saved before or allowed)."""
    WebhookEndpoint.objects.filter(project=project).update(active=False)
    endpoint = WebhookEndpoint.objects.create(project=project, url=url, secret=SECRET)
    event = exhausted(project)
    alerts_dispatch([event.pk])
    outbox_dispatch()  # guard_sweep's pass
    return AlertDelivery.objects.get(budget_event=event, endpoint=endpoint)


@pytest.fixture
def project(db: None) -> Project:
    return Project.objects.create(name="Acme", slug="acme")


# --- what is refused ------------------------------------------------------------------------

FORBIDDEN = [
    ("http://127.0.0.1:8000/hook", "127.0.0.1 is a loopback address"),
    ("http://127.1/hook", "127.1 resolves to 127.0.0.1, a loopback address"),
    ("http://2130706433/hook", "2130706433 resolves to 127.0.0.1, a loopback address"),
    ("http://[::1]/hook", "::1 is a loopback address"),
    ("http://[::ffff:127.0.0.1]/hook", "::ffff:7f00:1 (127.0.0.1) is a loopback address"),
    ("http://[64:ff9b::7f00:1]/hook", "64:ff9b::7f00:1 (127.0.0.1) is a loopback address"),
    ("http://localhost:8000/hook", "localhost names this machine"),
    ("http://hooks.localhost/hook", "hooks.localhost names this machine"),
    ("http://0.0.0.0/hook", "0.0.0.0 is an unspecified address (it reaches this machine)"),
    ("http://[::]/hook", ":: is an unspecified address (it reaches this machine)"),
    ("http://10.1.2.3/hook", "10.1.2.3 is a private address"),
    ("http://172.16.0.9/hook", "172.16.0.9 is a private address"),
    ("http://192.168.1.1/hook", "192.168.1.1 is a private address"),
    ("http://[fd12::1]/hook", "fd12::1 is a private address"),
    ("http://100.64.0.1/hook", "100.64.0.1 is a shared (carrier-grade NAT) address"),
    ("http://169.254.1.1/hook", "169.254.1.1 is a link-local address"),
    ("http://[fe80::1]/hook", "fe80::1 is a link-local address"),
    ("http://224.0.0.1/hook", "224.0.0.1 is a multicast address"),
    ("http://240.0.0.1/hook", "240.0.0.1 is a reserved address"),
    ("http://private.test/hook", "private.test resolves to 10.0.0.7, a private address"),
]
METADATA = [
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is a cloud metadata address"),
    ("http://[fd00:ec2::254]/latest/", "fd00:ec2::254 is a cloud metadata address"),
    ("http://[::ffff:169.254.169.254]/", "(169.254.169.254) is a cloud metadata address"),
    ("http://metadata.google.internal/", "metadata.google.internal is a cloud metadata service"),
    ("http://meta.test/", "meta.test resolves to 169.254.169.254, a cloud metadata address"),
]
MALFORMED = [
    ("ftp://hooks.example.test/", "the URL must start with http:// or https://"),
    ("http://user:pw@hooks.example.test/", "the URL has a user name or password in it"),
    ("http://hooks.example.test:0/", "the URL's port must be a number from 1 to 65535"),
]


@pytest.fixture
def names(dns: FakeDNS) -> FakeDNS:
    dns.answer("private.test", ["10.0.0.7"])
    dns.answer("meta.test", ["169.254.169.254"])
    dns.answer("hooks.example.test", [PUBLIC])
    dns.answer("mixed.test", [PUBLIC, "192.168.0.5"])
    dns.answer("hooks.corp.test", ["10.20.30.40"])
    dns.answer("nowhere.test", [])
    dns.answer("corp.test.evil.test", ["10.0.0.8"])
    return dns


@pytest.mark.parametrize(("url", "reason"), FORBIDDEN)
def test_local_and_private_destinations_are_refused(names: FakeDNS, url: str, reason: str) -> None:
    assert webhook_url_refusal(url) == f"{reason}; {ALLOW_FIX}"


@pytest.mark.parametrize(("url", "reason"), METADATA)
def test_metadata_services_are_refused(names: FakeDNS, url: str, reason: str) -> None:
    refusal = webhook_url_refusal(url)
    assert refusal is not None
    assert reason in refusal
    assert refusal.endswith("webhooks never go there")


@pytest.mark.parametrize(("url", "reason"), MALFORMED)
def test_urls_webhooks_cannot_use_are_refused(names: FakeDNS, url: str, reason: str) -> None:
    refusal = webhook_url_refusal(url)
    assert refusal is not None
    assert refusal.startswith(reason)


def test_public_destinations_pass(names: FakeDNS) -> None:
    assert webhook_url_refusal(f"http://{PUBLIC}/hook") is None
    assert webhook_url_refusal("https://[2606:4700:4700::1111]/hook") is None
    assert webhook_url_refusal("https://hooks.example.test/costboard") is None


def test_a_name_with_any_forbidden_address_is_refused(names: FakeDNS) -> None:
    assert webhook_url_refusal("https://mixed.test/") == (
        f"mixed.test resolves to 192.168.0.5, a private address; {ALLOW_FIX}"
    )


def test_a_name_that_does_not_resolve_passes_with_a_note(names: FakeDNS) -> None:
    check = webhook_url_check("https://nowhere.test/hook")
    assert check.refusal is None
    assert check.note.startswith("nowhere.test does not resolve from this server")


def test_the_allow_list_lets_intranet_receivers_through(names: FakeDNS, settings: Any) -> None:
    private = ["http://10.1.2.3/", "https://hooks.corp.test/", "http://private.test/"]
    assert all(webhook_url_refusal(url) for url in private)

    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["hooks.corp.test"]  # by name
    assert webhook_url_refusal("https://hooks.corp.test/") is None
    assert webhook_url_refusal("http://private.test/") is not None
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = [".corp.test"]  # a domain and its subdomains
    assert webhook_url_refusal("https://hooks.corp.test/") is None
    assert webhook_url_refusal("https://corp.test.evil.test/") is not None
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["10.0.0.0/8"]  # by network
    assert [webhook_url_refusal(url) for url in private] == [None, None, None]
    assert webhook_url_refusal("http://192.168.1.1/") is not None
    assert webhook_url_refusal("http://mixed.test/") is not None
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1", "localhost"]
    assert webhook_url_refusal("http://[::ffff:127.0.0.1]:8000/") is None
    assert webhook_url_refusal("http://localhost:8000/") is None
    assert webhook_url_refusal("http://[::1]:8000/") is not None


def test_no_allow_list_opens_a_metadata_service(names: FakeDNS, settings: Any) -> None:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["169.254.0.0/16", "fd00::/8", "meta.test"]
    for url, reason in METADATA:
        refusal = webhook_url_refusal(url)
        assert refusal is not None and reason in refusal, url
    assert webhook_url_refusal("http://169.254.1.1/") is None  # the rest of the network is open


def test_the_allow_list_takes_hosts_domains_addresses_and_networks() -> None:
    allow = webhook_allow_list(" Hooks.Corp.Example , .intranet.test,10.0.0.0/8, [fd00::1], db1 ")
    assert allow.names == {"hooks.corp.example", "db1"}
    assert allow.domains == (".intranet.test",)
    assert [str(n) for n in allow.networks] == ["10.0.0.0/8", "fd00::1/128"]
    assert webhook_allow_list("") == webhook_allow_list([])


@pytest.mark.parametrize(
    "entry",
    ["https://hooks.corp", "hooks.corp:8443", "*", "*.corp", "10.0.0.1/8", "10.0.0.300", "a..b"],
)
def test_a_bad_allow_list_entry_is_named_with_the_fix(entry: str) -> None:
    with pytest.raises(ImproperlyConfigured) as raised:
        webhook_allow_list(["ok.example", entry])
    message = str(raised.value)
    assert message.startswith(f"COSTBOARD_WEBHOOK_ALLOW_HOSTS: {entry!r} is not a host name")
    assert "10.0.0.0/8" in message  # an example of what to write


def test_a_bad_allow_list_stops_startup() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=Path(__file__).resolve().parents[3],
        env={**os.environ, "COSTBOARD_WEBHOOK_ALLOW_HOSTS": "10.0.0.0/8,http://hooks.corp"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "COSTBOARD_WEBHOOK_ALLOW_HOSTS: 'http://hooks.corp'" in result.stderr


def test_a_reason_is_short(dns: FakeDNS) -> None:
    name = ".".join(["a" * 60] * 4) + ".test"
    dns.answer(name, ["127.0.0.1"])
    refusal = webhook_url_refusal(f"http://{name}/")
    assert refusal is not None and len(refusal) == REASON_CHARS
    assert refusal.endswith("…")


# --- at save --------------------------------------------------------------------------------


def admin_add(staff: Client, project: Project, url: str, **extra: Any) -> Any:
    data = {
        "project": project.pk,
        "name": "pager",
        "url": url,
        "secret": SECRET,
        "kinds": ["exhausted"],
        "active": "on",
    }
    return staff.post("/admin/costboard/webhookendpoint/add/", data, **extra)


@pytest.mark.parametrize(("url", "reason"), FORBIDDEN[::3] + METADATA[:1] + MALFORMED[1:2])
def test_the_admin_refuses_a_forbidden_url(
    staff: Client, project: Project, names: FakeDNS, url: str, reason: str
) -> None:
    response = admin_add(staff, project, url)
    assert response.status_code == 200  # the form again, with the error
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["url"]
    assert errors["url"][0].startswith(f"This URL is refused: {reason}")
    assert escape(f"This URL is refused: {reason}").encode() in response.content
    assert not WebhookEndpoint.objects.exists()


def test_the_projects_page_refuses_it_too(staff: Client, project: Project, names: FakeDNS) -> None:
    change = f"/admin/costboard/project/{project.pk}/change/"
    data: dict[str, Any] = {k: v for k, v in model_to_dict(project).items() if v is not None}
    webhooks = ""
    for inline in staff.get(change).context["inline_admin_formsets"]:
        prefix = inline.formset.prefix
        adding = inline.formset.model is WebhookEndpoint
        data |= {f"{prefix}-TOTAL_FORMS": int(adding), f"{prefix}-INITIAL_FORMS": 0}
        if adding:
            webhooks = prefix
            data |= {
                f"{prefix}-0-url": "http://[::1]:9000/hook",
                f"{prefix}-0-secret": SECRET,
                f"{prefix}-0-kinds": ["exhausted"],
                f"{prefix}-0-active": "on",
            }
    response = staff.post(change, data)
    assert response.status_code == 200
    assert b"This URL is refused: ::1 is a loopback address" in response.content
    assert not WebhookEndpoint.objects.exists()

    data[f"{webhooks}-0-url"] = "https://hooks.example.test/hook"  # positive control
    assert staff.post(change, data).status_code == 302
    assert WebhookEndpoint.objects.get().url == "https://hooks.example.test/hook"


class BareWebhookForm(forms.ModelForm):
    url = forms.URLField(assume_scheme="https")

    class Meta:
        model = WebhookEndpoint
        fields = ("project", "url", "secret", "kinds")


def test_any_model_form_refuses_it(project: Project) -> None:
    form_class = BareWebhookForm
    data = {"project": project.pk, "secret": SECRET, "kinds": '["exhausted"]'}
    form = form_class(data={**data, "url": "http://169.254.169.254/latest/"})
    assert not form.is_valid()
    assert form.errors["url"] == [
        "This URL is refused: 169.254.169.254 is a cloud metadata address; webhooks never go there."
    ]
    form = form_class(data={**data, "url": "not a url"})  # its own error only, not ours too
    assert not form.is_valid()
    assert form.errors["url"] == ["Enter a valid URL."]


def test_an_allowed_intranet_url_is_saved(
    staff: Client, project: Project, names: FakeDNS, settings: Any
) -> None:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["10.0.0.0/8"]
    response = admin_add(staff, project, "https://hooks.corp.test/costboard")
    assert response.status_code == 302
    assert WebhookEndpoint.objects.get().url == "https://hooks.corp.test/costboard"


def test_a_url_that_does_not_resolve_is_saved_with_a_warning(
    staff: Client, project: Project, names: FakeDNS
) -> None:
    response = admin_add(staff, project, "https://nowhere.test/hook", follow=True)
    assert response.status_code == 200
    assert WebhookEndpoint.objects.get().url == "https://nowhere.test/hook"
    assert b"Webhook pager: nowhere.test does not resolve from this server" in response.content
    assert b"checked again before every send" in response.content


# --- at send --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("127.0.0.1", "127.0.0.1 is a loopback address"),
        ("localhost", "localhost names this machine"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1 (127.0.0.1) is a loopback address"),
        ("2130706433", "2130706433 resolves to 127.0.0.1, a loopback address"),
        ("loopback.test", "loopback.test resolves to 127.0.0.1, a loopback address"),
    ],
)
def test_a_loopback_receiver_is_refused_at_send_and_hears_nothing(
    project: Project, receiver: Receiver, dns: FakeDNS, host: str, reason: str
) -> None:
    dns.answer("loopback.test", ["127.0.0.1"])
    delivery = send(project, receiver.url(host))
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("failed", 1, None)
    assert delivery.error == f"refused: {reason}; {ALLOW_FIX}"
    attempt = _webhook_send(delivery)
    assert (attempt.ok, attempt.permanent) == (False, True)  # retrying would change nothing
    assert receiver.requests == []


@pytest.mark.slow
def test_a_refused_send_is_not_retried_by_a_worker(
    outbox_beat: None, receiver: Receiver, dns: FakeDNS, settings: Any
) -> None:
    settings.COSTBOARD_ALERT_RETRY_SECONDS = 0.05
    settings.COSTBOARD_ALERT_MAX_ATTEMPTS = 3
    dns.answer("nowhere.test", [])
    project = Project.objects.create(name="Acme", slug="acme")
    refused = WebhookEndpoint.objects.create(project=project, url=receiver.url(), secret=SECRET)
    # positive control: the same worker retries a host that does not resolve (yet)
    unresolved = WebhookEndpoint.objects.create(
        project=project, url="http://nowhere.test/hook", secret=SECRET
    )
    event = exhausted(project)
    outbox_add(DISPATCH, {"event_ids": [event.pk]})

    def settled() -> list[AlertDelivery]:
        rows = list(AlertDelivery.objects.filter(budget_event=event).order_by("pk"))
        return rows if len(rows) == 2 and all(r.status == "failed" for r in rows) else []

    first, second = wait_until(settled, what="both deliveries failed")
    assert (first.endpoint_id, first.attempts) == (refused.pk, 1)
    assert first.error == f"refused: 127.0.0.1 is a loopback address; {ALLOW_FIX}"
    assert (second.endpoint_id, second.attempts) == (unresolved.pk, 3)
    assert second.error.startswith("cannot resolve the host: gaierror")
    assert receiver.requests == []


@pytest.mark.parametrize(
    ("allow", "host"),
    [
        (["127.0.0.1"], "127.0.0.1"),
        (["127.0.0.0/8"], "127.0.0.1"),
        (["127.0.0.0/8"], "intranet.test"),
        (["intranet.test"], "intranet.test"),
        ([".corp.test"], "hooks.corp.test"),
        (["localhost"], "localhost"),
    ],
)
def test_the_allow_list_lets_a_receiver_hear_it(
    project: Project, receiver: Receiver, dns: FakeDNS, settings: Any, allow: list[str], host: str
) -> None:
    dns.answer("intranet.test", ["127.0.0.1"])
    dns.answer("hooks.corp.test", ["127.0.0.1"])
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = allow
    delivery = send(project, receiver.url(host))
    assert (delivery.status, delivery.response_code, delivery.error) == ("delivered", 200, "")
    [request] = receiver.requests
    assert request["Host"] == f"{host}:{receiver.port}"


def test_a_name_rebound_to_loopback_after_saving_is_refused_at_send(
    staff: Client, project: Project, receiver: Receiver, dns: FakeDNS
) -> None:
    dns.answer("rebind.test", [PUBLIC], ["127.0.0.1"])  # public when saved, then this machine
    url = receiver.url("rebind.test")
    assert admin_add(staff, project, url).status_code == 302
    endpoint = WebhookEndpoint.objects.get()
    alerts_dispatch([exhausted(project).pk])
    outbox_dispatch()  # guard_sweep's pass
    delivery = AlertDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == "failed"
    assert delivery.error == (
        f"refused: rebind.test resolves to 127.0.0.1, a loopback address; {ALLOW_FIX}"
    )
    assert receiver.requests == []
    assert dns.asked == ["rebind.test", "rebind.test"]  # once at save, once at send


def test_the_request_goes_to_the_address_that_was_checked(
    project: Project, receiver: Receiver, dns: FakeDNS, settings: Any
) -> None:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.0/8"]
    # the first answer is checked and used; any later lookup would find no such name
    dns.answer("rebind.test", ["127.0.0.1"], [])
    delivery = send(project, receiver.url("rebind.test"))
    assert (delivery.status, delivery.response_code) == ("delivered", 200)
    [request] = receiver.requests
    assert request["Host"] == f"rebind.test:{receiver.port}"  # the name, though sent to the IP
    assert dns.asked == ["rebind.test"]


def test_the_pinned_connection_tries_each_checked_address_in_turn(
    project: Project, receiver: Receiver, dns: FakeDNS, settings: Any
) -> None:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.0/8", "::1"]
    dns.answer("dual.test", ["::1", "127.0.0.1"])  # nothing listens on ::1
    delivery = send(project, receiver.url("dual.test"))
    assert delivery.status == "delivered"
    assert len(receiver.requests) == 1


def test_https_is_pinned_and_checked_against_the_name(
    project: Project, tls_receiver: Receiver, dns: FakeDNS, settings: Any
) -> None:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.0/8"]
    dns.answer("rebind.test", ["127.0.0.1"], [])
    dns.answer("other.test", ["127.0.0.1"])
    delivery = send(project, tls_receiver.url("rebind.test"))
    assert (delivery.status, delivery.response_code) == ("delivered", 200)
    assert tls_receiver.server_names == ["rebind.test"]  # SNI: the name, not the address
    assert tls_receiver.requests[0]["Host"] == f"rebind.test:{tls_receiver.port}"

    # the certificate is for rebind.test: the same address under another name is refused
    other = send(project, tls_receiver.url("other.test"))
    assert other.status == "pending"  # retried later by the outbox
    assert other.error.startswith("cannot connect: [SSL: CERTIFICATE_VERIFY_FAILED]")
    assert "Hostname mismatch" in other.error
    assert len(tls_receiver.requests) == 1


# --- what a failure keeps -------------------------------------------------------------------


def test_a_failed_delivery_keeps_its_status_never_the_reply(
    project: Project, receiver: Receiver, settings: Any, staff: Client
) -> None:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    receiver.status, receiver.reason = 500, f"Oops {LEAK}"
    receiver.body = f"Traceback: DATABASE_PASSWORD={LEAK}\n".encode() * 50
    delivery = send(project, receiver.url())
    assert (delivery.status, delivery.response_code) == ("pending", 500)  # retried later
    assert delivery.error == "HTTP 500 Internal Server Error"  # the standard phrase, not theirs
    assert len(receiver.requests) == 1
    page = staff.get(f"/admin/costboard/alertdelivery/{delivery.pk}/change/")
    assert b"HTTP 500 Internal Server Error" in page.content
    assert LEAK.encode() not in page.content
    assert LEAK.encode() not in staff.get("/admin/costboard/alertdelivery/").content


def test_a_redirect_is_not_followed_and_fails_at_once_naming_where(
    project: Project, receiver: Receiver, settings: Any
) -> None:
    """A redirect answers the same on every retry: failed at the first attempt, with where
    the URL redirects (relative resolved; the query, which may hold a token, left out)."""
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    receiver.status = 302
    receiver.headers = {"Location": "/elsewhere/hook?token=s3cr3t"}
    delivery = send(project, receiver.url())
    assert (delivery.status, delivery.response_code, delivery.attempts) == ("failed", 302, 1)
    assert delivery.error == (
        f"HTTP 302 Found: the URL redirects to http://127.0.0.1:{receiver.port}/elsewhere/hook?…; "
        "redirects are not followed: use the final URL"
    )
    assert [r["path"] for r in receiver.requests] == ["/hook"]


def test_a_redirect_without_a_location_fails_at_once_too(
    project: Project, receiver: Receiver, settings: Any
) -> None:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    receiver.status = 307
    delivery = send(project, receiver.url())
    assert (delivery.status, delivery.response_code) == ("failed", 307)
    assert delivery.error == (
        "HTTP 307 Temporary Redirect: the URL redirects (no Location given); "
        "redirects are not followed: use the final URL"
    )


@pytest.mark.parametrize(
    ("location", "where"),
    [
        ("https://b.example:8443/x?t=1", "to https://b.example:8443/x?…"),
        ("/y", "to https://a.example/y"),
        ("http://[::1]:9/z", "to http://[::1]:9/z"),
        ("javascript:alert(1)", "to an address that is no http(s) URL"),
        ("http://h:99999/", "to an address that is no http(s) URL"),
        ("http://b.example/a b\x07c", "to http://b.example/a b?c"),
    ],
)
def test_a_redirect_reason_names_where_without_query_or_controls(location: str, where: str) -> None:
    fix = "redirects are not followed: use the final URL"
    reason = redirect_reason(301, location, "https://a.example/hook", path_secret=False)
    assert reason == f"HTTP 301 Moved Permanently: the URL redirects {where}; {fix}"
    pathless = redirect_pathless(reason)
    if where.startswith("to http"):
        host = where.removeprefix("to ").split("/")[2]
        assert pathless == (
            f"HTTP 301 Moved Permanently: the URL redirects to "
            f"{where.removeprefix('to ').split('://')[0]}://{host}/…; {fix}"
        )
    else:
        assert pathless == reason


@contextmanager
def tcp_server(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[int]:
    """A local TCP server on a port of its own (yielded): `answer(connection, stop)` for each
    connection, one at a time, until the block ends."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                answer(conn, stop)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


@pytest.fixture
def garbler() -> Iterator[int]:
    """A TCP server answering every connection with a line that is not HTTP."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(65536)
        head, _, body = request.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        while len(body) < length:
            body += conn.recv(65536)
        conn.sendall(f"{LEAK} not http\r\n\r\n".encode())

    with tcp_server(answer) as port:
        yield port


def test_a_garbled_reply_is_named_by_its_kind_only(
    project: Project, garbler: int, settings: Any
) -> None:
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    delivery = send(project, f"http://127.0.0.1:{garbler}/hook")
    assert (delivery.status, delivery.error) == ("pending", "bad HTTP reply (BadStatusLine)")


def test_a_receiver_closing_the_connection_unanswered_is_retried_saying_so(
    project: Project, settings: Any
) -> None:
    """A receiver (or a proxy before it) that reads the request and hangs up without a
    word: retried, the error saying what happened rather than naming an exception."""
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    closed: list[bytes] = []

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        closed.append(conn.recv(65536))  # the request's head at least; then no reply

    with tcp_server(answer) as port:
        delivery = send(project, f"http://127.0.0.1:{port}/hook")
    assert closed and closed[0].startswith(b"POST /hook HTTP/1.1")
    assert (delivery.status, delivery.response_code, delivery.attempts) == ("pending", None, 1)
    assert delivery.error == "no reply: the receiver closed the connection without answering"


@dataclass
class Trickler:
    """A receiver that answers 200 a byte at a time, each byte well within the timeout of one
    wait, the whole reply far past it: a socket timeout alone never fires."""

    port: int = 0
    gap: float = 0.3  # between two bytes (the test's timeout is 1 second)
    bytes_sent: int = 0
    finished: threading.Event = field(default_factory=threading.Event)
    reply: bytes = b"HTTP/1.1 200 OK\r\nX-Slow: " + b"z" * 40 + b"\r\nContent-Length: 0\r\n\r\n"


@pytest.fixture
def trickler() -> Iterator[Trickler]:
    state = Trickler()

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.recv(65536)  # the request (a small one: headers and body at once)
        try:
            for byte in state.reply:
                if stop.wait(state.gap):
                    return
                conn.sendall(bytes([byte]))
                state.bytes_sent += 1
        except OSError:  # the sender hung up
            return
        state.finished.set()

    with tcp_server(answer) as state.port:
        yield state


def test_a_reply_trickled_a_byte_at_a_time_is_cut_at_the_timeout(
    project: Project, trickler: Trickler, settings: Any
) -> None:
    """COSTBOARD_ALERT_TIMEOUT_SECONDS bounds the whole request, not each wait: a receiver
    sending its reply a byte every 0.3 s (about 20 s in all) is let go at the timeout, the
    attempt retried later, and its host left alone like one that hangs."""
    settings.COSTBOARD_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    settings.COSTBOARD_ALERT_TIMEOUT_SECONDS = 1
    url = f"http://127.0.0.1:{trickler.port}/hook"
    delivery = send(project, url)
    assert not trickler.finished.is_set()  # let go before the reply was all sent
    assert 0 < trickler.bytes_sent < len(trickler.reply)
    assert (delivery.status, delivery.response_code) == ("pending", None)  # retried later
    assert "TimeoutError" in delivery.error, delivery.error
    # the host let a request time out: not asked again for a while
    again = send(project, url)
    assert (again.status, again.attempts) == ("pending", 1)
    assert again.error.startswith("not sent: 127.0.0.1 let a request time out"), again.error
