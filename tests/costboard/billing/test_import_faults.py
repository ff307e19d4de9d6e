"""The daily billing import on a real Celery worker whose process is killed mid-import
(SIGKILL, as the OOM killer does): the task goes back on the queue and is done again, each
day's rows stored once. Run once a day, a lost import would leave yesterday's bill as the day
before's import saw it: the next run reads only its own yesterday and today."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery
from django.utils import timezone

from costboard.models import BilledUsage, Project, ProviderProject
from tests.costboard.billing.fakes import OPENAI_KEY, OPENAI_PATHS, FakeBilling
from tests.costboard.billing.test_import import openai_costs, openai_usage
from tests.costboard.budgets.test_alert_faults import QUIET, worker_database_url
from tests.servers import RedisServer
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[3]
# how long a liveness wait allows a Celery worker to start (or to replace its pool process)
# and take the task: a bound on "never", not a measure of speed (tests/waiting.py)
WORKER_START_S = 120.0

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the worker process reads what we commit
    pytest.mark.slow,
]


def pool_processes(worker: subprocess.Popen[bytes]) -> list[int]:
    """The pids of the worker's pool processes (its children)."""
    children = Path(f"/proc/{worker.pid}/task/{worker.pid}/children")
    return [int(pid) for pid in children.read_text().split()] if children.exists() else []


def test_a_worker_killed_mid_import_leaves_the_import_to_be_done_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = Project.objects.create(name="Acme", slug="acme")
    ProviderProject.objects.create(provider="openai", external_id="proj_alpha", project=project)
    fake = FakeBilling(page_size=2).start()
    today = timezone.now().date()  # the worker imports its yesterday and today (UTC)
    days = [today + timedelta(days=n) for n in (-2, -1, 0, 1)]  # a midnight between is covered
    fake.results = {
        OPENAI_PATHS["costs"]: {day: openai_costs(n) for n, day in enumerate(days)},
        OPENAI_PATHS["usage"]: {day: openai_usage(n) for n, day in enumerate(days)},
    }
    broker = RedisServer()
    broker.start()
    # Celery prefers the environment's broker (CI's Redis) to the one it is given: make it this
    # test's, or the task goes where no worker of this test listens.
    monkeypatch.setenv("CELERY_BROKER_URL", broker.url)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "costboard.settings",
        "CELERY_BROKER_URL": broker.url,
        "DATABASE_URL": worker_database_url(),
        "COSTBOARD_OPENAI_ADMIN_KEY": OPENAI_KEY,
        "COSTBOARD_OPENAI_API_BASE": fake.base_url,
        "COSTBOARD_ANTHROPIC_ADMIN_KEY": "",
    }
    log = (tmp_path / "worker.log").open("wb")
    billing_worker = ["-m", "celery", "-A", "costboard", "worker", "-Q", "billing", "-c", "1"]
    worker = subprocess.Popen(  # the billing queue's worker, one pool process (docs/operations.md)
        [sys.executable, *billing_worker, *QUIET],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    beat = Celery(broker=broker.url, set_as_current=False)
    costs = OPENAI_PATHS["costs"]
    try:
        fake.hold()
        beat.send_task("costboard.tasks.billing_import", queue="billing")  # beat's daily entry
        wait_until(  # a worker's cold start first: on a busy two-core machine, past 30 s
            lambda: fake.held() == 1,
            timeout=WORKER_START_S,
            what=f"the import asking for costs; log {tmp_path}",
        )
        [killed] = pool_processes(worker)
        os.kill(killed, signal.SIGKILL)  # mid-import: nothing of it committed
        fake.release()
        wait_until(
            lambda: BilledUsage.objects.count() == 10,
            timeout=WORKER_START_S,  # a new pool process, as cold
            what=f"the import done again (have {BilledUsage.objects.count()}); log {tmp_path}",
        )
    finally:
        fake.release()
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
        broker.stop()
        fake.stop()

    assert killed not in pool_processes(worker)
    yesterday = today - timedelta(days=1)
    # two days, each with its three cost rows and two usage rows, stored once
    assert sorted(BilledUsage.objects.values_list("day", "source").distinct()) == [
        (yesterday, "openai_costs"),
        (yesterday, "openai_usage"),
        (today, "openai_costs"),
        (today, "openai_usage"),
    ]
    assert BilledUsage.objects.filter(source="openai_costs").count() == 6
    assert BilledUsage.objects.filter(source="openai_usage").count() == 4
    assert BilledUsage.objects.filter(project=project).count() == 4  # proj_alpha's
    assert len(fake.asked(costs)) == 2  # the killed import's first page, and the one done again
