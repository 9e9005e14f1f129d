"""The web console in a real browser (headless Chromium driven by selenium), as an operator uses it:
log in, watch the connections and the messages-in figure move while a client publishes, find a client
and disconnect it with its button; a wrong password shows an error. The overview's screenshot goes to
the test's tmp dir; with PLEXMQ_SCREENSHOTS=1 also to docs/console-overview.png, the one the README
shows (a test run leaves the checkout as it found it)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import paho.mqtt.client as paho

from tests.conftest import ROOT, Broker, wait_for
from tests.console import PASSWORD, console_broker
from tests.console_browser import By, log_in, text  # skips the module without selenium and chromium
from tests.steps import uid


def test_an_operator_watches_the_overview_and_disconnects_a_client(
        start_broker: Callable[..., Broker], tmp_path: Path, browser) -> None:  # noqa: ANN001
    b, url = console_broker(start_broker, tmp_path)
    log_in(browser, url, "wrong")
    wait_for(lambda: "Wrong user or password." in text(browser, "error"), 10, "the error on the login page")
    log_in(browser, url, PASSWORD)
    wait_for(lambda: browser.current_url == url + "/", 10, "the overview")
    client_id = f"browser-{uid()}"
    publisher = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id)
    publisher.connect("127.0.0.1", b.port)
    publisher.loop_start()
    stop = threading.Event()

    def publish() -> None:
        while not stop.wait(0.02):  # a steady load, not a wait for anything
            publisher.publish(f"console/{client_id}", b"load", qos=1)

    load = threading.Thread(target=publish, daemon=True)
    load.start()
    try:
        wait_for(lambda: text(browser, "connections") == "1", 20, "the connection counted")
        wait_for(lambda: text(browser, "received") not in ("?", "…", "0.0"), 20, "messages in per second to move")
        assert text(browser, "live") == "live" and text(browser, "version") != "?"
        browser.save_screenshot(str(tmp_path / "console-overview.png"))
        if os.environ.get("PLEXMQ_SCREENSHOTS") == "1":
            shutil.copyfile(tmp_path / "console-overview.png", ROOT / "docs" / "console-overview.png")
        stop.set()
        load.join()
        browser.get(url + "/clients")
        browser.find_element(By.ID, "filter").send_keys(client_id)
        browser.find_element(By.ID, "find").click()
        wait_for(lambda: client_id in text(browser, "clients") and text(browser, "summary") == "1 clients", 10,
                 "the client found")
        gone = threading.Event()
        publisher.on_disconnect = lambda *_: gone.set()
        browser.find_element(By.CSS_SELECTOR, "button.disconnect").click()
        wait_for(lambda: text(browser, "outcome") == f"disconnected {client_id}" or None, 10, "the page to say so")
        assert gone.wait(10), "the client was not disconnected"
    finally:
        stop.set()
        publisher.loop_stop()
        publisher.disconnect()
