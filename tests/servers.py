"""Real servers a test starts and stops: a Redis broker of its own, HTTP receivers, a relay
to a server that a test can cut, and a PgBouncer in front of the test database."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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
class Holding:
    """A local server's replies held while a test looks at what waits on them: after
    `hold()` a request counts in `held()` and is answered once the test calls `release()`
    (or after HOLD_AT_MOST)."""

    holding: int = 0  # requests in, their replies held
    lock: threading.Lock = field(default_factory=threading.Lock)
    gate: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.gate.set()

    def hold(self) -> None:
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def held(self) -> int:
        with self.lock:
            return self.holding

    def wait_if_held(self) -> None:
        """In the handler, before it answers: counted in `held()` while the gate is shut."""
        with self.lock:
            self.holding += 1
        self.gate.wait(timeout=HOLD_AT_MOST)
        with self.lock:
            self.holding -= 1


@dataclass
class Receiver(Holding):
    """An HTTP receiver: records each POST's X-Costboard-Delivery header and answers 200, at
    once or, after `hold()`, only when the test calls `release()`."""

    base_url: str = ""
    deliveries: list[str] = field(default_factory=list)
    _stop: Callable[[], None] = lambda: None

    def start(self) -> Receiver:
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                state.wait_if_held()
                with state.lock:
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


class PgBouncer:
    """Debian's PgBouncer in transaction mode on a free port of 127.0.0.1, in front of the
    PostgreSQL at `host:port`: every database name goes to the same name there (a `*` entry,
    so pytest-xdist's test_<db>_gw<N> databases pass too), every user trusted as PostgreSQL
    trusts it. PgBouncer refuses to run as root: as root it runs as `postgres`, its files in a
    directory of that user's."""

    def __init__(self, *, host: str, port: int, user: str) -> None:
        binary = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
        if binary is None:
            raise AssertionError("pgbouncer is not installed: apt-get install pgbouncer")
        self.binary = binary
        self.upstream = (host, port)
        self.user = user
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.directory = ""

    def _config(self) -> str:
        host, port = self.upstream
        return "\n".join(
            [
                "[databases]",
                f"* = host={host} port={port}",
                "[pgbouncer]",
                "pool_mode = transaction",
                "listen_addr = 127.0.0.1",
                f"listen_port = {self.port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {self.directory}/users.txt",
                "max_client_conn = 200",
                "default_pool_size = 20",
                f"logfile = {self.directory}/pgbouncer.log",
                "",
            ]
        )

    def start(self) -> PgBouncer:
        self.directory = tempfile.mkdtemp(prefix="pgbouncer-")
        as_root = os.geteuid() == 0
        (Path(self.directory) / "users.txt").write_text(f'"{self.user}" ""\n')
        ini = Path(self.directory) / "pgbouncer.ini"
        ini.write_text(self._config())
        if as_root:
            for path in [Path(self.directory), *Path(self.directory).iterdir()]:
                shutil.chown(path, user="postgres", group="postgres")
        self.process = subprocess.Popen(
            [self.binary, *(["-u", "postgres"] if as_root else []), str(ini)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(
            lambda: reachable(self.port) or self.process is None or self.exited(),
            what=f"pgbouncer on port {self.port} (log: {self.directory}/pgbouncer.log)",
            every=0.02,
        )
        if self.exited():
            raise AssertionError(f"pgbouncer stopped: {self.log()}")
        return self

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def log(self) -> str:
        path = Path(self.directory) / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        """Stop it at once (SIGTERM), closing its connections to PostgreSQL."""
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
            self.process = None
        if self.directory:
            shutil.rmtree(self.directory, ignore_errors=True)
