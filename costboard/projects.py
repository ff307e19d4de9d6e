"""Writes to projects and their API keys: a project and key made by `create_api_key` (a
project alone by the warm-up, rolled back), keys revoked in the admin, a key's use noted when
the API resolves it to its project (a key is issued by `ApiKey.issue`: shown once, only its
hash stored); and sessions deleted in the admin, their projects' count of sessions kept; and
the per-day tally of events each project had stored, replayed and refused, read by /metrics:
every write of that tally is the one statement `ingest_tally_statement` builds, which
`ingest_tally` runs alone and ingest (and the bulk seeder) in their transactions."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from costboard.model_rows import ModelColumns
from costboard.models import ApiKey, IngestTally, Project, Session

log = logging.getLogger(__name__)

_TALLY = IngestTally._meta.db_table


def ingest_tally(
    project_id: int,
    *,
    accepted: int = 0,
    duplicates: int = 0,
    refused: int = 0,
    sessions_made: int = 0,
    sessions_deleted: int = 0,
    day: date | None = None,
) -> None:
    """Add to a project's event counts (and sessions made or deleted) of a UTC day, in one
    statement (`ingest_tally_statement`): the increment happens in SQL, so concurrent
    requests (any worker) lose no count."""
    if not (accepted or duplicates or refused or sessions_made or sessions_deleted):
        return
    statement, params = ingest_tally_statement(
        project_id,
        day or datetime.now(UTC).date(),
        accepted=accepted,
        duplicates=duplicates,
        refused=refused,
        sessions_made=sessions_made,
        sessions_deleted=sessions_deleted,
    )
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


_TALLY_UPSERT = f"""
    INSERT INTO {_TALLY}
        (project_id, day, accepted, duplicates, refused, sessions_made, sessions_deleted)
    VALUES (%s, %s, %s, %s, %s, %s, %s)
    ON CONFLICT (project_id, day) DO UPDATE SET
        accepted = {_TALLY}.accepted + excluded.accepted,
        duplicates = {_TALLY}.duplicates + excluded.duplicates,
        refused = {_TALLY}.refused + excluded.refused,
        sessions_made = {_TALLY}.sessions_made + excluded.sessions_made,
        sessions_deleted = {_TALLY}.sessions_deleted + excluded.sessions_deleted
    """


def ingest_tally_statement(
    project_id: int,
    day: date,
    *,
    accepted: int = 0,
    duplicates: int = 0,
    refused: int = 0,
    sessions_made: int = 0,
    sessions_deleted: int = 0,
) -> tuple[str, list[Any]]:
    """The one statement that adds to a project's tally of a UTC day, with its parameters:
    `ingest_tally` runs it alone (a request's refusal, a session deleted), ingest in its
    transaction. There it adds the batch's events (/metrics) and the sessions it made (the
    project's count of sessions) in SQL, so concurrent batches lose no count, and a batch
    rolled back (a whole OTLP request, an idempotent retry racing its twin) is not counted. The
    row is one every batch of the project writes anyway, last, held only to the commit:
    counting sessions here locks nothing more."""
    return (
        _TALLY_UPSERT,
        [
            project_id,
            connection.ops.adapt_datefield_value(day),
            accepted,
            duplicates,
            refused,
            sessions_made,
            sessions_deleted,
        ],
    )


def api_keys_revoke(*, key_ids: list[int], at: datetime) -> int:
    """Revoke the active keys among these: their next request is refused (401). Returns how
    many were revoked now (a key revoked before keeps its time)."""
    return ApiKey.objects.filter(pk__in=key_ids, revoked_at__isnull=True).update(revoked_at=at)


def sessions_delete(*, session_ids: list[int]) -> int:
    """Delete these sessions (their turns, steps and model mix with them) and count them out
    of their projects' sessions (IngestTally.sessions_deleted), in one transaction. Locked
    first, in the order a batch locks them (by external id in their project: in id order, a
    delete racing a batch of the same sessions deadlocked): two deletes of one session count
    it once. Returns how many were deleted."""
    with transaction.atomic():
        locked = list(
            Session.objects.select_for_update()
            .filter(pk__in=session_ids)
            .order_by("project_id", "external_id")
            .values_list("pk", "project_id")
        )
        if not locked:
            return 0
        Session.objects.filter(pk__in=[pk for pk, _ in locked]).delete()
        for project_id, count in Counter(project for _, project in locked).items():
            ingest_tally(project_id, sessions_deleted=count)
    return len(locked)


# "TALLYCHK": the advisory lock of the tally check (PostgreSQL), so two checks at once (two
# beats, beat and guard_sweep) take turns, and the second reads what the first put right
_TALLY_CHECK_LOCK = 0x5441_4C4C_5943_484B


def sessions_tally_check() -> dict[int, int]:
    """Put right any project whose tally of sessions (made less deleted) is not its count of
    sessions: sessions made or deleted some way other than ingest and the admin (raw SQL, a
    server of before the tally while its migration ran). Both are read by one statement, so
    one snapshot: a batch commits its sessions and its tally together, so a batch in flight
    is in both or neither. One check at a time (an advisory lock on PostgreSQL; SQLite's
    write lock, taken at the transaction's start): two at once would each add the difference.
    Returns each corrected project's difference (sessions it had more than its tally said)."""
    session, tally = Session._meta.db_table, IngestTally._meta.db_table
    with transaction.atomic():
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_TALLY_CHECK_LOCK])
            cursor.execute(
                f"""
                SELECT p.id,
                       (SELECT count(*) FROM {session} s WHERE s.project_id = p.id),
                       (SELECT COALESCE(sum(t.sessions_made - t.sessions_deleted), 0)
                        FROM {tally} t WHERE t.project_id = p.id)
                FROM {Project._meta.db_table} p
                """
            )
            rows = cursor.fetchall()
        drift = {
            pk: int(counted) - int(tallied) for pk, counted, tallied in rows if counted != tallied
        }
        for project_id, off in drift.items():
            log.warning(
                "project %s had %+d sessions its tally did not count: corrected", project_id, off
            )
            if off > 0:
                ingest_tally(project_id, sessions_made=off)
            else:
                ingest_tally(project_id, sessions_deleted=-off)
    return drift


def project_create(*, name: str, slug: str) -> Project:
    """A project without a key: the warm-up's throwaway one (costboard/warmup.py), made in
    the transaction it rolls back."""
    return Project.objects.create(name=name, slug=slug)


def project_key_create(
    *, slug: str, name: str = "", role: str = ApiKey.Role.INGEST
) -> tuple[Project, bool, str]:
    """A new key with `role` for the project `slug`, making the project if it is missing.
    Returns the project, whether it was made, and the key (shown once: only its hash is
    stored)."""
    if role not in ApiKey.Role.values:
        raise ValueError(f"role must be one of {', '.join(ApiKey.Role.values)}, not {role!r}")
    with transaction.atomic():
        project, created = Project.objects.get_or_create(
            slug=slug, defaults={"name": slug.replace("-", " ").title()}
        )
        _, raw_key = ApiKey.issue(project=project, name=name, role=role)
    return project, created, raw_key


def key_for(raw_key: str) -> ApiKey | None:
    """The active key (with its project, one query written once: costboard/model_rows.py),
    noting its use at most once a minute (so a busy agent's requests don't all write its
    row)."""
    with connection.cursor() as cursor:
        cursor.execute(_key_sql(connection.vendor), [ApiKey.hash_of(raw_key)])
        row = cursor.fetchone()
    if row is None:
        return None
    key = _KEY.instance(row[: len(_KEY)])
    key.project = _PROJECT.instance(row[len(_KEY) :])
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > timedelta(minutes=1):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key


_KEY = ModelColumns(ApiKey, "k")
_PROJECT = ModelColumns(Project, "p")


@lru_cache(maxsize=4)
def _key_sql(vendor: str) -> str:
    """The key lookup on this kind of database: every API request's first query."""
    return (
        f"SELECT {_KEY.select()}, {_PROJECT.select()}"
        f" FROM {_KEY.table} JOIN {_PROJECT.table} ON p.id = k.project_id"
        " WHERE k.key_hash = %s AND k.revoked_at IS NULL"
    )
