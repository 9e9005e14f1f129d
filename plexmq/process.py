"""What every plexmq child process does first: die with its parent, own its fd limit, log alike.

It lives in the router package because that is the bottom of the dependency chain
(acceptor -> workers -> router): every process can import it.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import resource
import signal
import sys
import time

import orjson
import psutil

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
WORKER_NAME = "plexmq-w"  # + its id: a worker's process name (a forked worker's command line is the acceptor's)
# a child's start: {"config_path": the config file the acceptor wrote, "parent_pid": the acceptor}; the
# config itself is read from the file (`child_config`): with many tenants declared it outgrows what one
# environment variable may hold (128 KiB on Linux)
CONFIG_ENV = "PLEXMQ_CONFIG"
STORE_FAILED = 3  # the router's exit status when it cannot open its store: restarting would not help
LINK_REFUSED = 4  # a node's worker's exit status when the router speaks another link protocol: nor would this
# the router's exit status when it lost its lease or could not renew it in time (a PostgreSQL store):
# not a crash, and restarted at once, it comes back as a standby
STEPPED_DOWN = 5

GC_YOUNG = 10_000  # allocations between collections of the youngest generation (CPython: 700)
LOG_FORMAT = "%(asctime)s %(levelname)s plexmq.{role}[%(process)d]: %(message)s"  # role: acceptor, router, worker-N


class JsonFormatter(logging.Formatter):
    """One JSON object per line for log shippers (`log_format = "json"`)."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record), "level": record.levelname, "process": self.role,
                 "pid": record.process, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class TextFormatter(logging.Formatter):
    """LOG_FORMAT, whose time's date and seconds are formatted once a second, not for every line (a
    connect storm writes a line per client: strftime was a quarter of each line's cost)."""

    def __init__(self, fmt: str) -> None:
        super().__init__(fmt)
        self._second = -1
        self._text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:  # called under the handler's lock: one line at a time
            self._second, self._text = second, time.strftime(self.default_time_format, self.converter(record.created))
        return f"{self._text},{int(record.msecs):03d}"  # as the stdlib's default_msec_format has it


def setup_logging(level: str, log_format: str = "text", role: str = "acceptor") -> None:
    """Every line names the process it comes from (`worker-3`), so one log tells the processes apart."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(role) if log_format == "json" else TextFormatter(LOG_FORMAT.format(role=role)))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    # what no line shows is not gathered for each record (the logging HOWTO's "Optimization"): with a line per
    # connect and disconnect, a connect storm writes one per client
    logging._srcfile = None  # the caller's file and line: a walk up the stack
    logging.logThreads = False
    logging.logMultiprocessing = False


def raise_fd_limit() -> int:
    """Set the soft open-file limit to the hard limit this process was given; return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


FD_RESERVE = 64  # a worker's descriptors besides its clients: ZeroMQ, the channel, logs, the archive


def connections_per_worker(fd_limit: int) -> int:
    """How many client connections one worker can hold under the open-file limit `fd_limit`."""
    return max(fd_limit - FD_RESERVE, 1)


def become_child(parent_pid: int, log_level: str, log_format: str, role: str) -> int:
    """Exit when the acceptor dies (even by SIGKILL), leave Ctrl-C to it; returns the fd limit."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    libc.prctl(PR_SET_NAME, process_name(role).encode()[:15], 0, 0, 0)  # what ps, top and psutil call it
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        sys.exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(log_level, log_format, role)
    return raise_fd_limit()


def hide_in_command_line(text: str, shown: str) -> None:
    """Show `shown` (as long as `text`) instead of `text` wherever this process's command line holds it:
    /proc/PID/cmdline, which `ps` shows any local user, reads the argv memory the kernel gave the
    process (CPython has copied it), and the workers forked later inherit the change. A secret on the
    command line is readable until this runs: PGPASSFILE or PGPASSWORD keep it off for good."""
    assert len(shown) == len(text), "the command line keeps its length"
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()  # from field 3 (state) on: proc(5)
    start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end, fields 48 and 49
    argv, old, new = ctypes.string_at(start, end - start), text.encode(), shown.encode()
    at = argv.find(old)
    while at >= 0 and old:
        ctypes.memmove(start + at, new, len(new))
        at = argv.find(old, at + len(old))


def own_run_dirs(module: str) -> list[str]:
    """The run dirs of this user's running `python -m MODULE` children (the router, the bridges), read from
    their environment: only this user's count, since another user's process could name our run dir."""
    found = []
    for proc in psutil.process_iter(["uids", "cmdline"]):
        uids, cmdline = proc.info["uids"], proc.info["cmdline"] or []
        if uids is None or uids.real != os.getuid() or cmdline[-2:] != ["-m", module]:
            continue
        try:
            config = orjson.loads(proc.environ().get(CONFIG_ENV, "{}"))
        except (psutil.Error, orjson.JSONDecodeError):
            continue  # gone, or not one of ours after all
        found.append(os.path.dirname(config.get("config_path", "")))
    return found


def process_name(role: str) -> str:
    """A child's process name (at most 15 bytes): plexmq-router, or plexmq-w<id> for role worker-<id>."""
    return WORKER_NAME + role[len("worker-"):] if role.startswith("worker-") else f"plexmq-{role}"


def named_worker(name: str) -> int | None:
    """The id of the worker a process name (`process_name`) says, or None for any other process."""
    return int(name[len(WORKER_NAME):]) if name.startswith(WORKER_NAME) else None


def settle_heap() -> None:
    """Once a process has started: its objects so far (modules, config, the loop) leave the collector's
    sight for good (`gc.freeze`), and the youngest generation is collected every GC_YOUNG allocations
    instead of 700. A connect storm makes objects that live as long as their clients; each collection
    walked them, and every full one all of startup's objects again (a worker's Python per CONNECT:
    18.6 µs as CPython sets it, 16.9 frozen, 14.1 frozen with GC_YOUNG, tests/connection_harness.py)."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *gc.get_threshold()[1:])


def leave_parent(keep: int, config_env: str) -> None:
    """First thing in a child forked (not exec'd) from the acceptor: none of the acceptor's descriptors but
    `keep` (and stdin, stdout, stderr) stays open (its listeners, lock, loop and the other workers' channels), its
    signal handlers and wakeup fd are undone (SIGHUP and SIGINT ignored, as an exec'd child starts), and the
    objects it inherited are frozen out of the collector, so none of them is ever finalized here (one would
    close a descriptor number this process has since reused)."""
    gc.freeze()
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    for signum in (signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    os.closerange(3, keep)
    os.closerange(keep + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    os.environ[CONFIG_ENV] = config_env


def child_env(config_path: str) -> str:
    """The value of CONFIG_ENV for the children of this (the acceptor's) process."""
    return orjson.dumps({"config_path": config_path, "parent_pid": os.getpid()}).decode()


def child_config() -> dict:
    """A router's or worker's config at its start: the file CONFIG_ENV names, with the acceptor's pid."""
    start = orjson.loads(os.environ[CONFIG_ENV])
    with open(start["config_path"], "rb") as f:
        return dict(orjson.loads(f.read()), parent_pid=start["parent_pid"])


def missed_reload(config: dict) -> bool:
    """Whether the acceptor rewrote the config file after this child was started: its SIGHUP came
    while the child still ignored it (before the handler was installed), so the child applies the
    file once now. Call it after installing the handler: a later rewrite is then signalled."""
    try:
        with open(config["config_path"], "rb") as f:
            written = orjson.loads(f.read())
    except (OSError, orjson.JSONDecodeError):
        return False  # the reload itself says why when it reads the file
    return written != {key: value for key, value in config.items() if key != "parent_pid"}


def process_usage(proc: psutil.Process) -> tuple[float, int]:
    """(CPU percent since the last call, RSS bytes) of a process, for a worker's report."""
    return proc.cpu_percent(), proc.memory_info().rss
