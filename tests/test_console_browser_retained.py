"""The retained messages page and a client's page in a real browser (headless Chromium driven by
selenium), as an operator uses them: open Retained, view a JSON message, delete it (the confirmation
accepted) and see it go; open a client's page from the clients list and see its subscription."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, console_broker
from tests.console_browser import By, log_in, text  # skips the module without selenium and chromium
from tests.mqtt import Client
from tests.steps import uid


def test_an_operator_deletes_a_retained_message_and_opens_a_clients_page(
        start_broker: Callable[..., Broker], tmp_path: Path, browser) -> None:  # noqa: ANN001  selenium's driver
    b, url = console_broker(start_broker, tmp_path)
    client_id = f"browser-{uid()}"
    topic = f"{client_id}/reading"
    client = Client(b.port, client_id)
    client.publish(topic, b'{"celsius":21.5}', qos=1, retain=True)
    client.subscribe(f"{client_id}/commands/#", 1)
    try:
        log_in(browser, url, PASSWORD)
        wait_for(lambda: browser.current_url == url + "/", 10, "the overview")
        browser.find_element(By.LINK_TEXT, "Retained").click()
        wait_for(lambda: topic in text(browser, "messages"), 10, "the retained message listed")
        browser.find_element(By.CSS_SELECTOR, "button.view").click()
        wait_for(lambda: text(browser, "view-topic") == topic, 10, "the message viewed")
        assert text(browser, "payload") == '{\n  "celsius": 21.5\n}'  # pretty JSON first
        browser.find_element(By.ID, "show-hex").click()
        assert text(browser, "payload") == "00000000  " + " ".join(f"{byte:02x}" for byte in b'{"celsius":21.5}')
        browser.find_element(By.ID, "delete").click()
        browser.switch_to.alert.accept()
        wait_for(lambda: text(browser, "said") == f"deleted the retained message on {topic!r}", 10, "the delete said")
        wait_for(lambda: topic not in text(browser, "messages") and text(browser, "summary") == "0 retained messages", 10,
                 "the message gone from the list")

        browser.find_element(By.LINK_TEXT, "Clients").click()
        wait_for(lambda: client_id in text(browser, "clients"), 10, "the client listed")
        browser.find_element(By.LINK_TEXT, client_id).click()
        wait_for(lambda: f"{client_id}/commands/#" in text(browser, "subscriptions"), 10, "its subscription on its page")
        assert text(browser, "state") == "Connected" and text(browser, "client-id") == client_id
    finally:
        client.disconnect()
