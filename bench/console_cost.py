"""`python -m plexmq.bench.console_cost`: what open web consoles cost the router (issue 25).

One broker (`--workers`, a console with one admin) under a steady load from the C generator mqload
(fan-in: `-P` publishers at `-r` msgs/s each to one subscriber), and the router's CPU over a window of
`-d` seconds in each of these states, in turns, `--rounds` times:
- `none`: no console open;
- `overview`: `--consoles` logged-in overview pages, each reading the server-sent events (what an open
  overview tab does: one event a second);
- `clients`: the same, each also asking for the clients page's listing every second (more than a person
  clicking Search does: every ask goes to every worker), sorted by messages in (LISTING);
- `history`: the same, each also loading the overview's history every second (GET /api/history, the
  last hour and day of every series, router/ops/history.py: what an overview does once, at its load);
- `trace`: one live trace on the load's topics (router/trace.py): every traced message then passes the
  router, so this is the price of watching a busy topic, not of an open page.
The difference to `none` in the same round is the console's cost; rounds alternate so that drift in
the machine's speed falls on every state alike.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from urllib.parse import urlencode

import psutil

from plexmq.bench import brokers, mqload
from plexmq.bench.monitor import process_name
from plexmq.workers.auth.passwords import set_password

ADMIN, PASSWORD = "bench", "console cost bench"
STATES = ("none", "overview", "clients", "history", "trace")
SETTLE = 3.0  # seconds from mqload's start to the window: its connects and subscribe are done (--settle)
# what the clients page asks (issue 37): its first page, sorted by the router (here by the busiest, which
# every worker picks from all its clients)
LISTING = "/api/clients?limit=100&sort=messages_in&order=desc"
POLLED = {"clients": LISTING, "history": "/api/history"}  # a state -> what its pages ask each second


class Login:
    """A console session: its cookie and CSRF token."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cookie, self.csrf = log_in(port)

    def headers(self) -> dict[str, str]:
        return {"Host": f"127.0.0.1:{self.port}", "Cookie": self.cookie}


class Page(Login):
    """One logged-in console tab: an event stream read on a thread, optionally `poll` (a path: the
    clients listing, the history) asked every second, until `stop`."""

    def __init__(self, port: int, poll: str | None) -> None:
        super().__init__(port)
        self.events = 0
        self.listings = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._read_events, daemon=True)]
        if poll is not None:
            self._threads.append(threading.Thread(target=self._poll, args=(poll,), daemon=True))
        for thread in self._threads:
            thread.start()

    def _read_events(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("GET", "/events", headers=self.headers())
        answer = conn.getresponse()
        while not self._stop.is_set():
            line = answer.readline()
            if not line:
                return
            self.events += line.startswith(b"data: ")
        conn.close()

    def _poll(self, path: str) -> None:
        while not self._stop.wait(1.0):
            status, _ = request(self.port, "GET", path, self.headers())
            self.listings += status == 200

    def stop(self) -> None:
        self._stop.set()


def request(port: int, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body, headers)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def log_in(port: int) -> tuple[str, str]:
    """A session's cookie and its CSRF token (read from the overview page)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    form = urlencode({"user": ADMIN, "password": PASSWORD}).encode()
    conn.request("POST", "/login", form, {"Host": f"127.0.0.1:{port}", "Content-Type": "application/x-www-form-urlencoded"})
    answer = conn.getresponse()
    answer.read()
    cookie = (answer.getheader("Set-Cookie") or "").split(";")[0]
    conn.close()
    if answer.status != 303 or not cookie:
        raise SystemExit(f"console login refused: {answer.status}")
    _, page = request(port, "GET", "/", {"Host": f"127.0.0.1:{port}", "Cookie": cookie})
    found = re.search(rb'name="csrf" content="([^"]+)"', page)
    if found is None:
        raise SystemExit("no CSRF token in the overview page")
    return cookie, found.group(1).decode()


def start_trace(port: int, session: Login, topic_filter: str) -> Callable[[], None]:
    """Start a trace on `topic_filter` as the trace page does; the function that stops it."""
    headers = {**session.headers(), "Content-Type": "application/json", "X-CSRF-Token": session.csrf}
    status, body = request(port, "POST", "/api/trace/start", headers,
                           json.dumps({"filter": topic_filter, "tenant": ""}).encode())
    if status != 200:
        raise SystemExit(f"trace refused: {status} {body[:200]!r}")
    trace = json.loads(body)["id"]
    reading = threading.Event()

    def poll() -> None:  # the page reads its trace once a second, or the router ends it
        while not reading.wait(1.0):
            request(port, "POST", "/api/trace/read", headers, json.dumps({"id": trace}).encode())

    threading.Thread(target=poll, daemon=True).start()

    def stop() -> None:
        reading.set()
        request(port, "POST", "/api/trace/stop", headers, json.dumps({"id": trace}).encode())

    return stop


def router_cpu(root: int) -> psutil.Process:
    for proc in psutil.Process(root).children(recursive=True):
        if process_name(proc) == "router":
            return proc
    raise SystemExit("no router process under the broker")


def window(router: psutil.Process, seconds: float) -> float:
    """The router's CPU (% of one core) over `seconds`."""
    before = sum(router.cpu_times()[:2])
    time.sleep(seconds)
    return 100.0 * (sum(router.cpu_times()[:2]) - before) / seconds


def measure(broker: brokers.RunningBroker, console: int, state: str, args: argparse.Namespace) -> float:
    load = subprocess.Popen([args.mqload, "fanin", "-p", str(broker.port), "-P", str(args.publishers), "-S", "1",
                             "-q", "0", "-r", f"{args.rate:g}", "-d", f"{args.duration + args.settle + 1:g}", "-i", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pages = [Page(console, POLLED.get(state)) for _ in range(args.consoles if state in ("overview", *POLLED) else 0)]
    stop_trace = start_trace(console, Login(console), "bench/#") if state == "trace" else None
    try:
        time.sleep(args.settle)
        return window(router_cpu(broker.pid), args.duration)
    finally:
        for page in pages:
            page.stop()
        if stop_trace is not None:
            stop_trace()
        load.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.console_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-P", "--publishers", type=int, default=100)
    parser.add_argument("-r", "--rate", type=float, default=100.0, help="msgs/s per publisher")
    parser.add_argument("-d", "--duration", type=float, default=10.0, help="seconds each window lasts")
    parser.add_argument("--settle", type=float, default=SETTLE, help="seconds for the load's connects before each window")
    parser.add_argument("--consoles", type=int, default=1, help="open consoles in the overview, clients and history states")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--states", default=",".join(STATES))
    mqload.binary_option(parser)
    args = parser.parse_args(argv)
    mqload.check_binary(parser, args.mqload)
    states = args.states.split(",")
    unknown = set(states) - set(STATES)
    if unknown:
        parser.error(f"--states: unknown {', '.join(sorted(unknown))} (of {', '.join(STATES)})")
    with tempfile.TemporaryDirectory(prefix="plexmq-console-cost-") as tmp:
        admins = os.path.join(tmp, "admins")
        set_password(admins, ADMIN, PASSWORD)
        config = os.path.join(tmp, "plexmq.toml")
        with open(config, "w") as f:
            f.write(f'console_admins = "{admins}"\n')
        console = brokers.free_port()
        spec = brokers.BrokerSpec("plexmq", "plexmq", workers=args.workers,
                                  extra=["--config", config, "--console-port", str(console), "--metrics-port", "-1",
                                         "--no-persistence"])
        broker = brokers.RunningBroker(spec, tmp)
        results: dict[str, list[float]] = {state: [] for state in states}
        try:
            for round_ in range(args.rounds):
                for state in states:
                    results[state].append(measure(broker, console, state, args))
                    print(f"round {round_ + 1} {state}: router {results[state][-1]:.1f}% CPU", file=sys.stderr)
        finally:
            broker.stop()
    base = statistics.median(results[states[0]])
    print(f"{args.publishers} publishers x {args.rate:g} msgs/s, {args.workers} workers, {args.consoles} consoles, "
          f"{args.rounds} rounds of {args.duration:g} s; router CPU, % of one core (median):")
    for state in states:
        value = statistics.median(results[state])
        print(f"  {state:9} {value:6.1f}%  ({value - base:+.1f} against {states[0]})   runs: "
              + ", ".join(f"{v:.1f}" for v in results[state]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
