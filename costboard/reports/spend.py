"""Spend grouped by day, model (its family), step type, end user or one tag key between two UTC
days, summed from the daily rollups only, never the steps: day, model and step type from
DailyRollup; user from UserDailyRollup; tag:<key> from TagDailyRollup, whose untagged row (the
tag null) is the day's DailyRollup less its tagged rows, so the total is the window's whole
spend whatever the grouping. `GET /api/v1/spend` (docs/api.md, "Spend") and the showback
report (docs/reports.md) both read it: their figures for the same days are the same."""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Any

from django.db.models import Model, Sum

from costboard.models import DailyRollup, TagDailyRollup, UserDailyRollup

SUMS = (
    "cost_usd",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
# a group's name → the rollup column it reads
PLAIN = {"day": "day", "model": "family", "step_type": "step_type", "user": "user_id"}


def spend_rows(
    *, project_id: int, names: list[str], since: date, until: date
) -> list[dict[str, Any]]:
    """One row per group of `names` (day, model, step_type, user, tag:<key>; user and a tag
    each with day alone), with the sums (cost_usd a Decimal) and `steps`, ordered by the
    groups; grouped by a tag, the steps without it are a row whose tag is None."""
    tag_key = next((n[4:] for n in names if n.startswith("tag:")), None)
    source: type[Model]
    filters: dict[str, Any] = {"project_id": project_id, "day__gte": since, "day__lte": until}
    columns: dict[str, str] = {}
    if tag_key is not None:
        source, filters["key"] = TagDailyRollup, tag_key
        columns = {n: ("value" if n.startswith("tag:") else PLAIN[n]) for n in names}
    elif "user" in names:
        source = UserDailyRollup
        columns = {n: PLAIN[n] for n in names}
    else:
        source = DailyRollup
        columns = {n: PLAIN[n] for n in names}
    rows = _sums(source, filters, columns)
    if tag_key is not None:
        tag = f"tag:{tag_key}"
        rows = _with_untagged(rows, project_id, tag, [n for n in names if n != tag], since, until)
    return rows


def _sums(
    source: type[Model], filters: dict[str, Any], columns: dict[str, str]
) -> list[dict[str, Any]]:
    """One row per group of `columns` (group name → rollup column), with the sums."""
    order = list(columns.values())
    rollups = source._default_manager.filter(**filters)
    sums = {f"s_{name}": Sum(name) for name in SUMS} | {"s_steps": Sum("calls")}
    # no columns: one row of the whole window (values() with no field would group by every one)
    grouped = (
        rollups.values(*order).annotate(**sums).order_by(*order)
        if order
        else [rollups.aggregate(**sums)]
    )
    rows = []
    for group in grouped:
        row: dict[str, Any] = {
            name: (group[column].isoformat() if name == "day" else group[column])
            for name, column in columns.items()
        }
        # a sum of nothing is None; `or 0` also turned an unpriced group's Decimal 0 into int 0
        row.update({name: _zero_if_none(group[f"s_{name}"], name) for name in SUMS})
        row["steps"] = group["s_steps"] or 0
        rows.append(row)
    return rows


def _with_untagged(
    tagged: list[dict[str, Any]],
    project_id: int,
    tag: str,
    others: list[str],
    since: date,
    until: date,
) -> list[dict[str, Any]]:
    """`tagged` and, per group of `others` (day or nothing), the spend of the steps without
    the tag: the whole spend (DailyRollup) less the tagged rows (a step has at most one value
    per key). Its tag is None: null in JSON, an empty cell in CSV."""
    filters = {"project_id": project_id, "day__gte": since, "day__lte": until}
    untagged = {
        tuple(row[n] for n in others): row
        for row in _sums(DailyRollup, filters, {n: PLAIN[n] for n in others})
    }
    for row in tagged:
        group = tuple(row[n] for n in others)
        zero = {name: _zero_if_none(None, name) for name in SUMS} | {"steps": 0}
        whole = untagged.setdefault(group, {**dict(zip(others, group, strict=True)), **zero})
        for name in (*SUMS, "steps"):
            whole[name] -= row[name]
    rows = list(tagged)
    for group, row in untagged.items():
        if any(row[name] for name in (*SUMS, "steps")):
            rows.append({**dict(zip(others, group, strict=True)), tag: None, **row})
    # by the other groups, the untagged row after the tag's values
    rows.sort(key=lambda r: (*(r[n] for n in others), r[tag] is None, r[tag] or ""))
    return rows


def _zero_if_none(value: Decimal | int | None, name: str) -> Decimal | int:
    if value is not None:
        return value
    return Decimal(0) if name == "cost_usd" else 0


def spend_total(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The sums of `rows` (spend_rows'): the window's whole spend, whatever the grouping."""
    total: dict[str, Any] = {
        name: sum(row[name] for row in rows) for name in SUMS if name != "cost_usd"
    }
    total["cost_usd"] = sum((Decimal(row["cost_usd"]) for row in rows), Decimal(0))
    total["steps"] = sum(row["steps"] for row in rows)
    return total
