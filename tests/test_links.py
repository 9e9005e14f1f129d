"""The worker <-> router link's fault handling on one host: a worker that goes silent past
`link_timeout` is taken for dead (wills out, persistent sessions kept) and, when it speaks again, is
told to join again and registers the connections it still holds (router/links.py)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable

from tests.conftest import Broker
from tests.steps import publish, raw_on, subscribe, sync, uid
from tests.test_durability import receive
from tests.test_processes import ping
from workers.mqtt import v4 as p

TIMEOUT = 1.0  # link_timeout of these brokers


def test_a_silent_worker_is_taken_for_dead_and_joins_again_when_it_speaks(start_broker: Callable[..., Broker],
                                                                         tmp_path: Path) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text(f"link_timeout = {TIMEOUT}\n")
    b = start_broker("--workers", "2", "--config", str(config))
    tag = uid()
    will_t, queue_t, live_t = f"links/{tag}/will", f"links/{tag}/q", f"links/{tag}/live"
    frozen, awake = 0, 1
    watcher = raw_on(b, want=awake)
    assert watcher.connect(f"lk-watch-{tag}") == (False, 0)
    assert subscribe(watcher, 1, [(will_t, 1), (live_t, 1)]) == [1, 1]
    pub = raw_on(b, want=awake)
    assert pub.connect(f"lk-pub-{tag}") == (False, 0)
    pers = raw_on(b, want=frozen)
    assert pers.connect(f"lk-pers-{tag}", clean=False, will=p.Will(will_t, b"gone quiet", 1, False)) == (False, 0)
    assert subscribe(pers, 1, [(queue_t, 1)]) == [1]
    clean = raw_on(b, want=frozen)
    assert clean.connect(f"lk-clean-{tag}") == (False, 0)
    assert subscribe(clean, 1, [(live_t, 1)]) == [1]
    worker = b.workers()[frozen]

    os.kill(worker.pid, signal.SIGSTOP)
    try:
        # the router hears nothing from it: its clients' wills go out, the persistent session stays
        will = receive(watcher, count=1, timeout=TIMEOUT + 5)
        assert [(m.topic, m.payload) for m in will] == [(will_t, b"gone quiet")]
        queued = [b"while-silent-%d" % i for i in range(3)]
        for i, payload in enumerate(queued):
            publish(pub, queue_t, payload, 1, packet_id=10 + i)
    finally:
        os.kill(worker.pid, signal.SIGCONT)

    # its next heartbeat is refused and answered with REJOIN: it registers its connections again, and
    # the persistent session gets what was queued for it; nobody was disconnected
    got = receive(pers, payloads=queued, timeout=TIMEOUT + 5)
    assert [m.payload for m in got] == queued
    for c in (pers, clean, watcher, pub):
        ping(c)
    publish(pub, live_t, b"after", 1, packet_id=20)
    assert [m.payload for m in receive(clean, payloads=[b"after"])] == [b"after"]
    assert b"after" in [m.payload for m in sync(watcher)]
    assert sync(watcher) == [], "the will was published more than once"
    assert b.workers()[frozen].pid == worker.pid, "the silent worker was restarted"
    log = b.output()
    assert "taken for dead" in log and "joined the router again" in log, log[-3000:]
