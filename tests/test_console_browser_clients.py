"""The clients' figures in a real browser (headless Chromium, as tests/test_console_browser.py, issue 37):
an operator pages through more clients than a page holds, sorts by messages in with a click on the
column (twice: the busiest first), sees each client's username and figures, follows a client to its own
page, and from the sessions page to an offline session's client page. A client id and a username
with HTML in them show as text."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from plexmq.mqtt import v4 as p
from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, console_broker
from tests.console_browser import By, StaleElementReferenceException, log_in, text  # skips without chromium
from tests.mqtt import RawClient
from tests.steps import connect, publish, uid

IDLE = 102  # with the publishers, more than the page's 100 rows


def cells(browser, row: int) -> list[str]:  # noqa: ANN001  selenium's driver
    """The texts of the cells of the clients table's row (0: the first); none while it is drawn anew."""
    try:
        found = browser.find_elements(By.CSS_SELECTOR, "#clients tr")
        return [td.text for td in found[row].find_elements(By.TAG_NAME, "td")] if len(found) > row else []
    except StaleElementReferenceException:
        return []


def test_an_operator_pages_sorts_and_follows_a_client(start_broker: Callable[..., Broker], tmp_path: Path,
                                                      browser) -> None:  # noqa: ANN001  selenium's driver
    b, url = console_broker(start_broker, tmp_path, "--workers", "2")
    tag = uid()
    idle = [connect(b.port, f"{tag}-idle-{i:03}") for i in range(IDLE)]
    marked = f'{tag}-<img src=x onerror="document.title=1">'
    busy = []
    for i, (client_id, username) in enumerate([(f"{tag}-busy", "<b>operator</b>"), (marked, "plain")]):
        c = RawClient(b.port)
        c.send(p.encode_connect(client_id, True, 60, username=username))
        assert c.recv()[0] == 0x20
        for n in range(1, 6 - i * 3):  # 5 and 2 QoS 1 messages
            publish(c, f"browser/{tag}", b"figures", qos=1, packet_id=n)
        busy.append(c)
    log_in(browser, url, PASSWORD)
    wait_for(lambda: browser.current_url == url + "/", 10, "the overview")
    browser.find_element(By.LINK_TEXT, "Clients").click()
    browser.find_element(By.ID, "filter").send_keys(tag)
    browser.find_element(By.ID, "find").click()
    wait_for(lambda: text(browser, "summary") == f"{IDLE + 2} clients (1 to 100)", 10, "the first page")
    assert browser.find_element(By.ID, "previous").get_property("disabled")
    browser.find_element(By.ID, "next").click()
    wait_for(lambda: text(browser, "summary") == f"{IDLE + 2} clients (101 to {IDLE + 2})", 10, "the second page")
    assert browser.find_element(By.ID, "next").get_property("disabled")
    header = browser.find_element(By.CSS_SELECTOR, 'th[data-sort="messages_in"]')
    header.click()  # ascending, from the first page
    wait_for(lambda: header.get_attribute("class") == "asc" and text(browser, "summary").endswith("(1 to 100)"), 10,
             "the order by messages in")
    header.click()  # the busiest first
    wait_for(lambda: (cells(browser, 0) or [""])[0] == f"{tag}-busy" and header.get_attribute("class") == "desc", 10,
             "the busiest first")
    first, second = cells(browser, 0), cells(browser, 1)
    assert (first[1], first[4], first[5]) == ("<b>operator</b>", "5", "0")  # username, messages in and out: as text
    assert (second[0], second[1], second[4]) == (marked, "plain", "2")
    assert not browser.find_elements(By.CSS_SELECTOR, "#clients img, #clients b") and browser.title != "1"
    browser.find_elements(By.CSS_SELECTOR, "#clients a.client")[1].click()
    wait_for(lambda: text(browser, "state") == "Connected", 10, "the client's page")
    assert text(browser, "client-id") == marked and browser.title != "1"
    facts = text(browser, "facts")
    assert "Username plain" in facts and "Messages in 2" in facts and "Messages out 0" in facts
    assert "Connected since" in facts and "In flight 0" in facts and "Queued 0" in facts

    kept = f"{tag}-kept"
    RawClient(b.port).connect(kept, clean=False)  # closed at once: its session stays offline
    browser.get(url + "/sessions")
    browser.find_element(By.ID, "prefix").send_keys(kept)
    browser.find_element(By.ID, "find").click()
    wait_for(lambda: text(browser, "summary").startswith("1 offline sessions"), 10, "the session found")
    browser.find_element(By.CSS_SELECTOR, "#sessions a.client").click()
    wait_for(lambda: text(browser, "state").startswith("Not connected: its persistent session is kept offline"), 10,
             "the offline session's client page")
    assert text(browser, "client-id") == kept
    for c in (*idle, *busy):
        c.close()
