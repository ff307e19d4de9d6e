"""Serve plotly.js from the installed plotly package (never a CDN), as static/plotly/…"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import plotly
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PLOTLY_JS = "plotly.min.js"
PREFIX = "plotly/"


class PlotlyFinder(BaseFinder):
    """Finds only `plotly/plotly.min.js`, in plotly's package data."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.location = Path(plotly.__file__).parent / "package_data"
        self.storage = FileSystemStorage(location=str(self.location))
        self.storage.prefix = PREFIX.rstrip("/")  # type: ignore[attr-defined]

    def check(self, **kwargs: Any) -> list[Any]:
        return []

    def find(self, path: str, find_all: bool = False, **kwargs: Any) -> Any:
        if path == PREFIX + PLOTLY_JS:
            match = str(self.location / PLOTLY_JS)
            return [match] if find_all or kwargs.get("all") else match
        return [] if find_all or kwargs.get("all") else None

    def list(self, ignore_patterns: Any) -> Any:
        yield PLOTLY_JS, self.storage
