"""Writes to projects and their API keys: a project and key made by `create_api_key`, keys
revoked in the admin, a key's use noted when the API resolves it to its project. (A key is
issued by `ApiKey.issue`: shown once, only its hash stored.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

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
    """The active key (with its project, one query), noting its use at most once a minute
    (so a busy agent's requests don't all write its row)."""
    lookup = _key_lookup(connection.vendor)
    with connection.cursor() as cursor:
        cursor.execute(lookup.sql, [ApiKey.hash_of(raw_key)])
        row = cursor.fetchone()
    if row is None:
        return None
    key = lookup.key(row)
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at > timedelta(minutes=1):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
    return key


Converter = Callable[[Any, Any, Any], Any]


@dataclass(frozen=True)
class _KeyLookup:
    """Every API request's first query, written once: a key and its project by the key's
    hash. The ORM built the same query anew for each request (select_related over thirty
    columns), 0.7 of its 1.2 ms; rows become models as the ORM makes them (Model.from_db,
    after the database's converters: none on PostgreSQL, text times and decimals on SQLite)."""

    sql: str
    key_fields: list[str]
    project_fields: list[str]
    converters: list[tuple[Any, list[Converter]]]  # per column: its expression, converters

    def key(self, row: Sequence[Any]) -> ApiKey:
        values = list(row)
        for n, (column, converters) in enumerate(self.converters):
            for convert in converters:
                values[n] = convert(values[n], column, connection)
        split = len(self.key_fields)
        key = ApiKey.from_db(connection.alias, self.key_fields, values[:split])
        key.project = Project.from_db(connection.alias, self.project_fields, values[split:])
        return key


@lru_cache(maxsize=4)
def _key_lookup(vendor: str) -> _KeyLookup:
    """The lookup for this kind of database (its converters differ)."""
    quote = connection.ops.quote_name
    columns = []
    converters: list[tuple[Any, list[Converter]]] = []
    for model, alias in ((ApiKey, "k"), (Project, "p")):
        for model_field in model._meta.concrete_fields:
            name = model_field.column
            assert name is not None  # every concrete field has one
            columns.append(f"{alias}.{quote(name)}")
            column = model_field.get_col(alias)
            found = connection.ops.get_db_converters(column)
            found += model_field.get_db_converters(connection)
            converters.append((column, found))
    return _KeyLookup(
        sql=(
            f"SELECT {', '.join(columns)} FROM {ApiKey._meta.db_table} k"
            f" JOIN {Project._meta.db_table} p ON p.id = k.project_id"
            " WHERE k.key_hash = %s AND k.revoked_at IS NULL"
        ),
        key_fields=[f.attname for f in ApiKey._meta.concrete_fields],
        project_fields=[f.attname for f in Project._meta.concrete_fields],
        converters=converters,
    )
