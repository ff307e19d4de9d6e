from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from costboard.api import billing, context, metrics, period_budgets, reconciliation, spend
from costboard.api import events as api
from costboard.api import otlp as otlp_api
from costboard.api.boundary import methods
from costboard.dashboards.views import (
    actions,
    budgets,
    flagged,
    overview,
    reports,
    session,
    sessions,
    steps,
    users,
)
from costboard.dashboards.views import (
    reconciliation as reconciliation_views,
)
from memory_ui import api as memory_api

urlpatterns = [
    path("", overview.overview, name="overview"),
    path("sessions/", sessions.sessions_list, name="sessions"),
    path("sessions/export.csv", sessions.sessions_csv, name="sessions-csv"),
    path("sessions/<int:pk>/", session.session_page, name="session"),
    path("steps/", steps.steps_page, name="steps"),
    path("users/", users.users_page, name="users"),
    path("users/export.csv", users.users_csv, name="users-csv"),
    path("budgets/", budgets.budgets_page, name="budgets"),
    path("budgets/<int:pk>/", budgets.budget_page, name="budget"),
    path("reconciliation/", reconciliation_views.reconciliation_page, name="reconciliation"),
    path(
        "reconciliation/adjust/",
        reconciliation_views.reconciliation_adjust,
        name="reconciliation-adjust",
    ),
    path("reports/", reports.reports_page, name="reports"),
    path("reports/export.csv", reports.reports_csv, name="reports-csv"),
    path("flagged/", flagged.flagged_page, name="flagged"),
    path("flagged/<int:pk>/raise-cap/", actions.flagged_raise_cap, name="flagged-raise-cap"),
    path("flagged/<int:pk>/acknowledge/", actions.flagged_acknowledge, name="flagged-acknowledge"),
    path("memory/", include("memory_ui.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    # what a browser asks for on a page without an icon link (and what tools fetch): ours
    path("favicon.ico", overview.favicon, name="favicon"),
    path("api/v1/events", api.events, name="api-events"),
    path(
        "api/v1/sessions/<path:session_id>/budget",
        api.session_budget_view,
        name="api-session-budget",
    ),
    path(
        "api/v1/sessions/<path:session_id>/context",
        context.session_context_view,
        name="api-session-context",
    ),
    path(
        "api/v1/budgets",
        methods(period_budgets.budgets_list, period_budgets.budget_create),
        name="api-budgets",
    ),
    path(
        "api/v1/budgets/<int:budget_id>",
        methods(
            period_budgets.budget_read, period_budgets.budget_change, period_budgets.budget_delete
        ),
        name="api-budget",
    ),
    path("api/v1/spend", spend.spend, name="api-spend"),
    path("api/v1/billing", billing.billing, name="api-billing"),
    path("api/v1/reconciliation", reconciliation.reconciliation, name="api-reconciliation"),
    path("api/v1/openapi.json", api.openapi, name="api-openapi"),
    path("api/v1/docs", api.docs, name="api-docs"),
    path("api/v1/memory/candidates", memory_api.candidates, name="api-memory-candidates"),
    path("api/v1/memory/MEMORY.md", memory_api.memory_md, name="api-memory-md"),
    path("api/v1/memory/search", memory_api.search, name="api-memory-search"),
    path("api/v1/memory/feedback", memory_api.feedback, name="api-memory-feedback"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("v1/traces", otlp_api.traces, name="otlp-traces"),
]

# JSON under the API's paths, Django's pages elsewhere; a database outage is a 503
handler400 = "costboard.api.failures.bad_request"
handler403 = "costboard.api.failures.permission_denied"
handler404 = "costboard.api.failures.page_not_found"
handler500 = "costboard.api.failures.server_error"
