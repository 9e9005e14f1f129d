"""`python -m plexmq.bench.topology --ports P1,P2`: a router and one node per port on this host, as one
process tree, so that compare measures them as it measures one broker (`plexmq-nodes`).

The link is tcp:// on loopback with CURVE keys made for the run, as between real hosts; the router
keeps its store in a directory of the run. With `--direct`, each node binds a direct endpoint of its
own (`direct_bind`, a free port range on loopback): QoS 0 messages between the nodes go worker to
worker. SIGTERM stops the nodes, then the router; if any of them exits, the rest are stopped too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from plexmq.acceptor.keys import ensure
from plexmq.bench.brokers import free_port

ROUTER_WAIT = 20.0  # seconds the router gets to bind its link


def _free_ports(count: int) -> int:
    """The first of `count` consecutive ports free now on loopback (a node's workers bind one each)."""
    while True:
        first = free_port()
        if first + count <= 65535 and all(_free(first + i) for i in range(1, count)):
            return first


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.topology", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ports", required=True, help="comma-separated MQTT ports, one node each")
    parser.add_argument("--workers", type=int, default=1, help="workers per node (default 1)")
    parser.add_argument("--node-arg", action="append", default=[], help="extra argument for each node's plexmq serve")
    parser.add_argument("--direct", action="store_true", help="each node with a direct_bind of its own")
    ns = parser.parse_args(argv)
    ports = [int(p) for p in ns.ports.split(",")]
    run_dir = tempfile.mkdtemp(prefix="plexmq-topology-")
    keys = os.path.join(run_dir, "keys")
    ensure(keys)
    link = f"tcp://127.0.0.1:{free_port()}"
    serve = [sys.executable, "-m", "plexmq.acceptor", "serve", "--router-curve-dir", keys, "--metrics-port", "-1",
             "--console-port", "-1"]
    procs = [subprocess.Popen([*serve, "--role", "router", "--router-bind", link,
                               "--data-dir", os.path.join(run_dir, "data")])]
    stopping = False

    def stop(_signum: int = 0, _frame: object = None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    deadline = time.monotonic() + ROUTER_WAIT
    while not _listening(int(link.rsplit(":", 1)[1])) and procs[0].poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for i, port in enumerate(ports, 1):
        direct = []
        if ns.direct:
            conf = os.path.join(run_dir, f"n{i}.toml")
            with open(conf, "w") as f:
                f.write(f'direct_bind = "tcp://127.0.0.1:{_free_ports(ns.workers)}"\n')
            direct = ["--config", conf]
        procs.append(subprocess.Popen([*serve, "--role", "node", "--router", link, "--node-name", f"n{i}",
                                       "--port", str(port), "--workers", str(ns.workers), *direct, *ns.node_arg]))
    while not stopping and all(proc.poll() is None for proc in procs):
        time.sleep(0.1)
    for proc in [*procs[1:], procs[0]]:  # the nodes first: their last records still reach the router
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
