"""A real PostgreSQL primary and a streaming replica of it, started by a test in a temporary
directory on free ports: `initdb`, `pg_ctl`, `pg_basebackup -R`. PostgreSQL's tools refuse to
run as root, so as root they run as the `postgres` user (runuser), in a directory it owns.

Both load pg_stat_statements: a statement is counted the moment it runs, on the server that
ran it, which is how the tests see which one a page read (tests/costboard/test_replicas.py).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

DATABASE = "costboard"
CREATE_STATEMENTS = "CREATE EXTENSION pg_stat_statements"


def postgres_bin() -> Path | None:
    """The directory of initdb, pg_ctl and pg_basebackup (COSTBOARD_PG_BIN, else the newest
    Debian install under /usr/lib/postgresql, else pg_config's), or None."""
    given = os.environ.get("COSTBOARD_PG_BIN")
    candidates = [Path(given)] if given else []
    candidates += sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        candidates.append(Path(found.stdout.strip()))
    for directory in candidates:
        if all((directory / tool).exists() for tool in ("initdb", "pg_ctl", "pg_basebackup")):
            return directory
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class Pair:
    bin: Path
    root: Path
    primary_port: int
    replica_port: int

    def to_json(self) -> str:
        return json.dumps(
            {
                "bin": str(self.bin),
                "root": str(self.root),
                "primary_port": self.primary_port,
                "replica_port": self.replica_port,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Pair:
        given = json.loads(text)
        return cls(
            bin=Path(given["bin"]),
            root=Path(given["root"]),
            primary_port=int(given["primary_port"]),
            replica_port=int(given["replica_port"]),
        )

    def url(self, port: int) -> str:
        return f"postgres://postgres@127.0.0.1:{port}/{DATABASE}"

    @property
    def primary_url(self) -> str:
        return self.url(self.primary_port)

    @property
    def replica_url(self) -> str:
        return self.url(self.replica_port)

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)}: {result.stderr or result.stdout}")

    def _start(self, name: str, port: int) -> None:
        options = (
            f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
            "-c shared_preload_libraries=pg_stat_statements -c fsync=off"
        )
        log = str(self.root / f"{name}.log")
        self._run("pg_ctl", "-D", str(self.root / name), "-o", options, "-l", log, "-w", "start")

    def _stop(self, name: str) -> None:
        self._run("pg_ctl", "-D", str(self.root / name), "-m", "immediate", "-w", "stop")

    def start_replica(self) -> None:
        self._start("replica", self.replica_port)

    def stop_replica(self) -> None:
        self._stop("replica")

    def stop(self) -> None:
        for name in ("replica", "primary"):
            if (self.root / name / "postmaster.pid").exists():
                self._stop(name)
        shutil.rmtree(self.root, ignore_errors=True)


def pair_started(bin: Path) -> Pair:
    """A primary with the database `costboard` (pg_stat_statements in it and in template1, so
    the test database made from it has it too), and a replica streaming from it."""
    root = Path(tempfile.mkdtemp(prefix="costboard-pair-"))
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(root, owner.pw_uid, owner.pw_gid)
    pair = Pair(bin=bin, root=root, primary_port=_free_port(), replica_port=_free_port())
    try:
        pair._run(
            "initdb", "-D", str(root / "primary"), "--auth=trust", "-U", "postgres", "--no-sync"
        )
        pair._start("primary", pair.primary_port)
        for database in ("template1", "postgres"):
            psql = [str(bin / "psql"), "-h", "127.0.0.1", "-p", str(pair.primary_port)]
            subprocess.run(
                [*psql, "-U", "postgres", "-d", database, "-qc", CREATE_STATEMENTS],
                check=True,
                capture_output=True,
            )
        subprocess.run(
            [*psql, "-U", "postgres", "-d", "postgres", "-qc", f"CREATE DATABASE {DATABASE}"],
            check=True,
            capture_output=True,
        )
        pair._run(
            "pg_basebackup",
            *("-h", "127.0.0.1", "-p", str(pair.primary_port), "-U", "postgres"),
            *("-D", str(root / "replica"), "-R", "-X", "stream", "-c", "fast", "--no-sync"),
        )
        pair.start_replica()
    except BaseException:
        pair.stop()
        raise
    return pair
