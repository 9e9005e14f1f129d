"""The audit, the read-only role and the alarms' acknowledgement in a real browser (headless Chromium,
as tests/test_console_browser.py): the Audit page shows an admin name, client id and outcome with HTML
in them as text; an operator acknowledges a drop alarm with its button and the row says who; a read-only
admin's pages show no button that acts; a page of another site that posts an acknowledgement with the
operator's cookie is refused, and nothing is acknowledged or audited."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import orjson

from plexmq.acceptor.status import scrape
from plexmq.router.ops.alarms import DROPPED
from plexmq.workers.auth.passwords import set_password
from tests.cli import CHEAP, metrics_url
from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, ask, console_broker, event_until, session
from tests.console_browser import (  # skips the module without selenium and chromium
    By,
    NoSuchElementException,
    StaleElementReferenceException,
    forge,
    text,
)
from tests.steps import connect, publish, subscribe, uid

HTML_ADMIN = "<i>eve</i>"


def log_in_as(browser, url: str, user: str) -> None:  # noqa: ANN001  selenium's driver
    browser.get(url + "/login")
    browser.find_element(By.ID, "user").send_keys(user)
    browser.find_element(By.ID, "password").send_keys(PASSWORD)
    browser.find_element(By.ID, "submit").click()
    wait_for(lambda: browser.current_url == url + "/", 10, "the overview")


def overflow(b: Broker, url: str, cookie: dict[str, str]) -> dict:
    """A subscriber that never acknowledges and ten messages for it: the drop alarm, as an event has it.
    Once the router has seen both workers (its metrics name them): drops a worker already had when first
    seen raise nothing."""
    metrics = metrics_url(b)
    wait_for(lambda: len({dict(labels)["worker"] for name, labels in scrape(metrics)
                          if name == "plexmq_clients_connected"}) == 2, 10, "both workers in the router's figures")
    topic = f"browser/audit/{uid()}"
    sub = connect(b.port)
    assert subscribe(sub, 1, [(topic, 1)]) == [1]
    pub = connect(b.port)
    for i in range(10):
        publish(pub, topic, b"m%d" % i, 1, packet_id=i + 1)
    event = event_until(url, cookie, lambda e: any(a["name"] == DROPPED for a in e["alarms"]), what="the drop alarm")
    return next(a for a in event["alarms"] if a["name"] == DROPPED)


def test_the_audit_page_shows_html_as_text_and_an_alarm_is_acknowledged_with_its_button(
        start_broker: Callable[..., Broker], tmp_path: Path, browser) -> None:  # noqa: ANN001
    b, url = console_broker(start_broker, tmp_path, config="max_inflight = 1\nmax_queued_messages = 2\n")
    set_password(str(tmp_path / "admins"), HTML_ADMIN, PASSWORD, n=CHEAP)
    b.proc.send_signal(1)  # SIGHUP: the admins file again
    wait_for(lambda: "console: admins reloaded" in b.output(), 10, "the reload")
    cookie, csrf = session(url, user=HTML_ADMIN)
    client_id = f"<img src=x onerror=alert(1)>-{uid()}"
    client = connect(b.port, client_id)
    wait_for(lambda: ask(url, "POST", "/api/clients/disconnect", {**cookie, "X-CSRF-Token": csrf,
                         "Content-Type": "application/json"}, orjson.dumps({"client_id": client_id}))[0] == 200,
             10, "the client disconnected (once the router holds it)")
    client.close()
    log_in_as(browser, url, "ops")
    alarm = overflow(b, url, cookie)
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#alarms button.acknowledge"), 20, "the button")
    wait_for(lambda: _click(browser, "#alarms button.acknowledge") and "by ops" in text(browser, "alarms"), 20,
             "the acknowledgement on the page")
    assert text(browser, "acknowledge-said") == f"acknowledged: {alarm['what']}"
    assert "raised" in text(browser, "alarms")  # listed as raised until it clears
    browser.get(url + "/audit")
    wait_for(lambda: "alarm acknowledge" in text(browser, "entries"), 10, "the audit page")
    shown = text(browser, "entries")
    assert f"{HTML_ADMIN} 127.0.0.1 (default) disconnect {client_id} disconnected" in shown
    assert not browser.find_elements(By.CSS_SELECTOR, "#entries i, #entries img")  # text, not markup
    browser.save_screenshot(str(tmp_path / "console-audit.png"))


def _click(browser, selector: str) -> bool:  # noqa: ANN001
    """Click the first element `selector` finds; True (the alarms are drawn again each second: one that
    went stale meanwhile is clicked at the caller's next try)."""
    with contextlib.suppress(NoSuchElementException, StaleElementReferenceException):
        browser.find_element(By.CSS_SELECTOR, selector).click()
    return True


def test_a_read_only_admins_pages_show_no_button_that_acts(start_broker: Callable[..., Broker], tmp_path: Path,
                                                           browser) -> None:  # noqa: ANN001
    b, url = console_broker(start_broker, tmp_path, config="max_inflight = 1\nmax_queued_messages = 2\n")
    set_password(str(tmp_path / "admins"), "viewer", PASSWORD, n=CHEAP, role="read-only")
    b.proc.send_signal(1)
    wait_for(lambda: "console: admins reloaded" in b.output(), 10, "the reload")
    cookie, _csrf = session(url)
    client_id = f"ro-{uid()}"
    client = connect(b.port, client_id)
    log_in_as(browser, url, "viewer")
    overflow(b, url, cookie)
    wait_for(lambda: "messages dropped" in text(browser, "alarms"), 20, "the alarm on the viewer's page")
    assert [button.is_displayed() for button in browser.find_elements(By.CSS_SELECTOR, "#alarms button")] in ([], [False])
    assert "(read-only)" in browser.find_element(By.CSS_SELECTOR, "nav .who").text
    browser.get(url + "/clients")
    browser.find_element(By.ID, "filter").send_keys(client_id)
    browser.find_element(By.ID, "find").click()
    wait_for(lambda: client_id in text(browser, "clients"), 10, "the client listed")
    assert not browser.find_element(By.CSS_SELECTOR, "button.disconnect").is_displayed()
    for page, hidden in (("/retained", "delete"), ("/trace", "start"), (f"/client?id={client_id}", "disconnect")):
        browser.get(url + page)
        assert not browser.find_element(By.ID, hidden).is_displayed(), page
    client.close()


def test_a_forged_acknowledgement_from_another_site_is_refused(
        start_broker: Callable[..., Broker], tmp_path: Path, browser, attacker) -> None:  # noqa: ANN001, F811
    b, url = console_broker(start_broker, tmp_path, config="max_inflight = 1\nmax_queued_messages = 2\n")
    cookie, _csrf = session(url)
    log_in_as(browser, url, "ops")
    alarm = overflow(b, url, cookie)
    forge(browser, attacker, url, "/api/alarms/acknowledge",
          {"name": alarm["name"], "subject": alarm["subject"], "raised": alarm["raised"]})
    browser.get(url + "/")  # the operator's own overview: the alarm is there, acknowledged by nobody
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#alarms button.acknowledge"), 20, "the alarm's button")
    assert "by ops" not in text(browser, "alarms")
    assert orjson.loads(ask(url, "GET", "/api/audit", cookie)[2])["rows"] == []
