"""Finding things in a real browser (headless Chromium, as tests/test_console_browser.py, issue 37): an
operator finds a client's subscriptions on the Subscriptions page and follows the client id to its page,
then traces that client id on the Trace page, sees its messages (not another client's on the same
topic) and downloads them as a file. A client id and a filter with HTML in them show as text."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, console_broker, joined, session
from tests.console_browser import By, log_in, text  # skips the module without selenium and chromium
from tests.mqtt import Client
from tests.steps import uid

FETCH = """const done = arguments[arguments.length - 1];
fetch(document.getElementById("download").href).then(
  async answer => done([answer.headers.get("Content-Disposition"), await answer.text()]));"""


def test_an_operator_finds_a_clients_subscriptions_and_traces_it(start_broker: Callable[..., Broker], tmp_path: Path,
                                                                 browser) -> None:  # noqa: ANN001  selenium's driver
    b, url = console_broker(start_broker, tmp_path)
    joined(url, session(url)[0])  # both workers are told the trace when it starts
    tag = uid()
    marked = f'{tag}-<img src=x onerror="document.title=1">'
    watched = Client(b.port, marked)
    watched.subscribe(f"find/{tag}/<b>bold</b>", 1)
    other = Client(b.port, f"{tag}-other")
    other.subscribe(f"find/{tag}/+", 0)
    log_in(browser, url, PASSWORD)
    wait_for(lambda: browser.current_url == url + "/", 10, "the overview")
    browser.find_element(By.LINK_TEXT, "Subscriptions").click()
    wait_for(lambda: browser.current_url == url + "/subscriptions", 10, "the subscriptions page")
    browser.find_element(By.ID, "client").send_keys(f"{tag}-<img")
    browser.find_element(By.ID, "find").click()
    wait_for(lambda: text(browser, "summary") == "1 subscriptions", 10, "the client's subscription found")
    assert text(browser, "subscriptions") == f"(default) find/{tag}/<b>bold</b> {marked} 1 online"
    assert not browser.find_elements(By.CSS_SELECTOR, "#subscriptions b, #subscriptions img") and browser.title != "1"
    browser.find_element(By.ID, "client").clear()
    browser.find_element(By.ID, "filter").send_keys(f"find/{tag}/")
    browser.find_element(By.ID, "find").click()
    wait_for(lambda: text(browser, "summary") == "2 subscriptions", 10, "both found by filter")
    browser.find_element(By.CSS_SELECTOR, "#subscriptions a.client").click()  # find/TAG/+ sorts first: the other's
    wait_for(lambda: text(browser, "state") == "Connected", 10, "the client's page")
    assert text(browser, "client-id") == f"{tag}-other"

    browser.find_element(By.LINK_TEXT, "Trace").click()
    wait_for(lambda: browser.current_url == url + "/trace", 10, "the Trace page")
    browser.find_element(By.ID, "filter").send_keys("find/#")
    browser.find_element(By.CSS_SELECTOR, '#by option[value="client_id"]').click()
    browser.find_element(By.ID, "value").send_keys(marked)
    browser.find_element(By.ID, "start").click()
    wait_for(lambda: text(browser, "status").startswith(f"tracing find/# of client_id {marked}"), 10, "the trace started")
    other.publish(f"find/{tag}/x", b"not its", qos=1)
    watched.publish(f"find/{tag}/x", b"its message", qos=1)
    wait_for(lambda: "its message" in text(browser, "messages"), 10, "the message in the page")
    assert marked in text(browser, "messages") and "not its" not in text(browser, "messages") and browser.title != "1"
    disposition, body = browser.execute_async_script(FETCH)
    assert disposition.startswith('attachment; filename="plexmq-trace-') and '"payload":"its message"' in body
    browser.find_element(By.ID, "stop").click()
    wait_for(lambda: text(browser, "status").endswith("stopped"), 10, "the trace stopped")
    assert not browser.find_element(By.ID, "download").is_displayed()
    for c in (watched, other):
        c.disconnect()
