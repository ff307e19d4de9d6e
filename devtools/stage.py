"""Run one stage of `make run` (or `make test`) so that it is never silent.

    python3 devtools/stage.py "static files" -- .venv/bin/python manage.py collectstatic …

It prints a line when the stage starts, passes the command's own output through, prints
`… <stage>: still working, 20 s` whenever `--every` seconds (10) pass without a line, and one
line at the end with the time it took; it exits with the command's status. Standard library
only: it runs before the virtualenv exists.
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO


def _pump(stream: IO[bytes], lines: queue.Queue[bytes | None]) -> None:
    for line in iter(stream.readline, b""):
        lines.put(line)
    lines.put(None)


def stage_run(
    name: str,
    command: Sequence[str],
    *,
    every: float = 10.0,
    out: IO[str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Run `command` as the stage `name`; its exit status."""
    out = out or sys.stdout
    started = clock()
    print(f"==> {name}", file=out, flush=True)
    try:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # a Python child's lines as they come
        )
    except OSError as exc:
        print(f"==> {name}: cannot start {command[0]!r} ({exc})", file=out, flush=True)
        return 127
    assert process.stdout is not None  # noqa: S101 — narrows the type: stdout=PIPE above
    lines: queue.Queue[bytes | None] = queue.Queue()
    threading.Thread(target=_pump, args=(process.stdout, lines), daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=every)
        except queue.Empty:
            print(f"  … {name}: still working, {clock() - started:.0f} s", file=out, flush=True)
            continue
        if line is None:
            break
        out.write(line.decode(errors="replace"))
        out.flush()
    status = process.wait()
    took = clock() - started
    if status:
        print(f"==> {name} failed after {took:.0f} s (exit status {status})", file=out, flush=True)
    else:
        print(f"==> {name}: done in {took:.1f} s", file=out, flush=True)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="what the stage is, as the output names it")
    parser.add_argument("--every", type=float, default=10.0, help="seconds of silence (10)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command after --")
    return stage_run(args.name, command, every=args.every)


if __name__ == "__main__":
    sys.exit(main())
