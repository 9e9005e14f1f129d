"""The bridges page in a real browser (headless Chromium driven by selenium): a bridge whose remote
does not answer, with QoS 1 messages waiting, shown with its state and reason, its queue in the router
and what it holds; a tenant admin's /api/bridges lists only the tenant's bridges."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson

from plexmq.acceptor.bridges.bridge import LOCAL_WINDOW
from tests.conftest import Broker, free_port, wait_for
from tests.console import PASSWORD, ask, console_broker, session
from tests.console_browser import By, log_in, text  # skips the module without selenium and chromium
from tests.mqtt import Client


def test_an_operator_sees_a_bridge_down_with_its_queue(start_broker: Callable[..., Broker], tmp_path: Path,
                                                       browser) -> None:  # noqa: ANN001  selenium's driver
    nowhere = free_port()  # nothing listens there
    b, url = console_broker(start_broker, tmp_path, tenants=("acme",),
                            config=f'[bridges.cloud]\naddress = ["127.0.0.1:{nowhere}"]\nout = [{{filter = "data/#"}}]\n'
                                   f'[bridges.other]\naddress = ["127.0.0.1:{nowhere}"]\ntenant = "acme"\n'
                                   'out = [{filter = "x/#"}]\n')
    wait_for(lambda: b.output().count(": local up (session new") == 2, 30, "both bridges' local links up")
    publisher = Client(b.port, "publisher")
    for i in range(LOCAL_WINDOW + 10):
        publisher.publish("data/x", str(i), qos=1)
    log_in(browser, url, PASSWORD)
    wait_for(lambda: browser.current_url == url + "/", 10, "the overview")
    browser.find_element(By.LINK_TEXT, "Bridges").click()
    wait_for(lambda: f"10 {LOCAL_WINDOW} 0 0 0" in text(browser, "bridges"), 20,
             f"10 queued in the router, {LOCAL_WINDOW} held (its window)")
    rows = {row.find_element(By.TAG_NAME, "td").text: row.text for row in
            browser.find_element(By.ID, "bridges").find_elements(By.TAG_NAME, "tr")}
    assert sorted(rows) == ["cloud", "other"]
    assert f"remote down: 127.0.0.1:{nowhere}" in rows["cloud"] or f"cannot connect to 127.0.0.1:{nowhere}" in rows["cloud"]
    assert "(default)" in rows["cloud"] and "acme" in rows["other"]
    assert text(browser, "summary") == "2 bridges"
    cookie, _csrf = session(url, tenant="acme")
    status, _headers, body = ask(url, "GET", "/api/bridges", cookie)
    assert status == 200 and [bridge["name"] for bridge in orjson.loads(body)["bridges"]] == ["other"]
