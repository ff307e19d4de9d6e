"""`make run`'s stages are never silent: devtools/stage.py announces each, passes its output
through, speaks up while the command is quiet, and ends with the command's own status."""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools.stage import main, stage_run
from tests.waiting import wait_until


class Lines(io.StringIO):
    """Output another thread writes to while the test reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            return super().write(text)

    def lines(self) -> list[str]:
        with self.lock:
            return self.getvalue().splitlines()


def ticking(*times: float) -> Callable[[], float]:
    readings = iter(times)
    return lambda: next(readings)


def test_a_quiet_command_gets_a_line_while_it_works_and_one_when_it_is_done(
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    # prints once, then says nothing until the test has seen the stage speak for it
    script = (
        "import pathlib, time\n"
        "print('first line of its own')\n"
        f"while not pathlib.Path({str(release)!r}).exists(): time.sleep(0.01)\n"
    )
    out = Lines()
    status: list[int] = []
    runner = threading.Thread(
        target=lambda: status.append(
            stage_run("static files", [sys.executable, "-c", script], every=0.05, out=out)
        )
    )
    runner.start()

    def spoke_after_its_first_line() -> bool:
        lines = out.lines()
        return "first line of its own" in lines and "still working" in lines[-1]

    wait_until(spoke_after_its_first_line, what="a line from the stage while it was quiet")
    release.touch()
    runner.join(timeout=60)
    lines = out.lines()
    assert status == [0]
    assert lines[0] == "==> static files"
    first = lines.index("first line of its own")
    beats = [i for i, line in enumerate(lines) if "still working" in line]
    assert beats and beats[-1] > first
    assert all(lines[i].startswith("  … static files: still working, ") for i in beats)
    assert len(lines) == 2 + len(beats) + 1
    assert lines[-1].startswith("==> static files: done in ")


def test_the_stage_reports_how_long_it_took_by_its_clock() -> None:
    out = Lines()
    clock = ticking(100.0, 112.5)
    assert stage_run("migrate", [sys.executable, "-c", "print('ok')"], out=out, clock=clock) == 0
    assert out.lines() == ["==> migrate", "ok", "==> migrate: done in 12.5 s"]


def test_a_failing_command_fails_the_stage_with_its_status() -> None:
    out = Lines()
    clock = ticking(0.0, 3.0)
    code = "import sys; print('no such table'); sys.exit(3)"
    assert stage_run("demo data", [sys.executable, "-c", code], out=out, clock=clock) == 3
    assert out.lines() == [
        "==> demo data",
        "no such table",
        "==> demo data failed after 3 s (exit status 3)",
    ]


def test_a_command_that_cannot_start_is_named() -> None:
    out = Lines()
    assert stage_run("install", ["/nonexistent/pip"], out=out) == 127
    assert out.lines()[-1].startswith("==> install: cannot start '/nonexistent/pip'")


def test_the_command_line_takes_the_command_after_a_double_dash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["prices", "--", sys.executable, "-c", "raise SystemExit(4)"]) == 4
    assert capsys.readouterr().out.splitlines()[0] == "==> prices"
