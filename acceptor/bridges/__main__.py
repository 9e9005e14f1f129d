"""`python -m plexmq.acceptor.bridges`: the bridge process the acceptor starts where [bridges.NAME] tables are
declared (acceptor/supervisor.py), which runs them all, applies a reload to each bridge it changes alone
(`Running.apply`), and writes their state to the run dir once a second (`bridges.status`) for `plexmq bridges`."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import orjson
import uvloop

from plexmq.acceptor.bridges.bridge import Bridge
from plexmq.bridge_status import local_client_id, write
from plexmq.process import become_child, child_config, missed_reload

log = logging.getLogger("plexmq.bridge")

STATUS_INTERVAL = 1.0  # seconds between writes of the status file


class Running:
    """The bridges running now, each in its task."""

    def __init__(self) -> None:
        self.bridges: dict[str, tuple[Bridge, asyncio.Task[None]]] = {}

    async def apply(self, config: dict) -> None:
        """Run the bridges of `config`: stop those it removes or changes (their token included), start
        those it adds or changes; the others keep running, their connections untouched."""
        local = config["bridge_local"][0], config["bridge_local"][1]
        wanted = {name: (table, config["bridge_logins"][local_client_id(name)][0])
                  for name, table in config["bridges"].items()}
        for name, (bridge, task) in list(self.bridges.items()):
            if wanted.get(name) == (bridge.table, bridge.token):
                continue
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            del self.bridges[name]
            log.info("bridge %s stopped: %s by a reload", name, "changed" if name in wanted else "removed")
        for name, (table, token) in wanted.items():
            if name not in self.bridges:
                bridge = Bridge(name, table, local, token)
                self.bridges[name] = bridge, asyncio.ensure_future(bridge.run())
        log.info("bridges running: %s", ", ".join(self.bridges) or "none")

    def check(self) -> None:
        """Raise what ended a bridge (a bug: the supervisor restarts the process)."""
        for _bridge, task in self.bridges.values():
            if task.done():
                task.result()

    async def stop(self) -> None:
        for _bridge, task in self.bridges.values():
            task.cancel()
        await asyncio.gather(*(task for _bridge, task in self.bridges.values()), return_exceptions=True)


async def run(config: dict) -> None:
    running = Running()
    wake = asyncio.Event()
    stopping, reload_wanted = False, False

    def on_signal(signum: signal.Signals) -> None:
        nonlocal stopping, reload_wanted
        if signum == signal.SIGTERM:
            stopping = True
        else:
            reload_wanted = True
        wake.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(signum, on_signal, signum)
    reload_wanted = missed_reload(config)
    await running.apply(config)
    path = os.path.join(os.path.dirname(config["config_path"]), "bridges.json")
    while not stopping:
        if reload_wanted:
            reload_wanted = False
            try:
                with open(config["config_path"], "rb") as f:
                    config = orjson.loads(f.read())
            except (OSError, orjson.JSONDecodeError) as exc:
                log.error("the bridges keep their config: %s", exc)
            else:
                await running.apply(config)
        running.check()
        write(path, {name: bridge.status() for name, (bridge, _task) in running.bridges.items()})
        wake.clear()
        try:
            await asyncio.wait_for(wake.wait(), STATUS_INTERVAL)
        except TimeoutError:
            pass
    await running.stop()


def main() -> None:
    config = child_config()
    become_child(config["parent_pid"], config["log_level"], config["log_format"], "bridge")
    uvloop.run(run(config))


if __name__ == "__main__":
    main()
