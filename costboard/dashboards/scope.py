"""Which projects a request may see, and which one it chose.

Staff see every project; other users the projects they are members of. The choice travels in
the URL (`?project=<slug>`), so every link and every shared URL keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet
from django.http import Http404, HttpRequest

from costboard.models import Project


def projects_visible(user: AbstractBaseUser | AnonymousUser) -> QuerySet[Project]:
    if not user.is_authenticated:
        return Project.objects.none()
    if getattr(user, "is_staff", False):
        return Project.objects.order_by("name")
    return Project.objects.filter(memberships__user_id=user.pk).order_by("name")


@dataclass(frozen=True)
class Scope:
    projects: list[Project]  # every project the user may see, for the switcher
    current: Project | None  # the chosen one; None: all of them

    @property
    def project_ids(self) -> list[int]:
        if self.current is not None:
            return [self.current.pk]
        return [p.pk for p in self.projects]

    @property
    def query(self) -> str:
        """`?project=<slug>` to append to links, or ''."""
        return f"?{urlencode({'project': self.current.slug})}" if self.current else ""

    @property
    def slug(self) -> str:
        return self.current.slug if self.current else ""


def scope_for(request: HttpRequest) -> Scope:
    """The request's scope (one query). An unknown or invisible project is a 404, so a URL never
    tells whether another team's project exists."""
    projects = list(projects_visible(request.user))
    slug = request.GET.get("project", "")
    if not slug:
        return Scope(projects=projects, current=None)
    for project in projects:
        if project.slug == slug:
            return Scope(projects=projects, current=project)
    raise Http404("no such project")
