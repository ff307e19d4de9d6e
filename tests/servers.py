"""Real servers a test starts and stops: a Redis broker of its own, and HTTP receivers."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.waiting import wait_until

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

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

        self._stop = stop
        return self

    def stop(self) -> None:
        self.release()  # a held handler would keep server_close waiting
        self._stop()

    def received(self) -> list[str]:
        with self.lock:
            return list(self.deliveries)
