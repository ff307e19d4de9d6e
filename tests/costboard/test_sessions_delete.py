"""Deleting sessions (the admin's delete) locks them in the order ingest locks them, by
external id in their project: in id order, a delete of two sessions racing a batch of the same
two deadlocked, one of them refused."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from costboard.models import Session
from costboard.projects import sessions_delete
from tests.conftest import make_agent
from tests.waiting import blocked_on_a_lock, wait_until

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="row locks are PostgreSQL's; CI runs them there"
)
DELETE_LOCKS = '%FROM "costboard_session"%FOR UPDATE%'  # the delete's locking read


@pytest.mark.django_db(transaction=True)
def test_a_delete_racing_a_batch_of_the_same_sessions_waits_and_never_deadlocks() -> None:
    agent = make_agent("deletes")
    agent.events({"type": "session", "session_id": "b"})  # made first: the lower id
    agent.events({"type": "session", "session_id": "a"})
    b, a = Session.objects.get(external_id="b"), Session.objects.get(external_id="a")
    assert b.pk < a.pk  # id order and ingest's order disagree
    errors: list[BaseException] = []
    first_held = threading.Event()
    deleted: list[int] = []

    def as_ingest() -> None:
        """A batch's locks: its sessions by external id, "a" then "b"."""
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                lock = "SELECT id FROM costboard_session WHERE id = %s FOR UPDATE"
                cursor.execute(lock, [a.pk])
                first_held.set()
                wait_until(
                    lambda: blocked_on_a_lock(DELETE_LOCKS) == 1,
                    what="the delete behind the batch",
                )
                cursor.execute(lock, [b.pk])
        except BaseException as exc:  # a deadlock's victim, reported below
            errors.append(exc)
        finally:
            connection.close()

    def as_admin() -> None:
        try:
            first_held.wait(timeout=30)
            deleted.append(sessions_delete(session_ids=[b.pk, a.pk]))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=as_ingest), threading.Thread(target=as_admin)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert deleted == [2]
    assert not Session.objects.filter(pk__in=[a.pk, b.pk]).exists()
