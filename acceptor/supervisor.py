"""Spawning, watching and restarting the router and the workers.

The router is a fresh interpreter (`python -m plexmq.router`); a worker is forked from the acceptor, which has
imported the worker's modules: a fresh interpreter costs 0.3 s of CPU to start, and a restart with --workers 8 and
100,000 clients waiting spent most of its CPU before the first CONNACK starting ten of them. Both read their config from
the environment; each dies with the acceptor (PR_SET_PDEATHSIG), so no orphan survives even a SIGKILL.
A child that dies is restarted at once and the reason logged; one that keeps dying stops the broker, and
so does one whose exit status says that a restart would not help (STORE_FAILED, LINK_REFUSED). A router
that stepped down (STEPPED_DOWN: it lost its lease) is restarted too, as a standby, and that is no crash:
a flapping database must not make the broker give up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable

from plexmq.process import CONFIG_ENV, LINK_REFUSED, STEPPED_DOWN, STORE_FAILED, child_env
from plexmq.workers import handoff

log = logging.getLogger("plexmq.acceptor")

CRASH_WINDOW = 30.0  # seconds
CRASH_LIMIT = 5  # restarts of one child within the window before the broker gives up
RESTART_DELAY = 0.1  # seconds before the first restart of a child; doubles with each crash in the window
RESTART_DELAY_MAX = 5.0
BRIDGES = "plexmq.acceptor.bridges"  # the module of the bridge process


class Child:
    """A router or worker process and, for a worker, the acceptor's end of its channel."""

    def __init__(self, name: str, worker_id: int | None, module: str = "plexmq.router") -> None:
        self.name = name
        self.worker_id = worker_id
        self.module = module  # what an exec'd child (not a worker) runs: the router, or the bridges (acceptor/bridges)
        self.proc: subprocess.Popen[bytes] | Forked | None = None
        self.channel: socket.socket | None = None
        self.reported = 0  # connections the worker last said it holds
        self.received = 0  # sockets it had received by then
        self.handed = 0  # sockets handed to this worker process so far
        self.crashes: deque[float] = deque()

    @property
    def load(self) -> int:
        """Connections held: the last report plus sockets still on their way (exact, not lagging)."""
        return self.reported + self.handed - self.received


class Forked:
    """A worker forked from this process, with what the supervisor asks of a `subprocess.Popen`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        return code

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _ignore_sighup() -> None:
    """In a new child before it runs Python: a reload's SIGHUP must not kill a child that has not yet
    installed its own handler, nor a terminal's Ctrl-C interrupt its imports (the acceptor stops it);
    an ignored signal stays ignored across exec."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class Supervisor:
    def __init__(self, config: dict, loop: asyncio.AbstractEventLoop, on_give_up: Callable[[str], None]) -> None:
        self.env = dict(os.environ)
        self.env[CONFIG_ENV] = child_env(config["config_path"])
        self.loop = loop
        self.on_give_up = on_give_up
        self.workers = [Child(f"worker {i}", i) for i in range(config["workers"])]
        # a node's router runs on another host
        self.children = self.workers if config["role"] == "node" else [Child("router", None), *self.workers]
        if config["bridges"]:
            self.children.append(Child("bridges", None, BRIDGES))
        self.stopping = False

    def start(self) -> None:
        for child in self.children:
            self._spawn(child)

    def _spawn(self, child: Child) -> None:
        if child.worker_id is None:
            child.proc = subprocess.Popen([sys.executable, "-m", child.module], env=self.env, preexec_fn=_ignore_sighup)
        else:
            # imported here, at the first start, not with this module: the listeners are bound by then, and
            # clients that come meanwhile wait in their backlog instead of being refused
            from plexmq.workers import worker

            mine, theirs = handoff.channel_pair()
            mine.setblocking(False)
            mask = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())  # none reaches the child
            try:  # before it has undone the acceptor's handlers (their wakeup fd is the acceptor's loop's)
                pid = os.fork()
                if pid == 0:
                    worker.forked(child.worker_id, theirs.fileno(), self.env[CONFIG_ENV], mask)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            child.proc = Forked(pid)
            theirs.close()
            child.channel = mine
            child.reported = child.received = child.handed = 0
            self.loop.add_reader(mine.fileno(), self._read_load, child)
        log.info("%s started (pid %d)", child.name, child.proc.pid)

    def reap(self) -> None:
        """Restart every child that has died (called on SIGCHLD)."""
        for child in self.children:
            proc = child.proc
            code = None if proc is None else proc.poll()
            if proc is None or code is None:
                continue
            reason = describe_exit(code)
            if self.stopping:
                continue
            if child.worker_id is None and code == STORE_FAILED:
                self.on_give_up("the router cannot open its store (see the line above)")
                return
            if child.worker_id is not None and code == LINK_REFUSED:
                self.on_give_up(f"the router refused {child.name}'s link (see the line above)")
                return
            if child.worker_id is None and code == STEPPED_DOWN:
                # its own line says why; a standby waits for the lease, so no delay beyond the first's
                log.info("router (pid %d) stepped down: restarting it as a standby", proc.pid)
                self._restart_later(child, RESTART_DELAY)
                continue
            now = time.monotonic()
            child.crashes.append(now)
            while child.crashes and now - child.crashes[0] > CRASH_WINDOW:
                child.crashes.popleft()
            if len(child.crashes) > CRASH_LIMIT:
                self.on_give_up(f"{child.name} died {len(child.crashes)} times in {CRASH_WINDOW:g} s (last: {reason})")
                return
            delay = min(RESTART_DELAY * 2 ** (len(child.crashes) - 1), RESTART_DELAY_MAX)
            log.error("%s (pid %d) %s: restarting it in %.1f s", child.name, proc.pid, reason, delay)
            self._restart_later(child, delay)

    def _restart_later(self, child: Child, delay: float) -> None:
        child.proc = None  # reaped: the next SIGCHLD must not see it again
        self._close_channel(child)
        self.loop.call_later(delay, self._restart, child)

    def _restart(self, child: Child) -> None:
        if self.stopping:
            return
        self._spawn(child)

    def reload(self, config: dict) -> None:
        """SIGHUP, the new `config` written: the running children re-read the file; those started from now
        on read it at their start, the bridge process too where the first bridges come with this reload
        (where the last go, it stays, running none)."""
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGHUP)
        if config["bridges"] and not any(child.module == BRIDGES for child in self.children):
            self.children.append(Child("bridges", None, BRIDGES))
            self._spawn(self.children[-1])

    def _read_load(self, child: Child) -> None:
        """Take the connection counts a worker reports; EOF means it is gone (SIGCHLD follows)."""
        while child.channel is not None:
            try:
                msg = child.channel.recv(64)
            except BlockingIOError:
                return
            except OSError:
                msg = b""
            if not msg:
                self._close_channel(child)
                return
            if msg[0] == handoff.LOAD:
                child.reported, child.received = handoff.LOAD_REPORT.unpack_from(msg, 1)

    def _close_channel(self, child: Child) -> None:
        if child.channel is not None:
            self.loop.remove_reader(child.channel.fileno())
            child.channel.close()
            child.channel = None

    def stop(self, timeout: float) -> None:
        """SIGTERM every child, wait up to `timeout` seconds, SIGKILL what is left."""
        self.stopping = True
        # the router first (it leads `children`): the workers that leave during its last turn are then
        # no news to it (router/main.py: `send`)
        children = [c.proc for c in self.children if c.proc is not None]
        for proc in children:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in children:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                log.warning("pid %d did not stop in time: killing it", proc.pid)
                proc.kill()
                proc.wait()
