"""`python -m plexmq.acceptor.bridges`: the bridge process the acceptor starts where [bridges.NAME] tables are
declared (acceptor/supervisor.py), which runs them all and writes their state to the run dir once a
second (`bridges.status`) for `plexmq bridges`."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import uvloop

from plexmq.acceptor.bridges import local_client_id
from plexmq.acceptor.bridges.bridge import Bridge
from plexmq.acceptor.bridges.status import write
from plexmq.process import become_child, child_config

log = logging.getLogger("plexmq.bridge")

STATUS_INTERVAL = 1.0  # seconds between writes of the status file


async def run(config: dict) -> None:
    host, port = config["bridge_local"]
    logins = config["bridge_logins"]
    bridges = [Bridge(name, table, (host, port), logins[local_client_id(name)][0])
               for name, table in config["bridges"].items()]
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopped.set)
    tasks = [asyncio.ensure_future(bridge.run()) for bridge in bridges]
    path = os.path.join(os.path.dirname(config["config_path"]), "bridges.json")
    log.info("bridges started: %s", ", ".join(bridge.name for bridge in bridges))
    while not stopped.is_set():
        for task in tasks:
            if task.done():  # a bridge ended: a bug; the supervisor restarts the process
                task.result()
        write(path, {bridge.name: bridge.status() for bridge in bridges})
        try:
            await asyncio.wait_for(stopped.wait(), STATUS_INTERVAL)
        except TimeoutError:
            pass
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def main() -> None:
    config = child_config()
    become_child(config["parent_pid"], config["log_level"], config["log_format"], "bridge")
    uvloop.run(run(config))


if __name__ == "__main__":
    main()
