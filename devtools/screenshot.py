"""The screenshot behind `manage.py docs_screenshot`: a page of this database, as a staff user
sees it, drawn by Debian's Chromium and written as a PNG (the README's picture of the overview).

The pages are served in this process by Django's threaded development server on a free
127.0.0.1 port (static files from the finders, by their plain names, so no `collectstatic`
is needed); the browser gets a staff user's session cookie, opens the page and waits until
every chart on it is drawn. Chromium is the system's (`apt-get install chromium`), never one
Playwright downloads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.core.wsgi import get_wsgi_application
from django.test import Client
from django.test.utils import override_settings

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
USERNAME = "docs-screenshot"  # a staff login with no password: it only ever logs in here
PLAIN_STATIC = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}
# every [data-chart] element holds Plotly's drawing once charts.js has run
# a chart not drawn yet: waited for with a selector, since a page's CSP forbids the eval that
# waiting on a JavaScript expression (page.wait_for_function) needs
UNDRAWN_CHART = "[data-chart]:not(:has(svg.main-svg))"


@dataclass(frozen=True)
class Shot:
    """What was shot: the page's title and address, and how many charts it drew."""

    title: str
    url: str
    charts: int


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a line per static file would bury the command's one line of output


def staff_session_cookie() -> tuple[str, str]:
    """The session cookie (name, value) of a staff user, made if missing: staff see every
    project, as the README's overview should."""
    users = get_user_model()
    user = users.objects.filter(username=USERNAME).first()
    if user is None:
        user = users(username=USERNAME, is_staff=True, is_superuser=True)
        user.set_unusable_password()
        user.save()
    if not (user.is_staff and user.is_superuser):
        raise ValueError(f"user {USERNAME!r} exists and is not staff: rename it or make it staff")
    if user.has_usable_password():
        raise ValueError(f"user {USERNAME!r} has a password: it is not this command's login")
    client = Client()
    client.force_login(user)
    name = settings.SESSION_COOKIE_NAME
    return name, client.cookies[name].value


@contextmanager
def pages_served() -> Iterator[str]:
    """This process's pages on a free 127.0.0.1 port, in threads; yields the base URL."""
    hosts = [*settings.ALLOWED_HOSTS, "127.0.0.1"]
    with override_settings(
        ALLOWED_HOSTS=hosts, STORAGES={**settings.STORAGES, "staticfiles": PLAIN_STATIC}
    ):
        server = ThreadedWSGIServer(("127.0.0.1", 0), _QuietHandler, allow_reuse_address=False)
        server.set_app(StaticFilesHandler(get_wsgi_application()))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)


def page_shoot(
    *,
    output: Path,
    path: str = "/",
    width: int = 1400,
    height: int = 900,
    chromium: str = CHROMIUM,
    timeout_ms: int = 30_000,
) -> Shot:
    """Write a PNG of `path` as a staff user sees it, `width` × `height` CSS pixels."""
    if not Path(chromium).exists():
        raise ValueError(f"no Chromium at {chromium}: apt-get install chromium")
    from playwright.sync_api import sync_playwright  # a dev dependency: only here

    # the ORM before Playwright: its sync API runs an event loop in this thread
    cookie_name, cookie_value = staff_session_cookie()
    output.parent.mkdir(parents=True, exist_ok=True)
    with pages_served() as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            context.add_cookies([{"name": cookie_name, "value": cookie_value, "url": base}])
            page = context.new_page()
            page.set_default_timeout(timeout_ms)
            page.goto(base + path, wait_until="load")
            if "/accounts/login/" in page.url:
                raise ValueError(f"{path} asked for a login: the staff session was refused")
            page.locator(UNDRAWN_CHART).first.wait_for(state="detached")
            charts = page.locator("[data-chart] svg.main-svg").count()
            page.screenshot(path=str(output), type="png")
            return Shot(title=page.title(), url=page.url.removeprefix(base), charts=charts)
        finally:
            browser.close()
