"""The hot reads written once as SQL (costboard/model_rows.py) give the models the ORM gives:
every field, with its type, on PostgreSQL and on SQLite (whose times and numbers the
database's converters make datetimes and Decimals)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db.models import Model

from costboard.budgets.period_ledgers import project_budgets
from costboard.budgets.period_services import period_budget_create
from costboard.models import PeriodBudget, Project

pytestmark = pytest.mark.django_db


def fields_of(instance: Model) -> list[tuple[str, Any, type]]:
    return [
        (field.attname, getattr(instance, field.attname), type(getattr(instance, field.attname)))
        for field in type(instance)._meta.concrete_fields
    ]


def test_a_projects_budgets_are_read_as_the_orm_reads_them() -> None:
    project = Project.objects.create(name="Budgets", slug="budgets")
    other = Project.objects.create(name="Other", slug="other")
    for owner, name, fields in (
        (project, "month", {"cost_limit_usd": Decimal("250.5"), "warn_at_pct": Decimal("0.7")}),
        (other, "theirs", {"token_limit": 10**9}),
        (
            project,
            "team day",
            {
                "scope": "tag",
                "scope_value": "team=search",
                "period": "day",
                "timezone": "Europe/Paris",
                "token_limit": 5_000_000,
                "action": "stop",
            },
        ),
    ):
        period_budget_create(project=owner, fields={"name": name, **fields})

    read = project_budgets(project)

    orm = list(PeriodBudget.objects.filter(project=project).order_by("pk"))
    assert [b.name for b in read] == ["month", "team day"]
    assert [fields_of(b) for b in read] == [fields_of(b) for b in orm]
    assert read[0].cost_limit_usd == Decimal("250.5")
    assert project_budgets(Project.objects.create(name="None", slug="none")) == []
