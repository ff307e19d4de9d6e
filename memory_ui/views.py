"""The memory pages (docs/memory.md, "Review and permissions"): the review queue, the memory browser
with MEMORY.md's preview, one memory's history, and the metrics. Login required, scoped to the
user's projects like every page; approving, editing, rejecting and expiring need staff or the
`memory_ui.review_memory` permission (the Reviewers group), and always go through services, which
write the history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, PermissionsMixin
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from costboard.dashboards.params import Checks
from costboard.dashboards.row_ids import is_row_id
from costboard.dashboards.scope import Scope, scope_for
from costboard.dashboards.views.shared import HtmxHttpRequest
from costboard.models import Project
from memory_ui import cleaners, memory_file, selectors
from memory_ui.forms import LABELS, MemoryEditForm
from memory_ui.models import Memory, MemoryEvent
from memory_ui.writes import decisions

SECTIONS_PER_PAGE = 5  # the browser's scopes per page: each has its MEMORY.md preview
PER_GROUP = 10  # memories shown per type in a scope before "more"
SEARCH_RESULTS = 50


def can_review_memory(user: AbstractBaseUser | AnonymousUser) -> bool:
    """Approving, editing, rejecting and expiring: staff, or the review_memory permission
    (the Reviewers group holds it)."""
    if getattr(user, "is_staff", False):
        return True
    return isinstance(user, PermissionsMixin) and user.has_perm("memory_ui.review_memory")


def _type(checks: Checks) -> str:
    return checks.choice("type", Memory.Type.values, what="a memory type", blank="every type")


def _memory_scope(checks: Checks) -> str:
    return checks.pattern(
        "scope", cleaners.SCOPE, what="a memory scope: project, or user:<id> (e.g. user:ann)"
    )


def _memory_in_scope(scope: Scope, pk: int) -> Memory:
    memory = selectors.memory_in_projects(pk=pk, project_ids=scope.project_ids)
    if memory is None:
        raise Http404("no such memory")
    return memory


def _acting_on(request: HttpRequest, pk: int) -> tuple[Scope, Memory]:
    """The memory an action is for: 403 without the right to review, 404 outside the scope."""
    if not can_review_memory(request.user):
        raise PermissionDenied("Deciding on memories needs staff or the Reviewers group.")
    scope = scope_for(request)
    return scope, _memory_in_scope(scope, pk)


def _back(request: HttpRequest, name: str) -> HttpResponseRedirect:
    """After a plain (JavaScript-free) form: back to the page, its filters kept."""
    url = reverse(name)
    query = request.GET.urlencode()
    return HttpResponseRedirect(f"{url}?{query}" if query else url, status=303)


# --- the review queue -----------------------------------------------------------------------


@dataclass(frozen=True)
class CandidateRow:
    memory: Memory
    sentence: str
    can_act: bool
    form: MemoryEditForm | None = None  # the edit form, open


def _rows(
    memories: list[Memory], *, can_act: bool, form_for: tuple[int, MemoryEditForm] | None = None
) -> list[CandidateRow]:
    return [
        CandidateRow(
            memory=m,
            sentence=selectors.candidate_sentence(m),
            can_act=can_act,
            form=form_for[1] if form_for and form_for[0] == m.pk else None,
        )
        for m in memories
    ]


def _review_context(request: HttpRequest, scope: Scope, *, note: str = "") -> dict[str, Any]:
    """The queue's context; `filter_errors` names its bad parameters (after a bulk decision
    the page may have emptied: the list's nearest page is shown, unnamed)."""
    checks = Checks(request.GET)
    type = _type(checks)
    memory_scope = _memory_scope(checks)
    ids = scope.project_ids
    pending = selectors.memories_pending(project_ids=ids, type=type, scope=memory_scope)
    paginator = Paginator(pending, selectors.REVIEW_PAGE_SIZE)
    if request.method == "GET":
        page = checks.page(paginator)
    else:
        page = paginator.get_page(request.GET.get("page"))
    can_act = can_review_memory(request.user)
    counts = selectors.pending_counts(project_ids=ids, scope=memory_scope)
    return {
        "scope": scope,
        "page": page,
        "rows": _rows(list(page), can_act=can_act),
        "counts": counts,
        "type": type,
        "memory_scope": memory_scope,
        "can_act": can_act,
        "note": note,
        "nav_pending": None if memory_scope else counts.total,
        "filter_errors": checks.errors,
    }


@login_required
def review_page(request: HtmxHttpRequest) -> HttpResponse:
    """Pending candidates, newest first, 50 a page, with counts by type and filters by type
    and scope; htmx asks for the list alone."""
    scope = scope_for(request)
    context = _review_context(request, scope)
    template = "memory_ui/review.html"
    if request.htmx:
        template += "#queue"
    else:
        context["scopes"] = selectors.pending_scopes(project_ids=scope.project_ids)
        context["types"] = Memory.Type.values
    return render(request, template, context, status=422 if context["filter_errors"] else 200)


def _counts_context(request: HttpRequest, scope: Scope) -> dict[str, Any]:
    checks = Checks(request.GET)  # the page's own filters, checked when it was shown
    memory_scope = _memory_scope(checks)
    return {
        "counts": selectors.pending_counts(project_ids=scope.project_ids, scope=memory_scope),
        "type": _type(checks),
        "oob": True,
    }


def _lost(action: str, memory: Memory) -> str:
    """What a reviewer is told whose decision came second: theirs was not applied, and who
    decided first."""
    who = memory.decided_by.get_username() if memory.decided_by else "someone"
    return f"Your {action} was not applied: {who} {memory.status} it first."


def _decided(
    request: HtmxHttpRequest,
    scope: Scope,
    memory: Memory,
    *,
    error: str = "",
    lost: str = "",
    redacted: str = "",
) -> HttpResponse:
    """A decided candidate's row: a one-line notice, and the counts brought up to date."""
    if not request.htmx:
        return _back(request, "memory-review")
    context = {
        "scope": scope,
        "memory": memory,
        "error": error,
        "lost": lost,
        "redacted": redacted,
        **_counts_context(request, scope),
    }
    return render(request, "memory_ui/_candidate_done.html", context)


@login_required
@require_POST
def memory_approve_view(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    scope, memory = _acting_on(request, pk)
    try:
        # a candidate that contradicts live memories supersedes them, unless "Keep both"
        keep_both = request.POST.get("keep") == "both"
        memory = decisions.memory_approve(memory, by=request.user, keep_both=keep_both)
    except decisions.DecisionError:
        memory.refresh_from_db()
        return _decided(
            request, scope, memory, error=f"already {memory.status}", lost=_lost("approve", memory)
        )
    return _decided(request, scope, memory)


@login_required
@require_POST
def memory_reject_view(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    scope, memory = _acting_on(request, pk)
    try:
        memory = decisions.memory_reject(memory, by=request.user)
    except decisions.DecisionError:
        memory.refresh_from_db()
        return _decided(
            request, scope, memory, error=f"already {memory.status}", lost=_lost("reject", memory)
        )
    return _decided(request, scope, memory)


PAST = {"approve": "Approved", "reject": "Rejected"}


@login_required
@require_POST
def review_bulk(request: HtmxHttpRequest) -> HttpResponse:
    """Approve or reject the checked candidates (at most a page of them); the list comes
    back without them."""
    if not can_review_memory(request.user):
        raise PermissionDenied("Deciding on memories needs staff or the Reviewers group.")
    scope = scope_for(request)
    action = request.POST.get("action", "")
    if action not in decisions.DECISIONS:
        return HttpResponse('action: "approve" or "reject"', status=400)
    ids = [int(v) for v in request.POST.getlist("ids") if is_row_id(v)]
    result = decisions.candidates_decide(
        ids=ids,
        decision=action,
        by=request.user,
        project_ids=scope.project_ids,
        at_most=selectors.REVIEW_PAGE_SIZE,
    )
    done, skipped = len(result.decided), len(result.skipped)
    if not ids:
        note = "Select candidates first (the checkboxes, or Select all)."
    else:
        note = f"{PAST[action]} {done} candidate{'s' if done != 1 else ''}."
        if skipped:
            note += f" {skipped} skipped: already decided or not in this project."
    if not request.htmx:
        return _back(request, "memory-review")
    context = _review_context(request, scope, note=note)
    return render(request, "memory_ui/review.html#queue", context)


def _edit_response(
    request: HtmxHttpRequest, scope: Scope, memory: Memory, form: MemoryEditForm, status: int
) -> HttpResponse:
    context: dict[str, Any] = {"scope": scope, "memory": memory, "form": form}
    if request.htmx:
        if memory.status == Memory.Status.PENDING:
            [row] = _rows([memory], can_act=True, form_for=(memory.pk, form))
            context["row"] = row
            return render(request, "memory_ui/_candidate.html", context, status=status)
        return render(request, "memory_ui/_memory_item.html", context, status=status)
    return render(request, "memory_ui/edit.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def memory_edit_view(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """GET: the inline edit form. POST: save; a pending candidate is approved with it (unless
    "Save without approving"); refused input comes back as the form with its errors (422)."""
    scope, memory = _acting_on(request, pk)
    if request.method == "GET":
        return _edit_response(request, scope, memory, MemoryEditForm.for_memory(memory), 200)
    form = MemoryEditForm(request.POST)
    approve = memory.status == Memory.Status.PENDING and "save_only" not in request.POST
    if form.is_valid():
        try:
            memory = decisions.memory_edit(
                memory, fields=form.memory_fields(), by=request.user, approve=approve
            )
        except decisions.DecisionError:
            memory.refresh_from_db()
            form.add_error(None, f"This memory is {memory.status} now: it was decided meanwhile.")
        except cleaners.MemoryInputError as error:  # another memory says it (memory_edit)
            form.add_error(error.field, f"{LABELS[error.field]}: {error.message}.")
    if form.errors:
        return _edit_response(request, scope, memory, form, 422)
    # what was typed is stored redacted, as a proposal is: the reviewer is told, not left unaware
    redacted = redacted_notice(form.memory_fields().redactions)
    if memory.status == Memory.Status.APPROVED and approve:
        if not request.htmx and redacted:
            messages.warning(request, redacted)
        return _decided(request, scope, memory, redacted=redacted)
    if not request.htmx:
        if redacted:
            messages.warning(request, redacted)
        return _back(request, "memory-review" if memory.status == "pending" else "memory-browser")
    return _row(request, scope, memory, saved=True, redacted=redacted)


def redacted_notice(kinds: tuple[str, ...]) -> str:
    if not kinds:
        return ""
    return (
        f"Redacted before saving: {', '.join(kinds)}. "
        "A secret does not belong in a memory: every agent reads it."
    )


def _row(request: HtmxHttpRequest, scope: Scope, memory: Memory, **extra: Any) -> HttpResponse:
    """A memory's row as it shows: a queue row when pending, a browser item otherwise."""
    context: dict[str, Any] = {"scope": scope, "memory": memory, **extra}
    if memory.status == Memory.Status.PENDING:
        [row] = _rows([memory], can_act=can_review_memory(request.user))
        context["row"] = row
        return render(request, "memory_ui/_candidate.html", context)
    context["can_act"] = can_review_memory(request.user)
    return render(request, "memory_ui/_memory_item.html", context)


@login_required
def memory_similar(request: HttpRequest, pk: int) -> HttpResponse:
    """A candidate's "Similar approved" aside, which the queue loads as the card comes into
    view: the page of 50 renders without 50 trigram lookups, each card's when it is seen."""
    scope = scope_for(request)
    memory = _memory_in_scope(scope, pk)
    similar = selectors.similar_memories(
        memory.project,
        memory.scope,
        memory.content,
        exclude=memory.pk,
        statuses=(Memory.Status.APPROVED,),
        limit=selectors.SIMILAR_SHOWN,
    )
    context = {"scope": scope, "memory": memory, "similar": similar}
    return render(request, "memory_ui/_similar.html", context)


@login_required
def memory_row(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """The row again (an edit cancelled)."""
    scope = scope_for(request)
    memory = _memory_in_scope(scope, pk)
    if not request.htmx:
        return HttpResponseRedirect(reverse("memory-detail", args=[pk]) + scope.query)
    return _row(request, scope, memory)


# --- the memory browser ---------------------------------------------------------------------


@dataclass(frozen=True)
class Section:
    """One scope of one project: its memories by type and its MEMORY.md."""

    project: Project
    scope: str
    count: int
    groups: list[selectors.TypeGroup]
    md: memory_file.MemoryMd

    @property
    def md_lines_pct(self) -> int:
        return min(100, self.md.lines * 100 // memory_file.MEMORY_MD_LINES)

    @property
    def md_bytes_pct(self) -> int:
        return min(100, self.md.bytes * 100 // memory_file.MEMORY_MD_BYTES)


@login_required
def browser_page(request: HtmxHttpRequest) -> HttpResponse:
    """Approved memories by scope and type, each scope with its MEMORY.md preview (what the
    agent reads, and what the caps cut); a search box; edit and expire in place."""
    scope = scope_for(request)
    params = request.GET
    checks = Checks(params)
    type = _type(checks)
    memory_scope = _memory_scope(checks)
    q = params.get("q", "").strip()[:200]
    ids = scope.project_ids
    context: dict[str, Any] = {
        "scope": scope,
        "type": type,
        "types": Memory.Type.values,
        "memory_scope": memory_scope,
        "q": q,
        "can_act": can_review_memory(request.user),
        "md_lines_cap": memory_file.MEMORY_MD_LINES,
        "md_bytes_cap": memory_file.MEMORY_MD_BYTES,
    }
    if q:
        # one project: ranked as the agent's search ranks (one scope, "project" unless chosen);
        # across projects, where ranking does not apply: the words, in MEMORY.md's order
        project = scope.current or (scope.projects[0] if len(scope.projects) == 1 else None)
        if project is not None:
            ranked_scope = memory_scope or "project"
            # never refused: q is short, and a NUL never reaches a page (costboard/query_text.py)
            search = cleaners.Search.of(query=q, scope=ranked_scope, k=selectors.RANKED_SHOWN)
            context["ranked"] = selectors.memories_ranked(project=project, search=search, type=type)
            context["ranked_scope"] = ranked_scope
        else:
            found = selectors.memories_search(project_ids=ids, q=q, type=type, scope=memory_scope)
            context["results"] = checks.page(Paginator(found, SEARCH_RESULTS))
    else:
        context.update(_sections(scope, checks, type=type, memory_scope=memory_scope))
    context["filter_errors"] = checks.errors
    template = "memory_ui/browser.html"
    if request.htmx:
        template += "#browser"
    return render(request, template, context, status=checks.status)


def _sections(scope: Scope, checks: Checks, *, type: str, memory_scope: str) -> dict[str, Any]:
    sections = selectors.scope_sections(
        project_ids=scope.project_ids, type=type, scope=memory_scope
    )
    # one group asked for ("more"): all of it, 50 a page, instead of the first ten
    focused = bool(scope.current and type and memory_scope)
    page = (
        Paginator(sections, SECTIONS_PER_PAGE).page(1)
        if focused
        else checks.page(Paginator(sections, SECTIONS_PER_PAGE))
    )
    pairs = [(row["project_id"], row["scope"]) for row in page]
    projects = {p.pk: p for p in scope.projects}
    groups = selectors.type_groups(sections=pairs, type=type, per_group=0 if focused else PER_GROUP)
    group_page = None
    if focused and pairs:
        [only] = pairs
        group = selectors.memories_approved(
            project_ids=[only[0]], type=type, scope=only[1]
        ).order_by(*selectors.GROUP_ORDER)
        group_page = checks.page(Paginator(group, selectors.REVIEW_PAGE_SIZE))
        for g in groups.get(only, []):
            g.memories = list(group_page)
    built = [
        Section(
            project=projects[row["project_id"]],
            scope=row["scope"],
            count=row["n"],
            groups=groups.get((row["project_id"], row["scope"]), []),
            md=memory_file.memory_md(projects[row["project_id"]], row["scope"]),
        )
        for row in page
    ]
    return {"sections": built, "page": page, "focused": focused, "group_page": group_page}


@login_required
@require_POST
def memory_expire_view(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    scope, memory = _acting_on(request, pk)
    try:
        memory = decisions.memory_expire(memory, by=request.user, note="expired on /memory/")
    except decisions.DecisionError:
        memory.refresh_from_db()
    if not request.htmx:
        return _back(request, "memory-browser")
    return _row(request, scope, memory, acted=True)


# --- one memory -----------------------------------------------------------------------------


@login_required
def memory_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A memory's history: proposed, approved, every edit with before and after, expiry,
    merges."""
    scope = scope_for(request)
    memory = _memory_in_scope(scope, pk)
    events = selectors.memory_history(memory)
    context = {
        "scope": scope,
        "memory": memory,
        "events": events,
        "targets": selectors.memory_targets(memory),
        "merged_from": selectors.memory_merged_from(memory),
        "contradicts": selectors.memory_contradicts(memory),
        "supersedes": selectors.memory_supersedes(memory),
        "proposed_by": memory.proposed_by or _actor(events, "proposed"),
        "decided_by": (
            memory.decided_by.get_username()
            if memory.decided_by
            else _actor(events, "approved", "rejected", last=True)
        ),
        "can_act": can_review_memory(request.user),
        "sentence": selectors.candidate_sentence(memory),
    }
    return render(request, "memory_ui/detail.html", context)


def _actor(events: list[MemoryEvent], *actions: str, last: bool = False) -> str:
    chosen = [e for e in events if e.action in actions]
    if not chosen:
        return ""
    return (chosen[-1] if last else chosen[0]).actor_name


# --- metrics --------------------------------------------------------------------------------


@login_required
def metrics_page(request: HttpRequest) -> HttpResponse:
    scope = scope_for(request)
    now = timezone.now()
    metrics = selectors.memory_metrics(project_ids=scope.project_ids, now=now)
    context = {
        "scope": scope,
        "m": metrics,
        "now": now,
        "days": selectors.METRICS_DAYS,
        "oldest_age": now - metrics.oldest_pending if metrics.oldest_pending else None,
    }
    return render(request, "memory_ui/metrics.html", context)
