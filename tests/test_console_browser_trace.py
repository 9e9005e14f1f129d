"""The Trace page in a real browser (headless Chromium, selenium), as an operator uses it: log in,
open Trace, start a trace of "t/#", see a message published by a client appear with its topic and
payload, stop the trace. The page's screenshot goes to the test's tmp dir."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, console_broker, joined, session
from tests.console_browser import By, log_in, text  # skips the module without selenium and chromium
from tests.mqtt import Client
from tests.steps import uid


def test_an_operator_traces_a_filter_and_sees_its_messages(start_broker: Callable[..., Broker], tmp_path: Path,
                                                           browser) -> None:  # noqa: ANN001  selenium's driver
    b, url = console_broker(start_broker, tmp_path)
    joined(url, session(url)[0])  # both workers are told the trace when it starts
    log_in(browser, url, PASSWORD)
    wait_for(lambda: browser.current_url == url + "/", 10, "the overview")
    browser.find_element(By.LINK_TEXT, "Trace").click()
    wait_for(lambda: browser.current_url == url + "/trace", 10, "the Trace page")
    browser.find_element(By.ID, "filter").send_keys("t/#")
    browser.find_element(By.ID, "start").click()
    wait_for(lambda: text(browser, "status").startswith("tracing t/#"), 10, "the trace started")
    client_id = f"browser-{uid()}"
    publisher = Client(b.port, client_id)
    publisher.publish("u/a", b"not traced", qos=1)
    publisher.publish("t/a", b"hello from the test", qos=1)
    wait_for(lambda: "hello from the test" in text(browser, "messages"), 10, "the message in the page")
    row = text(browser, "messages")
    assert "t/a" in row and client_id in row and "not traced" not in row
    assert "1 matched, 1 kept" in text(browser, "status")
    browser.save_screenshot(str(tmp_path / "console-trace.png"))
    browser.find_element(By.ID, "stop").click()
    wait_for(lambda: text(browser, "status").endswith("stopped"), 10, "the trace stopped")
    wait_for(lambda: "t/#" not in text(browser, "traces"), 10, "the trace gone from the live ones")
    publisher.disconnect()
