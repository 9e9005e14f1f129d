"""The console's sessions page in a real browser (headless Chromium, as tests/test_console_browser.py):
an operator finds an offline persistent session with its queued message and removes it with its
button; the page shows it gone."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, console_broker
from tests.console_browser import By, log_in, text  # skips the module without selenium and chromium
from tests.mqtt import Client
from tests.steps import uid


def test_an_operator_removes_an_offline_session(start_broker: Callable[..., Broker], tmp_path: Path,
                                                browser) -> None:  # noqa: ANN001  selenium's driver
    b, url = console_broker(start_broker, tmp_path)
    client_id = f"offline-{uid()}"
    subscriber = Client(b.port, client_id, clean=False)
    subscriber.subscribe(f"browser/{client_id}", 1)
    subscriber.disconnect()
    publisher = Client(b.port, f"pub-{uid()}")
    publisher.publish(f"browser/{client_id}", b"waits", qos=1)
    publisher.disconnect()
    log_in(browser, url, PASSWORD)
    wait_for(lambda: browser.current_url == url + "/", 10, "the overview")
    browser.find_element(By.LINK_TEXT, "Sessions").click()
    wait_for(lambda: browser.current_url == url + "/sessions", 10, "the sessions page")
    browser.find_element(By.ID, "prefix").send_keys(client_id)
    browser.find_element(By.ID, "find").click()
    wait_for(lambda: text(browser, "summary").startswith("1 offline sessions"), 10, "the session found")
    assert text(browser, "sessions").split() == [client_id, "(default)", "1", "5", "never", "1", "Remove"]
    browser.find_element(By.CSS_SELECTOR, "button.remove").click()
    browser.switch_to.alert.accept()
    wait_for(lambda: text(browser, "summary") == f"removed the session of {client_id}", 10, "the page to say so")
    assert text(browser, "sessions") == ""
