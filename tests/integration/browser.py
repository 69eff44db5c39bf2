"""Headless Chromium for the page tests (the monitor's, the chat page's), through selenium.

Needs Debian's `chromium` and `chromium-driver` (scripts/test.sh installs them where it may);
`skip_without_chromium()` skips a test module on a machine without them.
"""

from __future__ import annotations

import shutil
import time

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def skip_without_chromium() -> None:
    pytest.importorskip("selenium.webdriver")
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip(
            "needs chromium and chromedriver (apt-get install chromium chromium-driver)",
            allow_module_level=True,
        )


def start_browser(width: int = 1400, height: int = 1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def wait_for(condition, timeout: float, what: str):
    """`condition()`'s first truthy value within `timeout` s; an exception counts as not yet (the
    page may be mid-redraw, or the server not up yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
            if value:
                return value
        except Exception:
            value = None
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


requires_chromium = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="needs chromium and chromedriver (apt-get install chromium chromium-driver)",
)
