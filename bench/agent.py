"""One load-generator process: opens its share of the clients, publishes, counts, reports.

The controller runs several of these (forked) so that neither one core nor one process's open-file
limit caps the load. Each runs a uvloop loop and talks to the controller over a pipe: `connect`,
`start` (publish window in CLOCK_MONOTONIC ns), `finish`; it sends cumulative counters twice a
second. At max rate a publisher is held to an end-to-end window: subscriber processes send the
publisher's process a datagram of per-publisher delivery counts once per loop turn.
"""

from __future__ import annotations

import array
import asyncio
import errno
import os
import socket
from multiprocessing.connection import Connection
from time import monotonic_ns

from plexmq.bench import limits
from plexmq.bench.client import DISCONNECT, PINGREQ, Client, Publisher, Subscriber
from plexmq.bench.connector import READY, Connector, Raw
from plexmq.bench.plan import Options, Share
from plexmq.bench.rawout import LatencySamples

BATCH = 64  # messages per publisher per loop turn at max rate
TICK = 0.001  # rate-limited publishing: seconds between scheduling rounds
STATS_EVERY = 0.5
E2E_STALL_NS = 500_000_000  # an end-to-end window full this long: its messages are taken as lost
RECEIPT_PAIRS = 4096  # (publisher, count) pairs per datagram


class Agent:
    """The state of one generator process; clients call back into it."""

    def __init__(self, index: int, opts: Options, share: Share, owners: list[int], run_id: int,
                 pipe: Connection, rx: socket.socket, txs: list[socket.socket], sources: list[str]) -> None:
        self.index = index
        self.opts = opts
        self.share = share
        self.owners = owners  # publisher index -> generator process that owns it
        self.run_id = run_id
        self.pipe = pipe
        self.rx = rx
        self.txs = txs
        self.sources = sources
        self.loop = asyncio.get_running_loop()
        self.window = opts.window
        self.e2e = opts.e2e_window if opts.rate == 0 and opts.scenario != "conn" else 0
        self.fan = max(opts.fan(), 1)
        self.chunk = max(1, self.e2e // 4)  # refill an end-to-end window in chunks: fewer, larger writes
        # counters (cumulative; the controller takes differences)
        self.sent = self.acked = self.received = self.dups = self.reordered = self.foreign = 0
        self.connected = self.failed = self.dropped = self.not_attempted = 0
        self.pings = self.pongs = self.e2e_resets = self.protocol_errors = 0
        self.errors: dict[str, int] = {}
        self.notes: list[str] = []
        self.hist: dict[int, int] = {}
        self.receipts: dict[int, int] = {}
        self.samples = LatencySamples(opts.max_samples) if opts.out else None
        self.t_first_ns = self.t_ready_ns = 0
        self.recv_at_end = self.sent_at_end = -1
        # I/O state
        self.dirty: list[Client] = []
        self.flush_scheduled = False
        self.pump_scheduled = False
        self.ready_pubs: list[Publisher] = []
        self.publishing = False
        self.closing = False
        self.stop_opening = False
        self.commands: asyncio.Queue[tuple] = asyncio.Queue()
        self.clients: list[Client] = []
        self.idle: list[Raw] = []
        self.pubs: dict[int, Publisher] = {}
        self.pending_receipts: dict[int, dict[int, int]] = {}

    # -- the run, phase by phase ------------------------------------------------------------------

    async def main(self) -> None:
        self.loop.add_reader(self.pipe.fileno(), self._on_command)
        self.rx.setblocking(False)
        self.loop.add_reader(self.rx.fileno(), self._on_receipts)
        self._report("hello", fd_limit=limits.raise_fd_limit(), pid=os.getpid())
        self._stats_timer()
        await self._expect("connect")
        if self.opts.keepalive:  # from the start: a long connect phase must not idle the first clients out
            self.loop.call_later(1.0, self._ping_sweep, 0)
        await self.connect_all()
        self._report("connected")
        _, t_start, t_end = await self._expect("start")
        self.loop.call_later(max(0.0, (t_start - monotonic_ns()) / 1e9), self._start)
        self.loop.call_later(max(0.0, (t_end - monotonic_ns()) / 1e9), self._stop)
        self.t_start = t_start
        await self._expect("finish")
        self.closing = True
        self.publishing = False
        self._flush()
        for c in self.clients:
            if c.transport is not None:
                c.transport.write(DISCONNECT)
                c.transport.close()
        for raw in self.idle:
            if raw.state == READY:
                raw.ping(DISCONNECT)
            raw.close()
        await asyncio.sleep(0.05)
        samples_file = None
        if self.samples is not None and self.opts.out and len(self.samples.sub):  # (samples: only with --out)
            samples_file = self.samples.write(self.opts.out, self.run_id, self.index)
        self._report("final", hist=self.hist, errors=self.errors, notes=self.notes, samples_file=samples_file)

    async def _expect(self, what: str) -> tuple:
        while True:
            cmd = await self.commands.get()
            if cmd[0] == what:
                return cmd

    def _on_command(self) -> None:
        while self.pipe.poll():
            try:
                self.commands.put_nowait(self.pipe.recv())
            except EOFError:  # the controller is gone: stop
                self.loop.remove_reader(self.pipe.fileno())
                os._exit(3)

    def _report(self, kind: str, **extra: object) -> None:
        self.pipe.send((kind, self.index, self.snapshot(), extra))

    def snapshot(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in (
            "sent", "acked", "received", "dups", "reordered", "foreign", "connected", "failed", "dropped",
            "not_attempted", "pings", "pongs", "e2e_resets", "protocol_errors", "t_first_ns", "t_ready_ns",
            "recv_at_end", "sent_at_end")}

    def _stats_timer(self) -> None:
        if not self.closing:
            self._report("stats")
            self.loop.call_later(STATS_EVERY, self._stats_timer)

    # -- connecting -------------------------------------------------------------------------------

    async def connect_all(self) -> None:
        share, opts = self.share, self.opts
        gid_sub = opts.pubs  # subscribers come after the publishers in the global numbering
        subs = [Subscriber(self, i, gid_sub + i) for i in share.subs]
        pubs = [Publisher(self, i, i) for i in share.pubs]
        self.pubs = {p.index: p for p in pubs}
        self.clients = [*subs, *pubs]  # subscribers first: they must be listening before anyone publishes
        self.connector = Connector(self, [], opts.conn_rate / max(opts.procs, 1), opts.max_pending,
                                   opts.connect_timeout, self.sources)
        for c in self.clients:
            c.raw = Raw(self.connector, c, c.index, c.gid)
        self.idle = [Raw(self.connector, None, i, i) for i in share.conns]
        self.connector.raws = [c.raw for c in self.clients] + self.idle
        self.t_first_ns = monotonic_ns()
        await self.connector.run()

    def connect_error(self, exc: OSError) -> None:
        """A socket call failed: say so once when it is a limit that stops every further connection."""
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            self.stop_opening = True
            self.note(f"LIMIT: generator process {self.index} ran out of file descriptors "
                      f"(RLIMIT_NOFILE {limits.raise_fd_limit()}) after {self.connected} connections: use more --procs")
        elif exc.errno == errno.EADDRNOTAVAIL:
            self.stop_opening = True
            self.note("LIMIT: out of ephemeral ports (EADDRNOTAVAIL): spread over more source addresses (--source-addrs)")

    def on_ready(self, client: Client | None) -> None:
        """A connection is ready: CONNACK for an idle one, SUBACK for a subscriber."""
        self.connected += 1
        self.t_ready_ns = monotonic_ns()
        if client is not None:
            client.ready = True
            client.raw.state = READY
            self.connector.finished(client.raw)

    def count_failure(self, kind: str) -> None:
        self.failed += 1
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def fail(self, client: Client, kind: str) -> None:
        """A publisher or subscriber that did not get ready: counted by cause, closed."""
        client.raw.fail(kind)

    def lost(self, client: Client, exc: Exception | None) -> None:
        if self.closing:
            return
        if client.ready:
            self.dropped += 1
            kind = "dropped" if exc is None else f"dropped_{type(exc).__name__}"
            self.errors[kind] = self.errors.get(kind, 0) + 1
            client.ready = False
        else:
            name = errno.errorcode.get(exc.errno or 0) if isinstance(exc, OSError) else None
            client.raw.fail(name or "closed_in_handshake")

    def dropped_idle(self, raw: Raw, kind: str) -> None:
        if self.closing:
            return
        self.dropped += 1
        self.errors[f"dropped_{kind}"] = self.errors.get(f"dropped_{kind}", 0) + 1

    def protocol_error(self, client: Client, reason: str) -> None:
        self.protocol_errors += 1
        self.errors["protocol_error"] = self.errors.get("protocol_error", 0) + 1
        self.note(f"protocol error on {client.client_id}: {reason}")
        if client.transport is not None:
            client.transport.abort()

    def note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < 20:
            self.notes.append(text)

    # -- keepalive --------------------------------------------------------------------------------

    def _ping_sweep(self, cursor: int) -> None:
        """Ping each client once per keepalive/2, a slice per second (one sweep, no per-client timer)."""
        if self.closing:
            return
        everyone: list = self.clients + self.idle
        if everyone:
            per_tick = max(1, int(len(everyone) / max(self.opts.keepalive / 2, 1)) + 1)
            for c in everyone[cursor:cursor + per_tick]:
                if type(c) is Raw:
                    if c.state == READY and c.ping(PINGREQ):
                        self.pings += 1
                elif c.ready and c.transport is not None:
                    c.send(PINGREQ)
                    self.pings += 1
            cursor += per_tick
            if cursor >= len(everyone):  # the next tick starts the next round from the top
                cursor = 0
        self.loop.call_later(1.0, self._ping_sweep, cursor)

    # -- publishing -------------------------------------------------------------------------------

    def _start(self) -> None:
        if not self.pubs:
            return
        self.publishing = True
        now = monotonic_ns()
        if self.opts.rate:
            count = max(self.opts.pubs, 1)
            for p in self.pubs.values():  # spread the publishers' sends over one period
                p.phase_ns = int(p.index / count * 1e9 / self.opts.rate)
            self._tick()
        else:
            for p in self.pubs.values():
                p.progress_ns = now
                self.wake(p)
            if self.e2e:
                self._stall_check()

    def _stop(self) -> None:
        self.publishing = False
        self.recv_at_end = self.received
        self.sent_at_end = self.sent
        self._report("stats")  # at once: the controller's drain waits for every process's final `sent`

    def wake(self, client: Client) -> None:
        """A client may send again (acks, receipts, resumed socket): pump it next turn."""
        if not self.publishing or self.opts.rate or type(client) is not Publisher:
            return
        p: Publisher = client
        if not p.queued and p.credit() >= self.chunk:
            p.queued = True
            self.ready_pubs.append(p)
            if not self.pump_scheduled:
                self.pump_scheduled = True
                self.loop.call_soon(self._pump)

    def _pump(self) -> None:
        """Max rate: every publisher with credit sends up to BATCH messages this turn."""
        self.pump_scheduled = False
        ready, self.ready_pubs = self.ready_pubs, []
        if not self.publishing:
            for p in ready:
                p.queued = False
            return
        now = monotonic_ns()
        for p in ready:
            p.queued = False
            if p.paused or p.transport is None:
                continue
            n = p.credit()
            if n > 0:
                p.emit(min(n, BATCH), now)
                if n > BATCH:
                    self.wake(p)

    def _tick(self) -> None:
        """Fixed rate: send what each publisher is due by now (within its QoS window)."""
        if not self.publishing:
            return
        now = monotonic_ns()
        elapsed = now - self.t_start
        rate, window = self.opts.rate, self.window
        for p in self.pubs.values():
            if p.paused or p.transport is None or elapsed < p.phase_ns:
                continue
            n = int((elapsed - p.phase_ns) * rate / 1e9) + 1 - p.seq
            if p.qos:
                n = min(n, window - p.unacked)
            if n > 0:
                p.emit(n, now)
        self.loop.call_later(TICK, self._tick)

    def _stall_check(self) -> None:
        """Max rate, end-to-end window: a window stuck full for 500 ms is written off (the broker dropped)."""
        if not self.publishing:
            return
        now = monotonic_ns()
        for p in self.pubs.values():
            if p.inflight() >= self.e2e and now - p.progress_ns > E2E_STALL_NS:
                p.reset_base += p.inflight()
                p.progress_ns = now
                self.e2e_resets += 1
                self.wake(p)
        self.loop.call_later(0.1, self._stall_check)

    # -- writes and receipts, once per loop turn --------------------------------------------------

    def schedule_flush(self) -> None:
        self.flush_scheduled = True
        self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self.flush_scheduled = False
        dirty, self.dirty = self.dirty, []
        for c in dirty:
            out, c.out = c.out, []
            if c.transport is not None:
                c.transport.write(out[0] if len(out) == 1 else b"".join(out))
        if self.receipts:
            self._send_receipts()

    def _send_receipts(self) -> None:
        """Local receipts credit at once; another process's go as one datagram per loop turn (it
        wakes that process: ~25 µs, but delaying it lengthens the closed loop and costs more)."""
        receipts, self.receipts = self.receipts, {}
        owners, me, pending = self.owners, self.index, self.pending_receipts
        for pub, n in receipts.items():
            owner = owners[pub]
            if owner == me:
                self._credit(pub, n)
            else:
                box = pending.setdefault(owner, {})
                box[pub] = box.get(pub, 0) + n
        for owner, box in list(pending.items()):
            pairs = array.array("I")
            for pub, n in box.items():
                pairs.append(pub)
                pairs.append(n)
            for i in range(0, len(pairs), 2 * RECEIPT_PAIRS):
                try:
                    self.txs[owner].send(pairs[i:i + 2 * RECEIPT_PAIRS].tobytes())
                except BlockingIOError:  # the peer is behind: keep what is unsent, retry shortly
                    rest = pairs[i:]
                    pending[owner] = dict(zip(rest[::2], rest[1::2]))
                    self.loop.call_later(0.001, self._send_receipts)
                    break
            else:
                del pending[owner]

    def _on_receipts(self) -> None:
        while True:
            try:
                data = self.rx.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                return
            pairs = array.array("I")
            pairs.frombytes(data)
            for i in range(0, len(pairs), 2):
                self._credit(pairs[i], pairs[i + 1])

    def _credit(self, pub: int, n: int) -> None:
        p = self.pubs.get(pub)
        if p is not None:
            p.delivered += n
            p.progress_ns = monotonic_ns()
            self.wake(p)


def run(index: int, opts: Options, share: Share, owners: list[int], run_id: int, pipe: Connection,
        rx: socket.socket, txs: list[socket.socket], sources: list[str]) -> None:
    """The generator process's entry point (forked by the controller)."""
    import uvloop

    async def main() -> None:
        await Agent(index, opts, share, owners, run_id, pipe, rx, txs, sources).main()

    uvloop.run(main())
