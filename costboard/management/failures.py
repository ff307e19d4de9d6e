"""What `manage.py` says when a command cannot run for want of something outside it
(docs/operations.md, "Commands when the database is down"): one line naming what to fix, in
place of a traceback whose last line an operator has to find (`--traceback` shows it)."""

from __future__ import annotations

import os
import re

from django.core.exceptions import ImproperlyConfigured


def failure_line(exc: BaseException, argv: list[str]) -> str | None:
    """The line for `exc` raised by the command `argv` runs, None for a failure that is a bug
    (its traceback is wanted)."""
    if "--traceback" in argv:
        return None
    command = f"manage.py {argv[1]}" if len(argv) > 1 else "manage.py"
    if isinstance(exc, ImproperlyConfigured):  # start-up's refusal names the variable
        return f"{command}: ImproperlyConfigured: {exc}"
    from django.db import connections

    from costboard.ingest.sql import database_outage
    from costboard.settings import url_shown

    url = os.environ.get("DATABASE_URL", "").strip()
    now = url_shown(repr(url)) if url else f"unset: {connections['default'].settings_dict['NAME']}"
    table = _missing_table(exc)
    if table is not None:
        return (
            f"{command}: the database has no table {table}: run `python manage.py migrate` "
            f"first (DATABASE_URL now {now})."
        )
    if not database_outage(exc):
        return None
    said = " ".join(str(exc).split())
    if connections["default"].vendor == "sqlite":
        fix = (
            "make the SQLite file's directory exist and be writable, or set DATABASE_URL to a "
            f"database that answers (now {now})"
        )
    else:
        fix = f"start PostgreSQL, or set DATABASE_URL to one that answers (now {now})"
    return f"{command}: the database does not answer ({said}): {fix}."


def _missing_table(exc: BaseException) -> str | None:
    """The table a database not yet migrated lacks, as its error names it, or None."""
    import psycopg
    from django.db import DatabaseError

    if not isinstance(exc, DatabaseError):
        return None
    cause = exc.__cause__
    if isinstance(cause, psycopg.errors.UndefinedTable):
        found = re.search(r'relation "([^"]+)" does not exist', str(cause))
        return found[1] if found else "it needs"
    said = str(exc)
    if said.startswith("no such table: "):  # SQLite's
        return said.removeprefix("no such table: ")
    return None
