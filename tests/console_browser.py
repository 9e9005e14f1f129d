"""What the web console's browser tests share: headless Chromium (Debian's chromium and
chromium-driver) driven by selenium, a login through the page, and an element's text. Importing it
skips the importing test module (or the `browser` fixture's test) where selenium or Chromium is missing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from tests.conftest import wait_for
from tests.console import ADMIN

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
    pytest.skip(f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {CHROMEDRIVER})", allow_module_level=True)

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402  after the skip: only with selenium


def chromium() -> Iterator:
    """The driver, quit when the test is over (tests/conftest.py's `browser` fixture)."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--window-size=1000,900", "--disable-gpu"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


def log_in(browser, url: str, password: str) -> None:  # noqa: ANN001  selenium's driver
    browser.get(url + "/")
    wait_for(lambda: browser.current_url == url + "/login", 10, "the redirect to the login page")
    browser.find_element(By.ID, "user").send_keys(ADMIN)
    browser.find_element(By.ID, "password").send_keys(password)
    browser.find_element(By.ID, "submit").click()


def text(browser, element_id: str) -> str:  # noqa: ANN001
    """The element's text; "" while the page that has it is still loading."""
    try:
        return browser.find_element(By.ID, element_id).text
    except (NoSuchElementException, StaleElementReferenceException):
        return ""
