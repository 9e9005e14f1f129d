"""The command line and the config: `--help`, TOML errors (one line: file, line, key), precedence,
`python -m plexmq.acceptor` versus the `plexmq` console script, and `acceptor.config.load` itself."""

from __future__ import annotations

import os
import re
import resource
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from plexmq.acceptor import config as cfg
from tests.cli import names_line, one_error_line, run, write
from tests.conftest import Broker, free_port

# -- the program ------------------------------------------------------------------------------------


def test_help() -> None:
    top = run("--help")
    assert top.returncode == 0, top.stderr
    assert "serve" in top.stdout
    serve = run("serve", "--help")
    assert serve.returncode == 0, serve.stderr
    for option in ("--host", "--port", "--workers", "--config", "--log-level"):
        assert option in serve.stdout, f"{option} missing from `serve --help`:\n{serve.stdout}"


def test_console_script_is_the_same_program() -> None:
    script = shutil.which("plexmq")
    if script is None:
        pytest.skip("the plexmq console script is not installed (pip install .)")
    for args in (["--help"], ["serve", "--help"], ["serve", "--port", "-1"]):
        ours = run(*args)
        theirs = subprocess.run([script, *args], capture_output=True, text=True, timeout=15)
        assert (theirs.returncode, theirs.stdout) == (ours.returncode, ours.stdout), args
        assert theirs.stderr.replace("plexmq", "P") == ours.stderr.replace("plexmq", "P"), args


# -- errors in the file -----------------------------------------------------------------------------


ERRORS = [  # (file text, the key the message must name, its line)
    pytest.param("# settings\nport = 0\n\nbogus_key = 3\n", "bogus_key", 4, id="unknown-key"),
    pytest.param('port = "x"\n', "port", 1, id="port-string"),
    pytest.param("port = 0\nmax_inflight = 0\n", "max_inflight", 2, id="max_inflight-0"),
    pytest.param("port = 70000\n", "port", 1, id="port-range"),
    pytest.param("port = true\n", "port", 1, id="port-bool"),
    pytest.param("workers = -1\n", "workers", 1, id="workers-negative"),
    pytest.param('log_level = "loud"\n', "log_level", 1, id="log_level-choice"),
    pytest.param("port = 0\nconnect_timeout = 0\n", "connect_timeout", 2, id="connect_timeout-0"),
    pytest.param("port = 0\nenabled = true\n", "enabled", 2, id="archive-key-at-top"),
    pytest.param("port = 0\n[archive]\nenabled = true\nbogus = 1\n", "bogus", 4, id="archive-unknown-key"),
    pytest.param("port = 0\n[archive]\ntopics = [1, 2]\n", "topics", 3, id="archive-topics-type"),
    pytest.param('port = 0\n[archive]\nroll_bytes = "big"\n', "roll_bytes", 3, id="archive-roll_bytes-type"),
    # an unknown section is an unknown key too
    pytest.param("port = 0\n\n[nosuch]\nx = 1\n", "nosuch", 3, id="unknown-section"),
    # a dotted key is TOML for a key of that section
    pytest.param('port = 0\narchive.enabled = "yes"\n', "enabled", 2, id="archive-dotted-key"),
]


@pytest.mark.parametrize("text,key,line", ERRORS)
def test_bad_file_stops_startup_with_one_line(tmp_path: Path, text: str, key: str, line: int) -> None:
    path = write(tmp_path, text)
    message = one_error_line(run("serve", "--config", str(path)))
    assert str(path) in message, message
    assert key in message, message
    assert names_line(message, path, line), f"line {line} not named: {message}"


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "port = 0\nworkers = = 2\n")
    message = one_error_line(run("serve", "--config", str(path)))
    assert str(path) in message, message
    assert "2" in message.replace(str(path), ""), f"the line of the syntax error is not named: {message}"


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    message = one_error_line(run("serve", "--config", str(path)))
    assert str(path) in message, message


# -- errors on the command line ---------------------------------------------------------------------


@pytest.mark.parametrize("args,option", [(["--port", "-1"], "--port"), (["--port", "65536"], "--port"),
                                         (["--workers", "-1"], "--workers")])
def test_bad_command_line_value_gives_one_line(args: list[str], option: str) -> None:
    message = one_error_line(run("serve", *args))
    assert option in message, message
    assert args[1] in message, message


def test_bad_command_line_value_wins_over_a_good_file(tmp_path: Path) -> None:
    path = write(tmp_path, "port = 0\n")
    message = one_error_line(run("serve", "--config", str(path), "--port", "-1"))
    assert "--port" in message, message


# -- precedence, on a running broker ----------------------------------------------------------------


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def test_command_line_wins_over_the_file(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    file_port = free_port()
    path = write(tmp_path, f'host = "127.0.0.1"\nport = {file_port}\nworkers = 1\n')
    b = start_broker("--config", str(path))  # the fixture adds --port with another free port
    assert b.port != file_port
    assert listening(b.port)
    assert not listening(file_port), "the broker also (or instead) listens on the file's port"
    assert len(b.workers()) == 1, "the file's other keys were not applied"
    assert f":{b.port}" in b.output() and f":{file_port}" not in b.output()


# -- acceptor.config.load ---------------------------------------------------------------------------


def test_load_defaults() -> None:
    config = cfg.load(None, {})
    assert config == cfg.defaults()
    expected: dict[str, Any] = {"host": "127.0.0.1", "port": 1883, "workers": 0, "log_level": "info",
                                "connect_timeout": 10.0, "max_packet_size": 1 << 20, "max_inflight": 20,
                                "max_queued_messages": 1000}
    assert {k: config[k] for k in expected} == expected
    assert config["archive"]["enabled"] is False
    assert config["archive"]["topics"] == ["#"]


def test_load_does_not_share_mutable_defaults() -> None:
    first = cfg.load(None, {})
    first["archive"]["topics"].append("mutated")
    first["archive"]["enabled"] = True
    second = cfg.load(None, {})
    assert second["archive"]["topics"] == ["#"]
    assert second["archive"]["enabled"] is False
    assert cfg.defaults()["archive"]["topics"] == ["#"]


def test_load_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'host = "0.0.0.0"\nport = 2883\nconnect_timeout = 3\nmax_inflight = 5\n'
                           'log_level = "debug"\nallow_anonymous = true\n')
    config = cfg.load(str(path), {})
    assert (config["host"], config["port"], config["max_inflight"], config["log_level"]) == ("0.0.0.0", 2883, 5, "debug")
    assert config["connect_timeout"] == 3.0 and isinstance(config["connect_timeout"], float)
    assert config["workers"] == 0 and config["max_queued_messages"] == 1000  # untouched keys keep defaults


def test_load_overrides_win(tmp_path: Path) -> None:
    path = write(tmp_path, "port = 2883\nworkers = 3\n")
    config = cfg.load(str(path), {"port": 3883, "host": "::1"})
    assert (config["port"], config["workers"], config["host"]) == (3883, 3, "::1")


def test_load_archive_section(tmp_path: Path) -> None:
    path = write(tmp_path, '[archive]\nenabled = true\ntopics = ["sensors/#", "alerts/+"]\nroll_bytes = 2048\n'
                           "roll_seconds = 5\n")
    archive = cfg.load(str(path), {})["archive"]
    assert archive["enabled"] is True
    assert archive["topics"] == ["sensors/#", "alerts/+"]
    assert archive["roll_bytes"] == 2048
    assert archive["roll_seconds"] == 5.0
    assert archive["dir"] == cfg.defaults()["archive"]["dir"]


@pytest.mark.parametrize("text,key,line", ERRORS)
def test_load_errors_name_file_line_and_key(tmp_path: Path, text: str, key: str, line: int) -> None:
    path = write(tmp_path, text)
    with pytest.raises(cfg.ConfigError) as err:
        cfg.load(str(path), {})
    message = str(err.value)
    assert "\n" not in message
    assert str(path) in message and key in message, message
    assert names_line(message, path, line), f"line {line} not named: {message}"


@pytest.mark.parametrize("overrides,option", [({"port": -1}, "--port"), ({"workers": 5000}, "--workers"),
                                              ({"log_level": "loud"}, "--log-level")])
def test_load_bad_override(overrides: dict[str, Any], option: str) -> None:
    with pytest.raises(cfg.ConfigError, match=re.escape(option)):
        cfg.load(None, overrides)


def test_load_invalid_toml_and_missing_file(tmp_path: Path) -> None:
    path = write(tmp_path, "port = [\n")
    with pytest.raises(cfg.ConfigError, match=re.escape(str(path))):
        cfg.load(str(path), {})
    with pytest.raises(cfg.ConfigError, match=re.escape(str(tmp_path / "nope.toml"))):
        cfg.load(str(tmp_path / "nope.toml"), {})


@pytest.mark.parametrize("text", ['host = "0.0.0.0"\n', 'host = "192.0.2.1"\n', 'host = "broker.example"\n',
                                  '[websocket]\nenabled = true\nhost = "::"\n'])
def test_without_authentication_only_loopback(tmp_path: Path, text: str) -> None:
    """The safe default: no password file and no allow_anonymous keeps every listener on loopback."""
    with pytest.raises(cfg.ConfigError, match="listening beyond loopback needs authentication"):
        cfg.load(str(write(tmp_path, text)), {})
    users = tmp_path / "users"
    users.write_text("# nobody yet\n")
    for also in ('allow_anonymous = true\n', f'password_file = "{users}"\n'):
        cfg.load(str(write(tmp_path, also + text)), {})


def test_loopback_needs_no_authentication(tmp_path: Path) -> None:
    for host in ("127.0.0.1", "127.0.0.5", "::1", "localhost"):
        assert cfg.load(None, {"host": host})["host"] == host


def test_startup_says_who_may_connect(tmp_path: Path, broker: Broker) -> None:
    assert "no authentication configured: listening on loopback only" in broker.output()
    users = tmp_path / "users"
    users.write_text("# nobody yet\n")
    line = cfg.security_line(cfg.load(str(write(tmp_path, f'password_file = "{users}"\nacl_file = ""\n')), {}))
    assert line == f"authentication: password file {users}; anonymous clients refused; ACL: none (all topics)"
    database = cfg.load(str(write(tmp_path, 'auth_database = "mysql://u:s3cret@db:3306/mqtt"\n'
                                            'auth_database_acl = true\nallow_anonymous = true\n')), {})
    assert cfg.security_line(database) == ("authentication: database (auth_database); anonymous clients allowed; "
                                           "ACL: the database's ACL")  # and never its password


def test_max_connections_picks_enough_workers_or_says_so(start_broker: Callable[..., Broker]) -> None:
    """Each worker holds what the open-file limit leaves it: more connections need more workers."""
    from plexmq.process import connections_per_worker

    per_worker = connections_per_worker(resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    wanted = per_worker + 1  # one more than a worker can hold: two workers
    b = start_broker("--max-connections", str(wanted))
    expected = max((os.cpu_count() or 2) - 1, 2)  # the cores' default, or the two it takes
    assert re.search(rf"listening on \S+ with {expected} workers", b.output()), b.output()
    assert "needs --workers" not in b.output()
    one = start_broker("--workers", "1", "--max-connections", str(wanted))
    assert f"1 worker: at most {per_worker} connections" in one.output(), one.output()
    assert f"max_connections {wanted} needs --workers 2" in one.output()
