"""The Bans page in a real browser (headless Chromium driven by selenium), as an operator uses it: ban a
connected client with a reason (markup, shown as text) and an expiry, see it closed and listed, lift the
ban (the confirmation accepted) and see the client connect again; and a forged ban from another site's
page (a credentialed fetch, then a cross-site form) refused, no ban made."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson

from plexmq.mqtt import reasons
from tests.conftest import Broker, wait_for
from tests.console import PASSWORD, ask, console_broker, session
from tests.console_browser import By, forge, log_in, text  # skips the module without selenium and chromium
from tests.mqtt import RawClient
from tests.steps import disconnect_of, raw5, uid

MARKUP = '<img src=x onerror="document.title=\'owned\'"><script>document.title="owned"</script>'


def test_an_operator_bans_a_client_sees_it_closed_and_lifts_the_ban(
        start_broker: Callable[..., Broker], tmp_path: Path, browser) -> None:  # noqa: ANN001  selenium's driver
    b, url = console_broker(start_broker, tmp_path)
    client_id = f"noisy-{uid()}"
    noisy, (_, code, _) = raw5(b.port, client_id)
    assert code == 0
    log_in(browser, url, PASSWORD)
    wait_for(lambda: browser.current_url == url + "/", 10, "the overview")
    browser.find_element(By.LINK_TEXT, "Bans").click()
    wait_for(lambda: text(browser, "summary") == "0 bans", 10, "the empty list")
    browser.find_element(By.ID, "value").send_keys(client_id)
    browser.find_element(By.ID, "reason").send_keys(MARKUP)
    browser.find_element(By.ID, "duration").send_keys("2h")
    browser.find_element(By.ID, "add").click()
    wait_for(lambda: text(browser, "outcome").startswith(f"banned client_id {client_id!r} in every tenant until "), 10,
             "the ban said")
    assert text(browser, "outcome").endswith("; 1 connected clients closed")
    assert disconnect_of(noisy)[0] == reasons.ADMINISTRATIVE_ACTION
    wait_for(lambda: client_id in text(browser, "bans"), 10, "the ban listed")
    cells = [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#bans td")]
    assert cells[:4] == ["every tenant", "client_id", client_id, MARKUP] and cells[4] != "never"
    assert cells[5] == "console: ops"
    assert not browser.find_elements(By.CSS_SELECTOR, "#bans img, #bans script") and browser.title != "owned"
    refused = RawClient(b.port)
    assert refused.connect5(client_id)[1] == reasons.BANNED
    browser.find_element(By.CSS_SELECTOR, "button.lift").click()
    browser.switch_to.alert.accept()
    wait_for(lambda: text(browser, "outcome") == f"lifted the ban of client_id {client_id!r} in every tenant", 10,
             "the lift said")
    wait_for(lambda: text(browser, "summary") == "0 bans", 10, "the ban gone from the list")
    assert RawClient(b.port).connect5(client_id)[1] == 0


def test_a_forged_ban_from_another_site_is_refused(
        start_broker: Callable[..., Broker], tmp_path: Path, browser, attacker) -> None:  # noqa: ANN001
    b, url = console_broker(start_broker, tmp_path)
    client_id = f"victim-{uid()}"
    victim = RawClient(b.port)
    assert victim.connect(client_id) == (False, 0)
    log_in(browser, url, PASSWORD)
    wait_for(lambda: browser.current_url == url + "/", 10, "the overview")
    forge(browser, attacker, url, "/api/bans/add", {"kind": "client_id", "value": client_id, "reason": "forged"})
    cookie, csrf = session(url)
    status, _, body = ask(url, "GET", "/api/bans", cookie)
    assert status == 200 and orjson.loads(body)["total"] == 0
    # the console's own origin, the session's cookie, but no CSRF token: refused too
    headers = {**cookie, "Content-Type": "application/json", "Origin": url}
    forged = orjson.dumps({"kind": "client_id", "value": client_id})
    assert ask(url, "POST", "/api/bans/add", headers, forged)[0] == 403
    assert f"banned client_id {client_id!r}" not in b.output()
    victim.send(b"\xc0\x00")  # PINGREQ: the connection is still served
    assert victim.recv() == (0xD0, b"")
    status, _, said = ask(url, "POST", "/api/bans/add", {**headers, "X-CSRF-Token": csrf}, forged)  # with it: banned
    assert (status, said) == (200, f"banned client_id {client_id!r} in every tenant; 1 connected clients closed\n".encode())
    assert victim.read_until_closed() == b""
