"""The step table's month partitions on PostgreSQL (migration 0022 made the table partitioned
by range of `timestamp`): native declarative partitioning, managed here, not by pg_partman.

- `step_partitions_ensure` makes the month partitions that are missing, each as a table of
  its own that takes over that month's rows from the DEFAULT partition and is then attached,
  all in one transaction under an advisory lock (two processes never race).
- The sweep (guard_sweep, Celery beat) makes this month's and the next MONTHS_AHEAD ahead
  (`step_partitions_ahead`); ingest makes a batch's month only when this process does not
  know it (`step_partitions_cover`): the hot path does no catalog work.
- Retention drops whole months (`step_partition_drop`, see costboard/retention.py).
- The sweep analyzes the partitioned table once a day (`step_statistics_refresh`): autovacuum
  never does.

Correctness never rests on the cache of known months: a step whose month has no partition
goes to the DEFAULT partition (it has the same unique index), and making that month later
moves it out. SQLite has one plain table: everything here is a no-op there.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
from django.db import OperationalError, connection, transaction

from costboard.models import Step

log = logging.getLogger(__name__)

STEP_TABLE = Step._meta.db_table
DEFAULT_PARTITION = f"{STEP_TABLE}_default"
MONTHS_AHEAD = 2  # the sweep keeps this month's and the next two's partitions made
# Ingest makes partitions for months from this many back to MONTHS_AHEAD ahead; a step
# outside (a typo'd year, an old import) goes to the DEFAULT partition, so one batch can never
# make a thousand tables.
INGEST_MONTHS_BACK = 24
LOCK_TIMEOUT = "5s"  # DDL waits at most this long behind readers, then gives up till later
RETRY_AFTER_S = 60.0  # ingest's pause after a partition it could not make
STATISTICS_EVERY = timedelta(days=1)  # how often the sweep analyzes the partitioned parent
_LOCK_KEY = 0x5354_4550_5041_5254  # "STEPPART": the advisory lock of partition DDL
_NAME = re.compile(rf"^{STEP_TABLE}_p(\d{{4}})(\d{{2}})$")

_known: set[date] = set()  # months whose partitions this process has seen
_retry_at = 0.0  # monotonic time before which ingest does not try to make partitions


def month_of(moment: datetime | date) -> date:
    """The first day of the moment's month, in UTC."""
    if isinstance(moment, datetime):
        moment = moment.astimezone(UTC).date()
    return moment.replace(day=1)


def month_add(month: date, months: int) -> date:
    n = month.year * 12 + month.month - 1 + months
    return date(n // 12, n % 12 + 1, 1)


def partition_name(month: date) -> str:
    return f"{STEP_TABLE}_p{month:%Y%m}"


def _bound(month: date) -> str:
    """A partition bound as SQL text (DDL takes no parameters): midnight UTC."""
    return f"'{month:%Y-%m-%d} 00:00:00+00'"


def lock_busy(exc: OperationalError) -> bool:
    """Whether the error is a lock not had within LOCK_TIMEOUT (anything else is raised)."""
    return isinstance(exc.__cause__, psycopg.errors.LockNotAvailable)


def partitioned() -> bool:
    return connection.vendor == "postgresql"


def step_partitions() -> dict[date, str]:
    """The month partitions that exist now, by month (the DEFAULT partition is not one)."""
    if not partitioned():
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass",
            [STEP_TABLE],
        )
        names = [row[0] for row in cursor.fetchall()]
    months = {}
    for name in names:
        if found := _NAME.match(name):
            months[date(int(found[1]), int(found[2]), 1)] = name
    return months


@contextmanager
def _partition_ddl() -> Iterator[Any]:
    """A transaction (a savepoint inside one) holding the advisory lock of partition DDL,
    whose lock waits give up after LOCK_TIMEOUT; the caller's own timeout is put back."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
        with _lock_timeout(cursor):
            yield cursor


@contextmanager
def _lock_timeout(cursor: Any) -> Iterator[None]:
    """Lock waits give up after LOCK_TIMEOUT within the block; the caller's own timeout is
    put back after it (set_config(…, true) would last to the end of the caller's
    transaction). Left on an error, the transaction or savepoint around the block is rolled
    back, which undoes the setting with everything else."""
    cursor.execute("SELECT current_setting('lock_timeout')")
    [before] = cursor.fetchone()
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [LOCK_TIMEOUT])
    yield
    cursor.execute("SELECT set_config('lock_timeout', %s, true)", [before])


def step_partitions_ensure(*, months: Iterable[date]) -> list[str]:
    """Make the partitions of these months (first days) that are missing; return their
    names. Each takes its month's rows out of the DEFAULT partition before it is attached."""
    if not partitioned():
        return []
    wanted = sorted({month_of(month) for month in months})
    made = []
    with _partition_ddl() as cursor:
        existing = step_partitions()
        missing = [month for month in wanted if month not in existing]
        if missing:
            # first, so no step can enter the DEFAULT partition while its rows move
            cursor.execute(f"LOCK TABLE {DEFAULT_PARTITION} IN ACCESS EXCLUSIVE MODE")
        for month in missing:
            made.append(_partition_make(cursor, month))
    _known.update(existing)
    _known.update(missing)
    if made:
        log.info("made step partitions %s", ", ".join(made))
    return made


def _partition_make(cursor: Any, month: date) -> str:
    name = partition_name(month)
    lower, upper = _bound(month), _bound(month_add(month, 1))
    # no defaults of its own: steps come in through the parent, whose defaults apply
    cursor.execute(f"CREATE TABLE {name} (LIKE {STEP_TABLE})")
    cursor.execute(
        f"""
        WITH moved AS (
            DELETE FROM {DEFAULT_PARTITION}
            WHERE "timestamp" >= {lower} AND "timestamp" < {upper}
            RETURNING *
        )
        INSERT INTO {name} SELECT * FROM moved
        """
    )
    # a replayed event_id is a duplicate within its month (a partitioned table's unique
    # indexes must hold the partition key, so the parent cannot have this one)
    cursor.execute(
        f"CREATE UNIQUE INDEX {name}_event_id ON {name} (project_id, event_id) "
        "WHERE event_id IS NOT NULL"
    )
    # the parent's indexes and primary key are made on it as it is attached
    cursor.execute(
        f"ALTER TABLE {STEP_TABLE} ATTACH PARTITION {name} FOR VALUES FROM ({lower}) TO ({upper})"
    )
    return name


def step_partitions_ahead(*, now: datetime) -> list[str]:
    """The sweep's part: this month's partition and the next MONTHS_AHEAD's. Locks busy past
    LOCK_TIMEOUT: nothing made now, the next hour's sweep tries again (two months early)."""
    this = month_of(now)
    try:
        return step_partitions_ensure(months=[month_add(this, n) for n in range(MONTHS_AHEAD + 1)])
    except OperationalError as exc:
        if not lock_busy(exc):
            raise
        log.warning("step partitions not made ahead now: %s", exc)
        return []


def step_statistics_refresh(*, every: timedelta = STATISTICS_EVERY) -> bool:
    """ANALYZE the partitioned step table when its statistics are older than `every`, or
    missing. Autovacuum analyzes each month's partition as it changes but never the parent,
    whose statistics the planner reads for the table as a whole (a join with steps on a
    column other than time, the selectivity of a session's or a model's steps across
    months); on PostgreSQL 15 an ANALYZE of the parent also analyzes every partition. The
    sweep's part, hourly; True if it ran. Locks busy past LOCK_TIMEOUT (partition DDL at
    work): not now, the next sweep tries again; the caller's own timeout is put back."""
    if not partitioned():
        return False
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # this backend's, not a cached one
        cursor.execute(
            "SELECT clock_timestamp() - last_analyze FROM pg_stat_user_tables"
            " WHERE relid = %s::regclass",
            [STEP_TABLE],
        )
        row = cursor.fetchone()
        if row is not None and row[0] is not None and row[0] < every:
            return False
        with _lock_timeout(cursor):
            try:
                with transaction.atomic():
                    cursor.execute(f"ANALYZE {STEP_TABLE}")
            except OperationalError as exc:
                if not lock_busy(exc):
                    raise
                log.warning("step statistics not gathered now: %s", exc)
                return False
    return True


def step_partitions_cover(*, days: Iterable[date], now: datetime) -> None:
    """Ingest's part, before its transaction: make the partitions of these steps' days (UTC)
    that this process has not seen, within INGEST_MONTHS_BACK..MONTHS_AHEAD of now. Nothing
    but set arithmetic when every month is known. A month that could not be made (a lock
    not had in LOCK_TIMEOUT) is left to the DEFAULT partition, and tried again later."""
    global _retry_at
    months = {day.replace(day=1) for day in days}
    if months <= _known or not partitioned():
        return
    this = month_of(now)
    first, last = month_add(this, -INGEST_MONTHS_BACK), month_add(this, MONTHS_AHEAD)
    missing = {month for month in months - _known if first <= month <= last}
    if not missing or time.monotonic() < _retry_at:
        return
    _known.update(step_partitions())
    missing -= _known
    if not missing:
        return
    try:
        step_partitions_ensure(months=missing)
    except OperationalError as exc:
        if not lock_busy(exc):
            raise
        _retry_at = time.monotonic() + RETRY_AFTER_S
        log.warning("could not make step partitions now (%s); the DEFAULT one takes them", exc)


def step_default_hold(cursor: Any, *, days: Iterable[date], now: datetime) -> None:
    """Ingest's part, in its transaction before its steps go in: when a step may go to the
    DEFAULT partition (its month unknown to this process, or past: retention in another
    process may have dropped it), take the row locks of the step table and of the DEFAULT
    partition first, in the order partition DDL takes them. A month being made meanwhile is
    then waited for, and the steps are routed by the partitions as they are after it.
    Without this the INSERT routed a step to the DEFAULT partition before waiting there for
    the month to be attached, and PostgreSQL refused the row: a 500."""
    this = month_of(now)
    if all(month in _known and month >= this for month in {day.replace(day=1) for day in days}):
        return
    cursor.execute(f"LOCK TABLE ONLY {STEP_TABLE}, {DEFAULT_PARTITION} IN ROW EXCLUSIVE MODE")


def step_partition_drop(month: date, *, droppable: Callable[[list[int]], bool]) -> int:
    """Detach and drop one month's partition if `droppable` says yes to the projects with
    steps in it (and no other has steps there once new steps are held off); return how many
    steps it held, else 0."""
    name = partition_name(month)
    with _partition_ddl() as cursor:
        if month not in step_partitions():
            return 0
        # asked and counted (the long part) before the lock, then checked under it: a step of
        # another project since is a no (the next hour asks again), a later id is counted
        projects = step_partition_projects(month)
        if not droppable(projects):
            return 0
        cursor.execute(f"SELECT count(*), coalesce(max(id), 0) FROM {name}")
        [count, last] = cursor.fetchone()
        # The step table first, as a batch takes it before the month it routes a row to:
        # holding the month while waiting for the table was a deadlock with a batch holding
        # the table and waiting for the month. Readers and writers of steps wait till commit.
        cursor.execute(f"LOCK TABLE ONLY {STEP_TABLE} IN ACCESS EXCLUSIVE MODE")
        if not set(step_partition_projects(month)) <= set(projects):
            return 0
        cursor.execute(f"SELECT count(*) FROM {name} WHERE id > %s", [last])
        count += cursor.fetchone()[0]
        cursor.execute(f"ALTER TABLE {STEP_TABLE} DETACH PARTITION {name}")
        cursor.execute(f"DROP TABLE {name}")
    _known.discard(month)
    log.info("dropped step partition %s (%s steps)", name, count)
    return int(count)


def step_partition_projects(month: date) -> list[int]:
    """The projects with steps in this month's partition: a skip scan of its (project,
    model, timestamp) index, one probe per project whatever the number of steps."""
    name = partition_name(month)
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH RECURSIVE p (id) AS (
                (SELECT project_id FROM {name} ORDER BY project_id LIMIT 1)
                UNION ALL
                SELECT (SELECT project_id FROM {name} WHERE project_id > p.id
                        ORDER BY project_id LIMIT 1)
                FROM p WHERE p.id IS NOT NULL
            )
            SELECT id FROM p WHERE id IS NOT NULL
            """
        )
        return [row[0] for row in cursor.fetchall()]


def forget_step_partitions() -> None:
    """Forget the months seen (tests: a rolled-back test takes its partitions with it)."""
    global _retry_at
    _known.clear()
    _retry_at = 0.0
