"""Headless Chromium (Debian's `chromium` and `chromium-driver`) for the screenshot scripts."""

from __future__ import annotations


def start_browser(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
