"""Headless Chromium (Debian's /usr/bin/chromium, driven by Playwright) against the live admin.

Playwright's sync API keeps an event loop in this thread, so the ORM calls the tests make between browser steps
need DJANGO_ALLOW_ASYNC_UNSAFE (the live server answers from its own thread)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("REACH_CHROMIUM", "/usr/bin/chromium")
# `make screenshots` writes them to docs/screenshots (the README shows those); a plain test run keeps its own
# under .data/ so that running the tests leaves the checkout clean
BASE = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("REACH_SCREENSHOTS_DIR") or BASE / ".data" / "screenshots")
# flags from this machine kind's notes: its closed network refuses Chromium's background connections
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="session")
def browser():
    if not shutil.which(CHROMIUM):
        raise RuntimeError(f"{CHROMIUM} is missing: `make test` installs it (.ci/chromium.sh); `make test-fast` skips "
                           "the browser tests")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield browser
        browser.close()


@pytest.fixture
def login(browser, live_server):
    """A fresh browser context logged into the admin as ``username``."""
    contexts = []

    def as_user(username: str, password: str):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.goto(f"{live_server.url}/admin/login/")
        page.fill("#id_username", username)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_selector("#user-tools")
        return page

    yield as_user
    for context in contexts:
        context.close()


def shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
