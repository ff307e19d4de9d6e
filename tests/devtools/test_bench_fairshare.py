"""bench_fairshare's arguments only: the benchmark itself runs gunicorn for a minute and is
run by hand (docs/benchmarks.md, "Fair share (issue 31)"); a bad flag is refused, named, before
anything starts."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command


def test_bad_arguments_are_named_before_anything_starts() -> None:
    with pytest.raises(CommandError) as refused:
        call_command("bench_fairshare", exports=0, spans=10_001, max_in_flight=-1, redis="http://x")
    message = str(refused.value)
    for flag in ("--exports", "--spans must be 1 to 10000", "--max-in-flight", "--redis"):
        assert flag in message


@pytest.mark.django_db
def test_it_runs_on_postgresql_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from django.db import connection

    # the same refusal on either database: the command is told it runs on SQLite
    monkeypatch.setattr(connection, "vendor", "sqlite")
    with pytest.raises(CommandError, match="bench_fairshare is defined on PostgreSQL"):
        call_command("bench_fairshare", exports=1, spans=1)
