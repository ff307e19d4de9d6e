"""The login form locks a username out from an address after 5 failed logins (django-axes):
429 with the reason and the wait, the right password refused too until the cool-off ends or
`manage.py axes_reset` lifts it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

pytestmark = pytest.mark.django_db

PASSWORD = "right-pass-123"


@pytest.fixture
def ops(db: None) -> Any:
    return get_user_model().objects.create_user("ops", "", PASSWORD, is_staff=True)


def log_in(client: Client, password: str, *, ip: str = "10.0.0.7", username: str = "ops") -> Any:
    return client.post(
        "/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=ip
    )


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def test_five_failures_lock_the_username_out_from_that_address(ops: Any) -> None:
    client = Client()
    for _ in range(4):
        refused = log_in(client, "wrong")
        assert refused.status_code == 200
        assert b"didn&#x27;t match" in refused.content or b"didn't match" in refused.content

    locked = log_in(client, "wrong")
    assert locked.status_code == 429
    assert locked["Retry-After"] == str(15 * 60)
    page = locked.content.decode()
    assert "Too many failed logins" in page
    assert "locked for 15 minutes" in page
    assert "axes_reset" in page

    right = log_in(client, PASSWORD)  # the right password is refused while locked out
    assert right.status_code == 429
    assert not logged_in(client)

    other_address = Client()  # the lock is of this username from that address only
    assert log_in(other_address, PASSWORD, ip="10.0.0.8").status_code == 302
    assert logged_in(other_address)


def test_the_lockout_ends_after_the_cool_off(ops: Any) -> None:
    client = Client()
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        for _ in range(5):
            log_in(client, "wrong")
        clock.shift(timedelta(minutes=10))
        assert log_in(client, PASSWORD).status_code == 429  # and the wait starts again
        clock.shift(timedelta(minutes=14))  # 24 minutes after the fifth failure, 14 after
        assert log_in(client, PASSWORD).status_code == 429
        clock.shift(timedelta(minutes=16))  # 16 minutes after the last try
        assert log_in(client, PASSWORD).status_code == 302
        assert logged_in(client)


def test_axes_reset_lifts_the_lockout(ops: Any) -> None:
    client = Client()
    for _ in range(5):
        log_in(client, "wrong")
    assert log_in(client, PASSWORD).status_code == 429

    call_command("axes_reset")

    assert log_in(client, PASSWORD).status_code == 302
    assert logged_in(client)


def test_a_success_forgets_earlier_failures(ops: Any) -> None:
    client = Client()
    for _ in range(4):
        log_in(client, "wrong")
    assert log_in(client, PASSWORD).status_code == 302
    client.logout()
    for _ in range(4):
        assert log_in(client, "wrong").status_code == 200  # counted from zero again
    assert log_in(client, PASSWORD).status_code == 302


def test_the_admin_login_is_guarded_too(ops: Any) -> None:
    client = Client()
    for _ in range(5):
        client.post(
            "/admin/login/", {"username": "ops", "password": "wrong"}, REMOTE_ADDR="10.0.0.9"
        )
    answer = client.post(
        "/admin/login/", {"username": "ops", "password": PASSWORD}, REMOTE_ADDR="10.0.0.9"
    )
    assert answer.status_code == 429
    assert not logged_in(client)
