"""Real servers a test starts and stops: a Redis broker of its own, HTTP receivers, and a relay
to a server that a test can cut."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.waiting import wait_until


def serve(handler: type[BaseHTTPRequestHandler]) -> tuple[str, Callable[[], None]]:
    """A local HTTP server of `handler` on a free port, in a thread: its base URL and the
    function that stops it (shut down, closed, its thread joined)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return f"http://127.0.0.1:{server.server_address[1]}", stop


NOTHING_SAVED = ["--save", "", "--appendonly", "no"]
HOLD_AT_MOST = 60.0  # a Receiver's held reply goes out then, released or not: no test hangs


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def wait_for_port(port: int, *, up: bool) -> None:
    wait_until(
        lambda: reachable(port) == up, what=f"port {port} {'up' if up else 'down'}", every=0.02
    )


class RedisServer:
    """A throwaway redis-server on a free port (nothing saved), started and stopped at will."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise AssertionError("redis-server is not installed: apt-get install redis-server")
        self.binary = binary
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", *NOTHING_SAVED],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port, up=True)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None
        wait_for_port(self.port, up=False)


@dataclass
class Receiver:
    """An HTTP receiver: records each POST's X-Costboard-Delivery header and answers 200, at
    once or, after `hold()`, only when the test calls `release()`."""

    base_url: str = ""
    deliveries: list[str] = field(default_factory=list)
    holding: int = 0  # requests in, their replies held
    lock: threading.Lock = field(default_factory=threading.Lock)
    gate: threading.Event = field(default_factory=threading.Event)
    _stop: Callable[[], None] = lambda: None

    def __post_init__(self) -> None:
        self.gate.set()

    def hold(self) -> None:
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def held(self) -> int:
        with self.lock:
            return self.holding

    def start(self) -> Receiver:
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with state.lock:
                    state.holding += 1
                state.gate.wait(timeout=HOLD_AT_MOST)
                with state.lock:
                    state.holding -= 1
                    state.deliveries.append(self.headers.get("X-Costboard-Delivery", ""))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.base_url, self._stop = serve(Handler)
        return self

    def stop(self) -> None:
        self.release()  # a held handler would keep server_close waiting
        self._stop()

    def received(self) -> list[str]:
        with self.lock:
            return list(self.deliveries)


class Relay:
    """The way to a server, which a test can cut: each request is passed to `upstream` and its
    answer back; after `garbage()` every request is answered 200 with an HTML page instead;
    `stop()` closes the port (connections refused) and `start()` opens the same port again."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.answering_garbage = False
        self.requests = 0  # requests that reached the relay, relayed or not
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def garbage(self, on: bool = True) -> None:
        self.answering_garbage = on

    def start(self) -> Relay:
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.relay()

            def do_POST(self) -> None:
                self.relay()

            def relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with state.lock:
                    state.requests += 1
                if state.answering_garbage:
                    self.answer(200, b"<html>502 Bad Gateway (not really)</html>", "text/html")
                    return
                headers = {
                    name: value
                    for name, value in self.headers.items()
                    if name.lower() not in ("host", "content-length", "connection")
                }
                request = urllib.request.Request(
                    state.upstream + self.path,
                    data=body if self.command == "POST" else None,
                    headers=headers,
                    method=self.command,
                )
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        status, content = response.status, response.read()
                        kind = response.headers.get("Content-Type", "application/json")
                except urllib.error.HTTPError as refused:
                    status, content = refused.code, refused.read()
                    kind = refused.headers.get("Content-Type", "application/json")
                self.answer(status, content, kind)

            def answer(self, status: int, content: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        wait_for_port(self.port, up=True)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = self._thread = None
        wait_for_port(self.port, up=False)
