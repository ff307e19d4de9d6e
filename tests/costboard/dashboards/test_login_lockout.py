"""Five failed logins lock out one (username, client address) pair, on the login form and the
admin's alike (django-axes): 429 with the time the lock has left, the right password refused
from that address only, from every other address it logs in. The client address is the peer's
or, behind a trusted proxy, the one its X-Forwarded-For names; a forged header neither frees
its sender nor locks anyone else out. Tries while locked do not restart the wait; a staff user
lifts a lockout in the admin, `manage.py axes_reset` lifts them all."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import time_machine
from axes.models import AccessAttempt
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

pytestmark = pytest.mark.django_db

PASSWORD = "right-pass-123"
PAGES = ["/accounts/login/", "/admin/login/"]
PROXY = "10.9.9.9"


@pytest.fixture
def admin_user(db: None) -> Any:
    return get_user_model().objects.create_superuser("admin", "", PASSWORD)


@pytest.fixture
def clock() -> Iterator[Any]:
    with time_machine.travel(timezone.now(), tick=False) as traveller:
        yield traveller


@pytest.fixture(params=PAGES)
def page(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def log_in(
    client: Client,
    page: str,
    password: str,
    *,
    ip: str = "10.0.0.1",
    forwarded: str | None = None,
    username: str = "admin",
) -> Any:
    headers = {"x-forwarded-for": forwarded} if forwarded is not None else {}
    return client.post(
        page, {"username": username, "password": password}, REMOTE_ADDR=ip, headers=headers
    )


def logged_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def fail_five_times(page: str, **where: Any) -> Any:
    client = Client()
    answers = [log_in(client, page, "wrong", **where) for _ in range(5)]
    assert [a.status_code for a in answers] == [200, 200, 200, 200, 429]
    return answers[-1]


def logs_in(page: str, **where: Any) -> bool:
    client = Client()
    answer = log_in(client, page, PASSWORD, **where)
    return answer.status_code == 302 and logged_in(client)


def test_five_failures_lock_that_pair_out_and_no_other(admin_user: Any, page: str) -> None:
    locked = fail_five_times(page, ip="10.0.0.1")
    assert locked["Retry-After"] == str(15 * 60)
    text = locked.content.decode()
    assert "Too many failed logins" in text
    assert "try again in 15 minutes" in text
    assert "Login lockouts" in text and "axes_reset" in text

    client = Client()
    right = log_in(client, page, PASSWORD, ip="10.0.0.1")  # refused, though right, from there
    assert right.status_code == 429
    assert not logged_in(client)
    for other_page in PAGES:  # the other login page holds the same lock
        assert log_in(Client(), other_page, PASSWORD, ip="10.0.0.1").status_code == 429

    for other_page in PAGES:  # from another address the right password works, on both
        assert logs_in(other_page, ip="10.0.0.2")
        assert logs_in(other_page, ip="2001:db8::2")
    get_user_model().objects.create_user("ops", "", PASSWORD, is_staff=True)
    assert logs_in(page, ip="10.0.0.1", username="ops")  # another user from that address


def test_behind_a_trusted_proxy_each_client_is_told_apart(
    admin_user: Any, page: str, settings: Any
) -> None:
    settings.TRUSTED_PROXIES = [PROXY]
    fail_five_times(page, ip=PROXY, forwarded="10.0.0.1")
    assert AccessAttempt.objects.get().ip_address == "10.0.0.1"  # the client, not the proxy

    assert log_in(Client(), page, PASSWORD, ip=PROXY, forwarded="10.0.0.1").status_code == 429
    for other_page in PAGES:
        assert logs_in(other_page, ip=PROXY, forwarded="10.0.0.2")
        assert logs_in(other_page, ip=PROXY)  # the proxy's own address: not locked either
    # what the locked client writes into the header is kept; the proxy appends the truth
    forged = log_in(Client(), page, PASSWORD, ip=PROXY, forwarded="10.0.0.2, 10.0.0.1")
    assert forged.status_code == 429


def test_a_forged_header_can_neither_aim_nor_unlock(
    admin_user: Any, page: str, settings: Any
) -> None:
    settings.TRUSTED_PROXIES = [PROXY]
    # an attacker (10.0.0.66) names the admin's address, straight and through the proxy
    client = Client()
    for n in range(5):
        log_in(client, page, "wrong", ip="10.0.0.66", forwarded="10.0.0.2")
        log_in(client, page, "wrong", ip=PROXY, forwarded=f"10.0.0.2, 10.0.0.{100 + n}")
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {
        "10.0.0.66",
        *(f"10.0.0.{100 + n}" for n in range(5)),
    }
    assert logs_in(page, ip="10.0.0.2")
    assert logs_in(page, ip=PROXY, forwarded="10.0.0.2")

    # the locked attacker's header, changed on every try, frees nothing
    assert log_in(Client(), page, PASSWORD, ip="10.0.0.66").status_code == 429
    unlocked = log_in(Client(), page, PASSWORD, ip="10.0.0.66", forwarded="10.0.0.77")
    assert unlocked.status_code == 429


def test_tries_while_locked_do_not_restart_the_wait(admin_user: Any, page: str, clock: Any) -> None:
    fail_five_times(page)
    client = Client()
    clock.shift(timedelta(minutes=5))
    for password in ("wrong", "wrong", PASSWORD):  # refused, and not counted
        assert log_in(client, page, password).status_code == 429
    assert AccessAttempt.objects.get().failures_since_start == 5

    clock.shift(timedelta(minutes=5))
    refused = log_in(client, page, PASSWORD)
    assert refused["Retry-After"] == str(5 * 60)  # the time left, not the whole cool-off
    assert "try again in 5 minutes" in refused.content.decode()

    clock.shift(timedelta(minutes=5) - timedelta(milliseconds=300))
    assert log_in(client, page, PASSWORD)["Retry-After"] == "1"  # 0.3 s, rounded up
    clock.shift(timedelta(seconds=1))  # 15 minutes after the fifth failure
    assert log_in(client, page, PASSWORD).status_code == 302
    assert logged_in(client)


def test_failures_spread_over_user_agents_count_for_the_pair(admin_user: Any, clock: Any) -> None:
    page = PAGES[0]
    for n in range(5):  # a row per user agent, each with the time of its own failure
        answer = Client(HTTP_USER_AGENT=f"bot/{n}").post(
            page, {"username": "admin", "password": "wrong"}, REMOTE_ADDR="10.0.0.1"
        )
        clock.shift(timedelta(minutes=1))
    assert answer.status_code == 429
    assert AccessAttempt.objects.count() == 5
    assert logs_in(page, ip="10.0.0.2")
    # the lock holds while all five count: until 15 minutes after the first, 5 minutes ago
    refused = log_in(Client(), page, PASSWORD)
    assert refused["Retry-After"] == str(10 * 60)
    clock.shift(timedelta(minutes=10) - timedelta(seconds=1))
    assert log_in(Client(), page, PASSWORD)["Retry-After"] == "1"
    clock.shift(timedelta(seconds=2))
    assert logs_in(page, ip="10.0.0.1")


def test_a_success_forgets_earlier_failures(admin_user: Any, page: str) -> None:
    client = Client()
    for _ in range(4):
        log_in(client, page, "wrong")
    assert log_in(client, page, PASSWORD).status_code == 302
    client.logout()
    for _ in range(4):
        assert log_in(client, page, "wrong").status_code == 200  # counted from zero again
    assert log_in(client, page, PASSWORD).status_code == 302


def test_axes_reset_lifts_every_lockout(admin_user: Any) -> None:
    fail_five_times(PAGES[0], ip="10.0.0.1")
    fail_five_times(PAGES[1], ip="10.0.0.3")
    call_command("axes_reset")
    assert logs_in(PAGES[0], ip="10.0.0.1")
    assert logs_in(PAGES[1], ip="10.0.0.3")


# --- the admin's list: until when, and lifted by staff ---------------------------------------


def lockout_list(staff: Client, query: str = "") -> str:
    answer = staff.get(f"/admin/axes/accessattempt/{query}")
    assert answer.status_code == 200
    return answer.content.decode()


def rows_of(html: str) -> list[str]:
    return re.findall(r'<tr>\s*<td class="action-checkbox">.*?</tr>', html, re.S)


def test_a_staff_user_lifts_a_lockout_in_the_admin(admin_user: Any, page: str, clock: Any) -> None:
    fail_five_times(page, ip="10.0.0.1")
    fail_five_times(page, ip="10.0.0.3")
    Client().post(page, {"username": "admin", "password": "wrong"}, REMOTE_ADDR="10.0.0.4")
    lock_end = (timezone.now() + timedelta(minutes=15)).strftime("%Y-%m-%d %H:%M:%S")
    clock.shift(timedelta(minutes=2))

    # a staff user with no model permissions at all
    operator = get_user_model().objects.create_user("ops", "", PASSWORD, is_staff=True)
    staff = Client()
    staff.force_login(operator)
    assert "/admin/axes/accessattempt/" in staff.get("/admin/").content.decode()
    rows = rows_of(lockout_list(staff))
    assert len(rows) == 3
    locked_rows = rows_of(lockout_list(staff, "?locked=yes"))
    assert len(locked_rows) == 2 and all(lock_end in row for row in locked_rows)
    assert "10.0.0.4" in rows_of(lockout_list(staff, "?locked=no"))[0]

    chosen = AccessAttempt.objects.get(ip_address="10.0.0.1")
    lifted = staff.post(
        "/admin/axes/accessattempt/",
        {"action": "lift_lockouts", "_selected_action": [chosen.pk]},
        follow=True,
    )
    assert lifted.status_code == 200
    assert "Lifted: admin from 10.0.0.1." in lifted.content.decode()

    assert logs_in(page, ip="10.0.0.1")  # at once, well inside the cool-off
    assert log_in(Client(), page, PASSWORD, ip="10.0.0.3").status_code == 429  # not chosen
    entry = LogEntry.objects.get(action_flag=DELETION)
    assert entry.user == operator and entry.object_id == str(chosen.pk)


def test_deleting_rows_stays_with_axes_permissions(admin_user: Any) -> None:
    fail_five_times(PAGES[0])
    operator = get_user_model().objects.create_user("ops", "", PASSWORD, is_staff=True)
    staff = Client()
    staff.force_login(operator)
    page = lockout_list(staff)
    assert 'value="lift_lockouts"' in page
    assert 'value="delete_selected"' not in page
    chosen = AccessAttempt.objects.get()
    assert staff.post(f"/admin/axes/accessattempt/{chosen.pk}/delete/").status_code == 403
