"""The overview's history in a real browser (headless Chromium, as tests/test_console_browser.py): messages
published before the page is opened are on its charts at once (the router kept them: GET /api/history),
the totals of subscriptions, topics and retained messages are shown, and the range buttons widen the charts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson

from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, ask, console_broker, event_until, session
from tests.console_browser import By, log_in, text  # skips the module without selenium and chromium
from tests.steps import connect, publish, subscribe, uid


def test_the_overview_draws_what_the_router_kept_before_the_page_was_opened(
        start_broker: Callable[..., Broker], tmp_path: Path, browser) -> None:  # noqa: ANN001  selenium's driver
    b, url = console_broker(start_broker, tmp_path)
    cookie, _csrf = session(url)
    event_until(url, cookie, lambda e: e["rates"]["received"] is not None, what="a rate: the history has begun")
    topic = f"browser/history/{uid()}"
    sub = connect(b.port)
    assert subscribe(sub, 1, [(topic, 0)]) == [0]
    pub = connect(b.port)
    publish(pub, topic + "/kept", b"<b>r</b>", 0, retain=True)
    for i in range(100):
        publish(pub, topic, b"m%d" % i)
    wait_for(lambda: max(orjson.loads(ask(url, "GET", "/api/history", cookie)[2])["broker"]["seconds"]["received"]) > 0,
             10, "the messages in the router's history")
    log_in(browser, url, PASSWORD)
    wait_for(lambda: text(browser, "live") == "live", 20, "the overview's stream")
    assert " s and " in text(browser, "history")
    # the second the messages came, before this page was opened, on its chart: a rate above zero
    kept = browser.execute_script("return charts.received.series.get('').filter(p => p[1] > 0).length")
    assert kept >= 1
    assert browser.execute_script("return charts.rss.series.size") == 2  # each worker's line
    wait_for(lambda: text(browser, "retained") == "1" and text(browser, "subscriptions") == "1", 10, "the totals")
    assert int(text(browser, "topics")) >= 1
    browser.find_element(By.CSS_SELECTOR, "#range button[data-span='86400']").click()
    assert browser.execute_script("return charts.received.span") == 86400
    browser.save_screenshot(str(tmp_path / "console-history.png"))
    sub.close()
    pub.close()
