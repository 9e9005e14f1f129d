"""`python -m plexmq.bench.subscriptions`: what one subscription costs a broker's memory. One client
subscribes N distinct filters (`bench/<i>/state`) in SUBSCRIBEs of `--batch` each; printed: the RSS
growth per subscription of the router, of the worker and of the whole broker (for mosquitto, its one
process), from after the CONNACK to after the last SUBACK. plexmq runs with max_subscriptions = 0.
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile

import psutil

from plexmq.bench.brokers import BrokerSpec, RunningBroker
from plexmq.bench.monitor import process_name
from plexmq.mqtt import v4 as p


def _rss(broker: RunningBroker) -> dict[str, int]:
    """RSS in bytes by role (router, worker-0, ..., or the broker's own name) and in all."""
    top = psutil.Process(broker.pid)
    found = {"all": 0}
    for proc in [top, *top.children(recursive=True)]:
        rss = proc.memory_info().rss
        found[process_name(proc)] = rss
        found["all"] += rss
    return found


def _packet(sock: socket.socket) -> tuple[int, bytes]:
    buf = b""
    while True:
        found = p.frame(buf, 0, 1 << 28)
        if found:
            return found[0], buf[found[1]:found[2]]
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise RuntimeError("the broker closed the connection")
        buf += chunk


def measure(spec: BrokerSpec, count: int, batch: int, persistent: bool, log_dir: str) -> dict[str, float]:
    """Bytes of RSS per subscription, by role."""
    broker = RunningBroker(spec, log_dir)
    try:
        sock = socket.create_connection(("127.0.0.1", broker.port))
        sock.sendall(p.encode_connect("bench-subscriptions", not persistent, 600))
        assert _packet(sock)[0] == 0x20
        before = _rss(broker)
        for start in range(0, count, batch):
            filters = [(f"bench/{i}/state", 1) for i in range(start, min(start + batch, count))]
            sock.sendall(p.encode_subscribe(1, filters))
            first, body = _packet(sock)
            assert first == 0x90 and all(code == 1 for code in body[2:]), "a filter was refused"
        after = _rss(broker)
        sock.close()
        return {role: (after[role] - before.get(role, 0)) / count for role in after}
    finally:
        broker.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.subscriptions", description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--subscriptions", type=int, default=90_000)
    parser.add_argument("--batch", type=int, default=10_000, help="filters per SUBSCRIBE")
    parser.add_argument("--persistent", action="store_true", help="clean session 0 (the router stores them)")
    parser.add_argument("--brokers", default="plexmq,mosquitto")
    args = parser.parse_args(argv)
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as conf:
        conf.write("max_subscriptions = 0\n")
    specs = {"plexmq": BrokerSpec("plexmq", "plexmq", extra=["--config", conf.name]),
             "mosquitto": BrokerSpec("mosquitto", "mosquitto")}
    try:
        with tempfile.TemporaryDirectory() as log_dir:
            for name in args.brokers.split(","):
                per = measure(specs[name], args.subscriptions, args.batch, args.persistent, log_dir)
                roles = ", ".join(f"{role} {size:.0f}" for role, size in sorted(per.items()) if role != "all")
                print(f"{name}: {args.subscriptions} subscriptions, {per['all']:.0f} bytes of RSS each ({roles})")
    finally:
        os.unlink(conf.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
