"""What providers bill, in the admin (docs/billing.md): the billed rows (read-only, with a CSV
upload beside them, through the same checks and service as POST /api/v1/billing) and the
mapping of a provider's projects or workspaces to Costboard projects, whose saves move the
imported rows they name."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import URLPattern, path, reverse

from costboard.admin.forms import BillingCsvForm
from costboard.admin.site import ReadOnlyAdmin
from costboard.billing import services as billing_services
from costboard.billing.uploads import UploadError, rows_from_csv
from costboard.models import BilledUsage, BillingDrift, ProviderProject

MAX_UPLOAD = 5 * 1024 * 1024
ERRORS_SHOWN = 20


@admin.register(ProviderProject)
class ProviderProjectAdmin(admin.ModelAdmin[ProviderProject]):
    list_display = ("provider", "external_id", "project", "note")
    list_filter = ("provider",)
    search_fields = ("external_id", "note", "project__slug", "project__name")

    def save_model(
        self, request: HttpRequest, obj: ProviderProject, form: Any, change: bool
    ) -> None:
        moved = billing_services.provider_project_save(obj)
        messages.info(request, f"{moved} imported billed rows now belong to {obj.project}.")

    def delete_model(self, request: HttpRequest, obj: ProviderProject) -> None:
        billing_services.provider_project_delete(obj)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ProviderProject]) -> None:
        for mapping in list(queryset):
            billing_services.provider_project_delete(mapping)


@admin.register(BilledUsage)
class BilledUsageAdmin(ReadOnlyAdmin[BilledUsage]):
    change_list_template = "admin/costboard/billedusage/change_list.html"
    list_display = (
        "day",
        "provider",
        "source",
        "model",
        "line_item",
        "provider_project",
        "project",
        "service_tier",
        "cost_usd",
        "input_tokens",
        "output_tokens",
    )
    list_filter = ("provider", "source", "service_tier")
    search_fields = ("model", "line_item", "provider_project")
    date_hierarchy = "day"
    list_select_related = ("project",)
    list_per_page = 100

    def get_urls(self) -> list[URLPattern]:
        upload = path(
            "upload-csv/",
            self.admin_site.admin_view(self.upload_view),
            name="costboard_billedusage_upload",
        )
        return [upload, *super().get_urls()]

    def upload_view(self, request: HttpRequest) -> HttpResponse:
        """A CSV bill: its rows stored with source csv, or every fault listed and nothing
        stored."""
        if not request.user.has_perm("costboard.add_billedusage"):
            return HttpResponse(
                "Uploading a bill needs the add billed usage permission.", status=403
            )
        errors: list[str] = []
        form = BillingCsvForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            upload = form.cleaned_data["file"]
            project = form.cleaned_data["project"]
            try:
                if upload.size > MAX_UPLOAD:
                    raise UploadError(
                        [{"index": None, "field": "file", "message": "larger than 5 MB: split it"}]
                    )
                try:
                    text = upload.read().decode("utf-8")
                except UnicodeDecodeError:
                    raise UploadError(
                        [{"index": None, "field": "file", "message": "not UTF-8: save it as UTF-8"}]
                    ) from None
                rows = rows_from_csv(text, default_project=project)
            except UploadError as exc:
                errors = [_error_line(error) for error in exc.errors[:ERRORS_SHOWN]]
                if len(exc.errors) > ERRORS_SHOWN:
                    errors.append(f"… and {len(exc.errors) - ERRORS_SHOWN} more")
            else:
                done = billing_services.billing_rows_replace(rows, source=BilledUsage.Source.CSV)
                messages.success(
                    request,
                    f"Stored {done.stored} billed rows ({done.replaced} uploaded before for the "
                    f"same days and providers replaced).",
                )
                return HttpResponseRedirect(reverse("admin:costboard_billedusage_changelist"))
        context = {
            **self.admin_site.each_context(request),
            "title": "Upload a CSV bill",
            "form": form,
            "errors": errors,
            "opts": self.model._meta,
        }
        return render(request, "admin/costboard/billedusage/upload.html", context)


def _error_line(error: dict[str, Any]) -> str:
    where = "the file" if error["index"] is None else f"row {error['index'] + 1}"
    return f"{where}, {error['field']}: {error['message']}"


@admin.register(BillingDrift)
class BillingDriftAdmin(ReadOnlyAdmin[BillingDrift]):
    """The provider-days billed past a project's drift threshold, each alerted once."""

    list_display = (
        "day",
        "provider",
        "project",
        "estimated_cost_usd",
        "billed_cost_usd",
        "drift_usd",
        "drift_pct",
        "threshold_pct",
        "at",
    )
    list_filter = ("provider", "project")
    date_hierarchy = "day"
