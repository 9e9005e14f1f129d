"""The log lines the README promises and an operator reads, from a real broker's stderr: each one with
its time, level and process; one per connect and disconnect (client id, address) at INFO; a failed
login names its user; what starts (workers, tenants, the archive) counted as written; a reload says
which file it found edited; the stop's mass close is one line."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

from plexmq.mqtt import v4 as p
from tests.cli import write
from tests.conftest import Broker, wait_for
from tests.logins import login, users
from tests.steps import uid

TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"  # plexmq/process.py LOG_FORMAT's asctime


def logged(b: Broker, level: str, process: str, message: str) -> list[re.Match[str]]:
    """The lines of `b`'s log at `level` from `process` (a regex: acceptor, router, worker-\\d+) whose
    message matches the regex `message`."""
    return list(re.finditer(rf"^{TIME} {level} plexmq\.{process}\[\d+\]: {message}$", b.output(), re.MULTILINE))


def test_the_lines_an_operator_reads(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    passwords = users(tmp_path / "passwords", alice="secret")
    os.chmod(passwords, 0o644)  # readable by others: warned of, as a line of the log
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite #\n")
    archive = tmp_path / "archive"
    config = write(tmp_path, f'password_file = "{passwords}"\nacl_file = "{acl}"\ntenant_separator = "@"\n'
                             f'[archive]\nenabled = true\ndir = "{archive}"\n[tenants.acme]\n[tenants.beta]\n')
    b = start_broker("--workers", "1", "--config", str(config))
    assert logged(b, "WARNING", "acceptor", rf"password_file: {re.escape(str(passwords))} is readable by other users "
                                            r"\(mode 644\).*"), b.output()
    assert logged(b, "INFO", "acceptor", rf"plexmq listening on 127\.0\.0\.1:{b.port} with 1 worker"), b.output()
    assert logged(b, "INFO", "acceptor", "2 tenants declared: acme, beta"), b.output()
    assert logged(b, "INFO", "acceptor", rf"archive on: topics # to {re.escape(str(archive))}"), b.output()
    assert " 1 tenants" not in b.output()

    client_id = f"log-{uid()}"
    c, code = login(b.port, "alice", b"secret", client_id)
    assert code == 0
    address = f"127\\.0\\.0\\.1:{c.sock.getsockname()[1]}"
    wait_for(lambda: logged(b, "INFO", r"worker-\d+", f"client {client_id} connected from {address}"), 10,
             "the connect line at INFO")
    c.send(p.DISCONNECT_PACKET)
    c.read_until_closed()
    wait_for(lambda: logged(b, "INFO", r"worker-\d+", f"client {client_id} \\({address}\\) closed: client disconnected"),
             10, "the disconnect line at INFO")

    refused, code = login(b.port, "mallory", b"guess", f"log-{uid()}")
    assert code == 4  # bad user name or password
    refused.read_until_closed()
    wait_for(lambda: logged(b, "INFO", r"worker-\d+", r"client \S+ \(\S+\) closed: bad user name or password "
                                                       r"\(user 'mallory'\)"), 10, "the failed login naming its user")

    acl.write_text("user alice\ntopic read #\n")  # the same path, new rules
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: logged(b, "INFO", "acceptor", rf"SIGHUP: config reloaded; changed: acl_file \({re.escape(str(acl))} "
                                                    r"edited\)"), 10, "the reload to name the edited ACL file")

    staying = [login(b.port, "alice", b"secret", f"log-stay-{uid()}-{i}")[0] for i in range(3)]
    b.stop()
    assert len(logged(b, "INFO", r"worker-\d+", "closed 3 clients: broker shutting down")) == 1, b.output()
    assert not logged(b, "INFO", r"worker-\d+", r"client .* closed: broker shutting down")  # one line, not one each
    for c in staying:
        c.close()
