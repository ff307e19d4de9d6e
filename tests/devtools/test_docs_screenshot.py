"""`manage.py docs_screenshot`: the README's picture of the overview, shot in Debian's Chromium
from the pages of a seeded database (skipped without /usr/bin/chromium unless CI requires it)."""

from __future__ import annotations

import os
import struct
import zlib
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

CHROMIUM = os.environ.get("COSTBOARD_CHROMIUM", "/usr/bin/chromium")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def needs_chromium() -> None:
    if not Path(CHROMIUM).exists():
        if os.environ.get("COSTBOARD_REQUIRE_BROWSER") == "1":
            pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium to run this)")


def png_read(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the decompressed scanlines of a PNG (its chunks, no imaging library)."""
    assert data.startswith(PNG_SIGNATURE), "not a PNG"
    offset, size, pixels = len(PNG_SIGNATURE), (0, 0), b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind = data[offset + 4 : offset + 8]
        body = data[offset + 8 : offset + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            pixels += body
        offset += 12 + length
    return size[0], size[1], zlib.decompress(pixels)


def shoot(output: Path, **options: object) -> str:
    out = StringIO()
    call_command("docs_screenshot", output=str(output), chromium=CHROMIUM, stdout=out, **options)
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_it_shoots_the_overview_of_a_seeded_database_as_a_png_of_the_asked_size(
    tmp_path: Path,
) -> None:
    needs_chromium()
    call_command("seed_demo", sessions=12, stdout=StringIO())
    output = tmp_path / "shots" / "overview.png"

    said = shoot(output, width=1200, height=700)

    width, height, pixels = png_read(output.read_bytes())
    assert (width, height) == (1200, 700)
    assert len(set(pixels)) > 64, "a blank page: nothing was drawn"
    assert "'Overview · Costboard'" in said  # the page itself, not the login form
    charts = int(said.split(" charts drawn")[0].rsplit(", ", 1)[-1])
    assert charts >= 3  # the daily, step-type and token-kind charts at least, drawn


def test_png_read_refuses_what_is_not_a_png() -> None:
    with pytest.raises(AssertionError, match="not a PNG"):
        png_read(b"GIF89a")


@pytest.mark.django_db
def test_it_refuses_an_empty_database_before_starting_a_browser(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="seed_demo"):
        shoot(tmp_path / "overview.png")
    assert not (tmp_path / "overview.png").exists()


@pytest.mark.django_db
def test_it_refuses_a_path_that_is_not_a_page_path(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="must start with /"):
        shoot(tmp_path / "overview.png", path="steps/")
