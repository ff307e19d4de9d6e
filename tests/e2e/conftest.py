"""A real Chromium (Debian's, never a downloaded one) driven by Playwright.

CI sets COSTBOARD_REQUIRE_BROWSER=1 and installs chromium, so there these tests always run; on
a machine without /usr/bin/chromium they are skipped with the reason (apt-get install
chromium).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.screenshot import CHROMIUM as DEBIAN_CHROMIUM
from devtools.screenshot import CHROMIUM_ARGS
from tests.waiting import wait_until

CHROMIUM = os.environ.get("COSTBOARD_CHROMIUM", DEBIAN_CHROMIUM)
TIMEOUT_MS = 15_000

# Playwright's sync API runs its own event loop; Django must allow ORM use beside it.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


# A module's browser, not the session's: Playwright's sync API keeps an event loop running in
# this thread while it is open, and under pytest-xdist the next test on this worker may be one
# that calls asyncio.run (the LiteLLM integration's), which refuses to run inside it.
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("COSTBOARD_REQUIRE_BROWSER") == "1":
            pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install chromium")
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium to run these)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Page:
    """A browser page that records every console error and page error."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.page, name)

    def wait_for_function(self, expression: str, timeout: float | None = None) -> Any:
        """Playwright's, polled from here: its own evaluates `expression` with eval inside the
        page, which the pages' Content-Security-Policy (rightly) forbids; `evaluate` goes
        through the DevTools protocol, which the policy does not govern."""
        seconds = (timeout or TIMEOUT_MS) / 1000
        return wait_until(lambda: self.page.evaluate(expression), what=expression, timeout=seconds)


@pytest.fixture
def page(browser: Any) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = Page(context.new_page())
    page.set_default_timeout(TIMEOUT_MS)
    yield page
    context.close()
