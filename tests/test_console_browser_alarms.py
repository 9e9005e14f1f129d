"""The overview's alarms in a real browser (headless Chromium, as tests/test_console_browser.py): an
operator logs in, a subscriber that never acknowledges overflows its queue, and the overview shows the
drop alarm raised, with where the messages were dropped; the store is named above it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, console_broker
from tests.console_browser import log_in, text  # skips the module without selenium and chromium
from tests.steps import connect, publish, subscribe, uid


def test_a_drop_alarm_is_shown_on_the_overview(start_broker: Callable[..., Broker], tmp_path: Path,
                                               browser) -> None:  # noqa: ANN001  selenium's driver
    b, url = console_broker(start_broker, tmp_path, config="max_inflight = 1\nmax_queued_messages = 2\n")
    log_in(browser, url, PASSWORD)
    wait_for(lambda: text(browser, "live") == "live", 20, "the overview's stream")
    assert text(browser, "no-alarms") == "No alarm." and text(browser, "store-kind") == "SQLite"
    wait_for(lambda: text(browser, "workers").count("up") == 2, 20, "both workers in the table")
    topic = f"browser/alarm/{uid()}"
    sub = connect(b.port)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]  # and never acknowledges
    pub = connect(b.port)
    for i in range(10):
        publish(pub, topic, b"m%d" % i, 1, packet_id=i + 1)
    wait_for(lambda: "messages dropped" in text(browser, "alarms"), 20, "the drop alarm on the page")
    row = text(browser, "alarms")
    assert "raised" in row and "since raised: " in row and "max_queued_messages" in row
    assert text(browser, "alarm-count") == "1 raised" and text(browser, "no-alarms") == ""
    browser.save_screenshot(str(tmp_path / "console-alarms.png"))
    sub.close()
    pub.close()
