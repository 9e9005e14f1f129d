"""The run dir after a broker killed with -9 (its config.json and admin token stay behind): the next
start removes them, and `plexmq status` and `plexmq clients` pointed at the broker by its config file
(`--config`) do not take them for a live broker's; both tools also take HOST:PORT, and say when
nothing listens there."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import psutil

from tests.cli import run, write
from tests.conftest import Broker, wait_for
from tests.mqtt import Client
from tests.processes import alive, config_of, descendants
from tests.steps import uid


def kill_hard(b: Broker) -> None:
    """SIGKILL the acceptor (its router and workers follow it) and wait until all of them are gone."""
    procs = [psutil.Process(b.proc.pid), *descendants(b)]
    b.proc.kill()
    b.proc.wait(10)
    wait_for(lambda: not any(alive(proc) for proc in procs), 10, "the killed broker's processes to be gone")


def said(command: str, *args: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `plexmq COMMAND ARGS`."""
    result = run(command, *args, timeout=30)
    return result.returncode, result.stdout, result.stderr


def test_status_and_clients_find_a_broker_by_its_config_file_and_not_a_killed_ones_leftovers(
        tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    run_dir = tmp_path / "run"
    # metrics_port = 0 (the tests' brokers take any free port): the tools read the port from the run dir
    config = write(tmp_path, f'run_dir = "{run_dir}"\nmetrics_port = 0\n')
    b = start_broker("--workers", "1", "--config", str(config))
    client_id = f"rd-{uid()}"
    client = Client(b.port, client_id)
    code, out, err = said("clients", "--config", str(config))
    assert code == 0 and [row.split()[0] for row in out.splitlines()[1:-1]] == [client_id], err
    wait_for(lambda: "clients 1 " in said("status", "--config", str(config), "--once")[1], 10,
             "status to show the client")  # once its worker has reported it
    (token,) = run_dir.glob("admin-*.token")
    port = token.name.removeprefix("admin-").removesuffix(".token")
    code, out, err = said("status", "--metrics", f"127.0.0.1:{port}", "--once")  # HOST:PORT, no http://
    assert code == 0 and "clients 1 " in out, err
    client.disconnect()

    kill_hard(b)
    assert {path.name for path in run_dir.iterdir()} >= {"config.json", token.name}  # what a kill leaves
    for command in ("status", "clients"):
        assert said(command, "--config", str(config)) == (1, "", (
            f"plexmq {command}: no running broker holds the run dir {run_dir} ({config}): what is there is a "
            "stopped one's\n"))
        assert said(command, "--metrics", f"127.0.0.1:{port}") == (1, "", f"plexmq {command}: nothing listens on "
                                                                          f"127.0.0.1:{port}\n")

    again = start_broker("--workers", "1", "--config", str(config))
    assert f"run dir {run_dir}: removed what a broker that did not stop left there: {token.name}, config.json" \
        in again.output()
    code, out, err = said("clients", "--config", str(config))
    assert code == 0 and out.splitlines()[-1] == "page 1 of 1, 0 clients", err
    again.stop()
    assert {path.name for path in run_dir.iterdir()} == {"run.lock"}  # a clean stop leaves nothing of its own


def test_a_killed_brokers_own_run_dir_is_removed_at_the_next_start(tmp_path: Path,
                                                                    start_broker: Callable[..., Broker]) -> None:
    """run_dir = "": a new one in TMPDIR (deploy/plexmq.service: /run/plexmq, outside the service's
    private /tmp), which a clean stop removes and a kill leaves."""
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    os.mkdir(env["TMPDIR"])
    b = start_broker("--workers", "1", env=env)
    run_dir = os.path.dirname(config_of(b.router())["config_path"])
    assert os.path.dirname(run_dir) == env["TMPDIR"]
    kill_hard(b)
    assert os.path.exists(os.path.join(run_dir, "config.json"))
    again = start_broker("--workers", "1", env=env)
    assert not os.path.exists(run_dir), os.listdir(run_dir)
    assert f"removed the run dir {run_dir} of a broker that did not stop" in again.output()
    again.stop()
    assert os.listdir(env["TMPDIR"]) == []


def test_a_run_dir_another_broker_holds_stops_startup_with_one_line(tmp_path: Path,
                                                                     start_broker: Callable[..., Broker]) -> None:
    config = write(tmp_path, f'run_dir = "{tmp_path / "run"}"\n')
    b = start_broker("--workers", "1", "--config", str(config))
    result = run("serve", "--config", str(config), "--port", "0", "--metrics-port", "-1", "--console-port", "-1",
                 "--data-dir", str(tmp_path / "other-data"))
    assert result.returncode == 1 and result.stderr.splitlines() == [
        f"plexmq: run dir {tmp_path / 'run'}: in use by another broker (pid {b.proc.pid})"], result.stderr


def test_without_a_broker_the_tools_say_that_nothing_listens() -> None:
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        for command in ("status", "clients"):
            assert said(command, "--metrics", f"127.0.0.1:{port}") == (
                1, "", f"plexmq {command}: nothing listens on 127.0.0.1:{port}\n")
