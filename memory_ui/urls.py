"""The memory pages, under /memory/ (included from costboard/urls.py)."""

from __future__ import annotations

from django.urls import path

from memory_ui import views

urlpatterns = [
    path("", views.browser_page, name="memory-browser"),
    path("review/", views.review_page, name="memory-review"),
    path("review/bulk/", views.review_bulk, name="memory-bulk"),
    path("metrics/", views.metrics_page, name="memory-metrics"),
    path("<int:pk>/", views.memory_detail, name="memory-detail"),
    path("<int:pk>/row/", views.memory_row, name="memory-row"),
    path("<int:pk>/similar/", views.memory_similar, name="memory-similar"),
    path("<int:pk>/approve/", views.memory_approve_view, name="memory-approve"),
    path("<int:pk>/reject/", views.memory_reject_view, name="memory-reject"),
    path("<int:pk>/edit/", views.memory_edit_view, name="memory-edit"),
    path("<int:pk>/expire/", views.memory_expire_view, name="memory-expire"),
]
