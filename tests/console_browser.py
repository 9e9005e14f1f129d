"""What the web console's browser tests share: headless Chromium (Debian's chromium and
chromium-driver) driven by selenium, a login through the page, and an element's text. Importing it
skips the importing test module (or the `browser` fixture's test) where selenium or Chromium is missing."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import orjson
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


def attack_page(console: str, path: str, body: dict[str, object]) -> bytes:
    """A page of another origin that posts `body` (JSON) to `path` of `console` as soon as it loads,
    first as a credentialed fetch, then as a form in its place (the text/plain JSON trick). The
    attacker's site: tests/conftest.py `attacker`."""
    sent = orjson.dumps(body).decode()
    name, value = sent[:-1] + ', "x": "', '"}'  # the form sends NAME=VALUE: together, the JSON body
    return f"""<!doctype html><html><body>
<form id="forged" method="post" action="{console}{path}" enctype="text/plain">
<input name='{name}' value='{value}'></form>
<p id="fetched">pending</p>
<script>
const sent = () => {{ document.getElementById("fetched").textContent = "sent";
  setTimeout(() => document.getElementById("forged").submit(), 300); }};  // then the form, in the page's place
fetch("{console}{path}", {{method: "POST", credentials: "include", mode: "no-cors",
  headers: {{"Content-Type": "text/plain"}}, body: '{sent}'}}).then(sent, sent);
</script></body></html>""".encode()


def forge(browser, attacker: tuple, console: str, path: str, body: dict[str, object]) -> None:  # noqa: ANN001
    """The logged-in operator's browser opens the attacker's site, whose page posts `body` to `path` of
    `console` (`attack_page`); returns once the console has refused the form (the fetch before it is
    refused the same way, unseen)."""
    site, set_page = attacker
    set_page(attack_page(console, path, body))
    browser.get(site + "/")
    wait_for(lambda: browser.current_url.startswith(console + "/api/"), 10, "the forged form posted (after the fetch)")
    wait_for(lambda: "is not this endpoint" in browser.find_element("tag name", "body").text, 10,
             "the forged form's refusal")
