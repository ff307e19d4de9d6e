"""Server-rendered pages (CONTRACT §6)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from costboard import selectors
from costboard.models import Project


@login_required
def overview(request: HttpRequest) -> HttpResponse:
    projects = Project.objects.all()
    today = timezone.now().date()
    context = {
        "spend": selectors.spend_by_period(projects=projects, today=today),
        "sessions": selectors.sessions_latest(projects=projects),
        "unpriced": (selectors.models_unpriced(projects=projects) if request.user.is_staff else []),
    }
    return render(request, "costboard/overview.html", context)
