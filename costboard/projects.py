"""Writes to projects and their API keys: a project and key made by `create_api_key`, keys
revoked in the admin, a key's use noted when the API resolves it to its project. (A key is
issued by `ApiKey.issue`: shown once, only its hash stored.)"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import lru_cache

from django.db import connection, transaction
from django.utils import timezone

from costboard.model_rows import ModelColumns
from costboard.models import ApiKey, Project


def api_keys_revoke(*, key_ids: list[int], at: datetime) -> int:
    """Revoke the active keys among these: their next request is refused (401). Returns how
    many were revoked now (a key revoked before keeps its time)."""
    return ApiKey.objects.filter(pk__in=key_ids, revoked_at__isnull=True).update(revoked_at=at)


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
