"""What a run is (its options) and which generator process owns which client.

Clients are spread so that no process is the bottleneck: each client is weighted by the messages it
handles per second (a fan-in subscriber receives from every publisher) and placed on the least loaded
process, with a cap of sockets per process under the open-file limit. A p2p pair stays in one
process, so its end-to-end window needs no cross-process receipt.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass, field

SCENARIOS = ("conn", "fanin", "fanout", "p2p")


@dataclass
class Options:
    scenario: str
    host: str = "127.0.0.1"
    port: int = 1883
    # more than one: spread the clients over these ports (nodes of one router): publisher i on the
    # (i mod n)-th, subscriber i on the next, so that p2p pairs cross nodes
    ports: list[int] = field(default_factory=list)
    protocol: int = 4  # MQTT protocol level of every client: 4 = 3.1.1, 5 = 5.0
    clients: int = 0  # conn: connections; p2p: pairs
    pubs: int = 0
    subs: int = 0
    qos: int = 0
    size: int = 64
    rate: float = 0.0  # per publisher msgs/s; 0 = max rate, closed loop
    window: int = 10  # QoS 1/2: unacknowledged PUBLISH per publisher
    e2e_window: int = 10  # max rate: messages per publisher not yet received by its subscribers; 0 = open loop
    duration: float = 10.0  # publish time, or hold time for conn
    conn_rate: float = 0.0  # new connections/s over all processes; 0 = as fast as possible
    max_pending: int = 64  # handshakes in flight per process
    connect_timeout: float = 10.0
    keepalive: int = 30
    client_prefix: str = "plexbench-"
    username: str = ""  # every client logs in with it ("": none), e.g. "bench@acme" for a tenant
    persistent_subs: bool = False  # subscribers connect with clean session 0 and ids stable across runs
    persistent_conns: bool = False  # conn: each connection asks for a session (clean session 0), new each run
    sub_identifier: int = 0  # 5.0: subscribers subscribe with this subscription identifier (0: none)
    topic_prefix: str = "bench"
    procs: int = 0  # 0: one per core (more when the fd limit needs more)
    source_addrs: int = -1  # -1: automatic above 25k connections; 0: never
    broker_pid: int | None = None
    drain: float = 10.0  # seconds to wait for late deliveries after publishing stops
    settle: float = 0.3  # pause between the last SUBACK and the first PUBLISH
    out: str | None = None
    max_samples: int = 1_000_000  # raw latency samples kept per process (decimated evenly beyond)
    progress: bool = True

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def connections(self) -> int:
        return self.clients if self.scenario == "conn" else self.pubs + self.subs

    def topic(self, pub: int) -> str:
        if self.scenario == "fanin":  # zero-padded: every packet the same length (see bench.bulk)
            return f"{self.topic_prefix}/{pub:0{len(str(max(self.pubs - 1, 0)))}d}"
        if self.scenario == "fanout":
            return f"{self.topic_prefix}/all"
        return f"{self.topic_prefix}/p2p/{pub}"

    def filter(self, sub: int) -> str:
        if self.scenario == "fanin":
            return f"{self.topic_prefix}/#"
        if self.scenario == "fanout":
            return f"{self.topic_prefix}/all"
        return f"{self.topic_prefix}/p2p/{sub}"

    def client_id(self, run_id: int, role: str, index: int) -> str:
        """A subscriber of --persistent-subs keeps its id from run to run (<prefix>s<i>, so its session
        is found again); every other client's id carries the run id, so runs never take each other's ids."""
        if self.persistent_subs and role == "s":
            return f"{self.client_prefix}s{index}"
        return f"{self.client_prefix}{run_id:08x}-{role}{index}"

    def clean_session(self, role: str) -> bool:
        return not (self.persistent_subs and role == "s" or self.persistent_conns and role == "c")

    def fan(self) -> int:
        """How many subscribers receive each published message."""
        return 1 if self.scenario == "p2p" else self.subs


def with_defaults(opts: Options) -> Options:
    """Fill in the scenario's usual client counts (those of mqload and emqtt-bench)."""
    if opts.scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {opts.scenario!r}: one of {', '.join(SCENARIOS)}")
    if opts.scenario == "conn" and not opts.clients:
        opts.clients = 1000
    if opts.scenario == "fanin":
        opts.pubs = opts.pubs or 100
        opts.subs = opts.subs or 1
    if opts.scenario == "fanout":
        opts.pubs = opts.pubs or 1
        opts.subs = opts.subs or 1000
    if opts.scenario == "p2p":
        opts.clients = opts.clients or 100
        opts.pubs = opts.subs = opts.clients
    return opts


@dataclass
class Share:
    """The clients one generator process owns (indices into the run's publishers/subscribers/clients)."""
    pubs: list[int] = field(default_factory=list)
    subs: list[int] = field(default_factory=list)
    conns: list[int] = field(default_factory=list)

    @property
    def sockets(self) -> int:
        return len(self.pubs) + len(self.subs) + len(self.conns)


def assign(opts: Options, procs: int, cap: int) -> list[Share]:
    """Spread the clients over `procs` processes, at most `cap` sockets each, balancing messages handled."""
    shares = [Share() for _ in range(procs)]
    if opts.scenario == "conn":
        for i in range(opts.clients):
            shares[i % procs].conns.append(i)
        return shares
    units: list[tuple[float, str, int]] = []  # (load, kind, index)
    if opts.scenario == "p2p":
        units = [(2.0, "pair", i) for i in range(opts.clients)]
    else:
        units = [(float(opts.pubs), "sub", i) for i in range(opts.subs)]  # it hears every publisher
        units += [(1.0, "pub", i) for i in range(opts.pubs)]
    units.sort(key=lambda u: -u[0])
    heap = [(0.0, 0, k) for k in range(procs)]  # (load, sockets, process)
    for load, kind, index in units:
        skipped = []
        while True:
            p_load, p_socks, k = heapq.heappop(heap)
            width = 2 if kind == "pair" else 1
            if p_socks + width <= cap or not heap:
                break
            skipped.append((p_load, p_socks, k))
        share = shares[k]
        if kind == "pair":
            share.pubs.append(index)
            share.subs.append(index)
        elif kind == "sub":
            share.subs.append(index)
        else:
            share.pubs.append(index)
        heapq.heappush(heap, (p_load + load, p_socks + width, k))
        for item in skipped:
            heapq.heappush(heap, item)
    return shares
