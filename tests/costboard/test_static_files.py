"""Static files as production serves them: collectstatic writes each under a content-hashed
name with gzip and brotli beside it, pages link the hashed names, and whitenoise answers those
with a year's immutable cache in the encoding the browser accepts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import brotli
import pytest
from django.conf import settings
from django.core.management import call_command
from django.template import Context, Template
from django.test import Client, override_settings

from costboard.static_storage import BROTLI_QUALITY

pytestmark = pytest.mark.django_db


@pytest.fixture
def collected(tmp_path: Path) -> Any:
    """The production storage over our static/ (the apps' and plotly's files, left out, would
    take minutes to brotli on a small machine; their finders list them the same way)."""
    with override_settings(
        STORAGES={
            **settings.STORAGES,
            "staticfiles": {"BACKEND": "costboard.static_storage.CompressedManifestStorage"},
        },
        STATIC_ROOT=tmp_path,
        STATICFILES_FINDERS=["django.contrib.staticfiles.finders.FileSystemFinder"],
        WHITENOISE_USE_FINDERS=False,
        WHITENOISE_AUTOREFRESH=False,
    ):
        call_command("collectstatic", interactive=False, verbosity=0)
        yield tmp_path


def test_collectstatic_writes_hashed_names_with_gzip_and_brotli(collected: Path) -> None:
    (css,) = list((collected / "costboard").glob("app.*.css"))
    assert re.fullmatch(r"app\.[0-9a-f]{12}\.css", css.name)
    for suffix in (".gz", ".br"):
        packed = css.with_name(css.name + suffix)
        assert packed.exists() and packed.stat().st_size < css.stat().st_size / 2
    linked = Template("{% load static %}{% static 'costboard/app.css' %}").render(Context())
    assert linked == f"/static/costboard/{css.name}"


def test_a_hashed_name_is_served_compressed_with_a_years_cache(collected: Path) -> None:
    (css,) = list((collected / "costboard").glob("app.*.css"))
    client = Client()  # its middleware, whitenoise's among them, made now: over STATIC_ROOT
    for encoding in ("br", "gzip"):
        response = client.get(
            f"/static/costboard/{css.name}", headers={"accept-encoding": f"{encoding}, deflate"}
        )
        assert response.status_code == 200
        assert response["Content-Encoding"] == encoding
        assert response["Cache-Control"] == "max-age=315360000, public, immutable"
    assert not (collected / "costboard" / "app.css").exists()  # only hashed names are kept


def test_an_unhashed_name_is_still_served_from_the_finders_with_a_short_cache(
    collected: Path,
) -> None:
    with override_settings(WHITENOISE_USE_FINDERS=True):
        plain = Client().get("/static/costboard/app.css")
    assert plain.status_code == 200
    assert plain["Cache-Control"] == "max-age=60, public"  # an unhashed name may change


def test_brotli_copies_are_packed_at_our_quality_and_unpack_to_the_file(collected: Path) -> None:
    hashed = [
        path
        for path in (collected / "costboard").iterdir()
        if re.fullmatch(r"[\w-]+\.[0-9a-f]{12}\.(css|js)", path.name)
    ]
    assert len(hashed) >= 4  # app.css, charts.js, review.js, api-docs.js
    for original in hashed:
        data = original.read_bytes()
        packed = original.with_name(original.name + ".br").read_bytes()
        assert brotli.decompress(packed) == data
        assert packed == brotli.compress(data, quality=BROTLI_QUALITY)
    assert BROTLI_QUALITY == 9


def test_plotly_loads_beside_the_page_not_before_it(admin_client: Client) -> None:
    """A page with charts is usable before plotly.js (4.8 MB) is parsed: it loads async and
    charts.js draws once it is there."""
    html = admin_client.get("/").content.decode()
    assert re.search(r'<script src="/static/plotly/plotly\.min\.js" async id="plotly-js">', html)
    assert '<script src="/static/costboard/charts.js" defer>' in html
