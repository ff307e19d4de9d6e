"""Login lockouts in the admin (Axes › Access attempts): each username and client address with
failed logins, how many, and until when that pair is locked out; staff lift a lockout there at
once. Lifting forgets the pair's failures, so its next login counts from zero; every lift is
in the admin's history, under the staff user who did it.

django-axes registers its own list; this one replaces it (the admin package imports this
module, after axes' admin has loaded): its "locked out" column and filter counted failures
without the cool-off, and only users with axes' model permissions could see it, where every
staff user may lift a lockout (docs/operations.md, "Logins")."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from axes.admin import AccessAttemptAdmin
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone

from costboard.dashboards.lockout import lock_ends
from costboard.lockouts import Pair, lockout_rows, lockouts_lift, pairs_filter


def _is_staff(request: HttpRequest) -> bool:
    user = request.user
    return bool(user.is_active and user.is_staff)


def locked_pairs(now: datetime) -> set[Pair]:
    """The (username, address) pairs locked out at `now`."""
    rows = AccessAttempt.objects.filter(
        attempt_time__gte=now - settings.AXES_COOLOFF_TIME
    ).values_list("username", "ip_address", "failures_since_start")
    failures: dict[Pair, int] = {}
    for username, address, count in rows:
        failures[(username, address)] = failures.get((username, address), 0) + count
    return {pair for pair, total in failures.items() if total >= settings.AXES_FAILURE_LIMIT}


class LockedNowFilter(admin.SimpleListFilter):
    title = "locked out now"
    parameter_name = "locked"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Yes"), ("no", "No")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() not in ("yes", "no"):
            return queryset
        locked = pairs_filter(locked_pairs(timezone.now()))
        return queryset.filter(locked) if self.value() == "yes" else queryset.exclude(locked)


# axes ships no type hints: AccessAttemptAdmin is Any to mypy, subclassing it [misc]
class LoginLockoutAdmin(AccessAttemptAdmin):  # type: ignore[misc]
    list_display = [
        "username",
        "ip_address",
        "failures_since_start",
        "attempt_time",
        "locked_until",
        "path_info",
        "user_agent",
    ]
    list_filter = [LockedNowFilter, "path_info"]
    actions = ["lift_lockouts"]
    ordering = ["-attempt_time"]

    # every staff user sees the list and may lift; deleting rows stays with axes' permission
    def has_module_permission(self, request: HttpRequest) -> bool:
        return _is_staff(request) or super().has_module_permission(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _is_staff(request) or super().has_view_permission(request, obj)

    def has_lift_permission(self, request: HttpRequest) -> bool:
        return _is_staff(request)

    @admin.display(description="locked until (UTC)")
    def locked_until(self, obj: AccessAttempt) -> str:
        ends = lock_ends(obj.username, obj.ip_address, now=timezone.now())
        return ends.strftime("%Y-%m-%d %H:%M:%S") if ends else "—"

    @admin.action(
        description="Lift the lockout of the selected logins (forget their failures)",
        permissions=["lift"],
    )
    def lift_lockouts(self, request: HttpRequest, queryset: QuerySet[AccessAttempt]) -> None:
        pairs = sorted(
            set(queryset.values_list("username", "ip_address")),
            key=lambda pair: (pair[0] or "", pair[1] or ""),
        )
        rows = lockout_rows(pairs)
        self.log_deletions(request, rows)
        lockouts_lift(rows)
        named = ", ".join(f"{user or '(no username)'} from {address}" for user, address in pairs)
        self.message_user(
            request,
            f"Lifted: {named}. Their failed logins are forgotten; they may log in at once.",
            messages.SUCCESS,
        )


if admin.site.is_registered(AccessAttempt):  # unless AXES_ENABLE_ADMIN is off
    admin.site.unregister(AccessAttempt)
admin.site.register(AccessAttempt, LoginLockoutAdmin)
