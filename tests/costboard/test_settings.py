"""A bad environment value stops start-up with a message naming the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from costboard.env import env_bool, env_decimal, env_fraction, env_int

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("COSTBOARD_SESSION_TOKEN_CAP", "lots"),
        ("COSTBOARD_SESSION_TOKEN_CAP", "0"),
        ("COSTBOARD_SESSION_COST_CAP_USD", "five"),
        ("COSTBOARD_WARN_AT_PCT", "80"),
        ("DJANGO_DEBUG", "maybe"),
        ("DATABASE_URL", "mysql://root@localhost/x"),
    ],
)
def test_startup_fails_naming_the_variable(name: str, value: str) -> None:
    env = {**os.environ, name: value, "DJANGO_SETTINGS_MODULE": "costboard.settings"}
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert name in result.stderr
    assert "ImproperlyConfigured" in result.stderr


def test_env_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X_BOOL", "yes")
    monkeypatch.setenv("X_INT", " 42 ")
    monkeypatch.setenv("X_DEC", "5.25")
    monkeypatch.setenv("X_FRAC", "0.75")
    assert env_bool("X_BOOL", False) is True
    assert env_int("X_INT", 1) == 42
    assert env_decimal("X_DEC", "1") == Decimal("5.25")
    assert env_fraction("X_FRAC", "0.8") == Decimal("0.75")
    assert env_int("X_UNSET", 7) == 7
    monkeypatch.setenv("X_FRAC", "0")
    with pytest.raises(ImproperlyConfigured, match="X_FRAC"):
        env_fraction("X_FRAC", "0.8")
    monkeypatch.setenv("X_DEC", "-1")
    with pytest.raises(ImproperlyConfigured, match="X_DEC"):
        env_decimal("X_DEC", "1")


def test_every_task_a_service_enqueues_by_name_is_registered_in_a_fresh_process() -> None:
    """Services enqueue some tasks by name (no import of costboard.tasks): a web process must
    have them registered, or without a broker they would go to a broker that is not there."""
    from costboard.budgets.services import RECHECK_TASK
    from costboard.pricing.services import REPRICE_TASK

    code = (
        "import django; django.setup(); from costboard.celery import app; "
        "print(' '.join(sorted(app.tasks)))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "costboard.settings"}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    registered = set(result.stdout.split())
    assert {RECHECK_TASK, REPRICE_TASK, "memory_ui.tasks.memory_detect"} <= registered
