"""deploy/: the documented config file holds every key with its default, the systemd unit has what
production needs (and `systemd-analyze verify` accepts it where it is installed), the Docker and
compose files agree with the config and the unit, and the image's `pip install .` ships every package."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest

from plexmq.acceptor import config as cfg
from plexmq.router.console.app import ASSETS
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
CONFIG = DEPLOY / "plexmq.toml"
UNIT = DEPLOY / "plexmq.service"
SECTION = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$")


def assignments(text: str) -> dict[tuple[str, str], int]:
    """(section, key) -> 0-based line index of every `key = value` line, active or commented out."""
    found: dict[tuple[str, str], int] = {}
    section = ""
    lines = text.splitlines()
    for index, line in enumerate(lines):
        header = SECTION.match(line)
        if header:
            section = header.group(1)
            continue
        match = re.match(r"^\s*#?\s*\"?([A-Za-z0-9_-]+)\"?\s*=", line)
        if match:
            found.setdefault((section, match.group(1)), index)
    return found


def test_the_config_file_loads_to_exactly_the_defaults() -> None:
    assert cfg.load(str(CONFIG), {}) == cfg.defaults()


@pytest.mark.parametrize("section,key", [(s, k) for s, options in cfg.SCHEMA.items() for k in options],
                         ids=lambda v: v or "top")
def test_every_key_of_the_schema_is_in_the_file_with_a_comment_right_above(section: str, key: str) -> None:
    text = CONFIG.read_text()
    lines = text.splitlines()
    found = assignments(text)
    name = f"{section}.{key}" if section else key
    assert (section, key) in found, f"deploy/plexmq.toml lacks `{name}`: document it (comment above, default as value)"
    above = lines[found[(section, key)] - 1].strip() if found[(section, key)] else ""
    assert above.startswith("#") and not re.match(r"^#\s*\"?[A-Za-z0-9_-]+\"?\s*=", above), (
        f"`{name}` in deploy/plexmq.toml needs a comment line right above it (what it does, unit, default)")


def test_the_comment_of_every_key_states_its_default() -> None:
    text = CONFIG.read_text()
    lines = text.splitlines()
    for (_section, key), index in assignments(text).items():
        block = []
        for line in reversed(lines[:index]):
            if not line.strip().startswith("#"):
                break
            block.append(line)
        assert any("Default:" in line for line in block), f"the comment of `{key}` says no `Default:`"


def test_the_file_has_exactly_the_sections_of_the_schema() -> None:
    text = CONFIG.read_text()
    sections = {m.group(1) for m in map(SECTION.match, text.splitlines()) if m}
    assert sections == {s for s in cfg.SCHEMA if s}


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string(UNIT.read_text())
    return parser


def unit_values(section: str, key: str, path: Path = UNIT) -> list[str]:
    """Every value of a key that systemd allows to repeat (configparser keeps only the last)."""
    values, current = [], ""
    for line in path.read_text().splitlines():
        header = SECTION.match(line)
        if header:
            current = header.group(1)
        elif current == section and line.startswith(f"{key}="):
            values.append(line.split("=", 1)[1].strip())
    return values


def test_the_systemd_unit_has_the_required_directives() -> None:
    service = unit()["Service"]
    assert service["Type"] == "simple"  # the broker does not speak sd_notify
    assert service["ExecStart"] == "/usr/local/bin/plexmq serve --config /etc/plexmq/plexmq.toml"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["Restart"] == "on-failure"
    assert service["User"] == "plexmq" and service["Group"] == "plexmq"
    assert service["LimitNOFILE"] == "1048576"
    assert service["KillSignal"] == "SIGTERM"
    assert int(service["TimeoutStopSec"]) >= 5  # the broker stops within 5 s
    assert service["StateDirectory"] == "plexmq"
    for hardening, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                             ("PrivateTmp", "yes"), ("CapabilityBoundingSet", "")):
        assert service[hardening] == value, hardening
    writable = [path.lstrip("-") for value in unit_values("Service", "ReadWritePaths") for path in value.split()]
    assert "/var/lib/plexmq" in writable
    assert any("archive" in path for path in writable)
    assert unit()["Install"]["WantedBy"] == "multi-user.target"


def test_the_unit_keeps_the_run_dir_where_plexmq_clients_outside_the_service_reads_it() -> None:
    """PrivateTmp gives the service a /tmp of its own: a run dir there hides the admin token from
    `plexmq clients` run as the broker's user outside the service."""
    service = unit()["Service"]
    assert service["RuntimeDirectory"] == "plexmq"
    assert "TMPDIR=/run/plexmq" in unit_values("Service", "Environment")  # where a run dir of its own is made
    assert "5.0" in unit()["Unit"]["Description"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path: Path) -> None:
    # verify insists that ExecStart's program exists: point it at one that does
    text = UNIT.read_text().replace("/usr/local/bin/plexmq", shutil.which("plexmq") or sys.executable)
    copy = tmp_path / "plexmq.service"
    copy.write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", str(copy)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0 and "plexmq.service" not in result.stderr, result.stderr


def test_the_dockerfile_runs_the_documented_config_as_a_non_root_user() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.MULTILINE)
    assert re.search(r"^COPY deploy/plexmq\.toml /etc/plexmq/plexmq\.toml$", text, re.MULTILINE)
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^EXPOSE 1883$", text, re.MULTILINE)
    assert re.search(r"^ARG WITH_PIPELINE=0$", text, re.MULTILINE)
    cmd = re.findall(r"^CMD (.+)$", text, re.MULTILINE)
    assert cmd and '"--host", "0.0.0.0"' in cmd[-1] and "/etc/plexmq/plexmq.toml" in cmd[-1]


def test_the_compose_file_has_the_broker_and_a_spark_cluster_and_its_config_loads(tmp_path: Path) -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"plexmq", "spark-master", "spark-worker"} <= set(services)
    broker = services["plexmq"]
    assert broker["ulimits"]["nofile"]["hard"] >= 100_000
    archive = next(v.split(":")[1] for v in broker["volumes"] if v.startswith("plexmq-archive:"))
    for spark in ("spark-master", "spark-worker"):  # same path for the driver and the executors
        assert any(v.split(":")[:2] == ["plexmq-archive", archive] for v in services[spark]["volumes"]), spark
    assert "spark://spark-master:7077" in services["spark-worker"]["command"]
    inline = tmp_path / "plexmq.toml"
    inline.write_text(compose["configs"]["plexmq-config"]["content"])
    loaded = cfg.load(str(inline), {})
    assert loaded["archive"]["enabled"] and loaded["archive"]["dir"] == archive


@pytest.mark.parametrize("role", ["router", "node"])
def test_the_role_drop_ins_replace_the_command_with_their_role(role: str) -> None:
    """An empty ExecStart= first, or systemd would refuse a second command for a simple service."""
    drop_in = DEPLOY / f"plexmq-{role}.conf"
    assert unit_values("Service", "ExecStart", drop_in) == [
        "", f"/usr/local/bin/plexmq serve --config /etc/plexmq/plexmq.toml --role {role}"]
    assert f"deploy/plexmq-{role}.conf" in drop_in.read_text() and "plexmq.service.d" in drop_in.read_text()


def load_cluster_compose(file: str, tmp_path: Path) -> tuple[dict, dict, dict]:
    """A compose file of routers and nodes (deploy/FILE): its services, and its router and node configs
    as the broker loads them, with the keys directory they name made here (`plexmq keys`)."""
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((DEPLOY / file).read_text())
    keys = tmp_path / "keys"
    assert subprocess.run([sys.executable, "-m", "plexmq.acceptor", "keys", str(keys)], cwd=ROOT).returncode == 0
    loaded = {}
    for name in ("router-config", "node-config"):
        text = compose["configs"][name]["content"].replace("/var/lib/plexmq-keys", str(keys))
        (tmp_path / f"{name}.toml").write_text(text)
        loaded[name] = cfg.load(str(tmp_path / f"{name}.toml"), {})
    return compose["services"], loaded["router-config"], loaded["node-config"]


def test_the_nodes_compose_file_runs_a_router_and_two_nodes_whose_configs_load(tmp_path: Path) -> None:
    services, router, node = load_cluster_compose("compose-nodes.yaml", tmp_path)
    assert {"keys", "router", "node1", "node2"} <= set(services)
    assert services["keys"]["command"] == ["keys", "/var/lib/plexmq-keys"]
    assert router["role"] == "router" and node["role"] == "node"
    assert node["router"] == f"tcp://router:{router['router_bind'].rsplit(':', 1)[1]}", "the nodes join the router's port"
    for service in ("router", "node1", "node2"):
        assert "plexmq-keys:/var/lib/plexmq-keys:ro" in services[service]["volumes"], service
    assert {services[n]["ports"][0].split(":")[1] for n in ("node1", "node2")} == {"1883", "1884"}


def test_the_standby_compose_file_runs_two_routers_on_one_postgresql_and_nodes_that_list_both(tmp_path: Path) -> None:
    services, router, node = load_cluster_compose("compose-standby.yaml", tmp_path)
    assert {"postgres", "keys", "routera", "routerb", "node1", "node2"} <= set(services)
    assert router["role"] == "router" and router["store"].startswith("postgresql://")
    pg = services["postgres"]["environment"]
    assert f"{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}" in router["store"]
    port = router["router_bind"].rsplit(":", 1)[1]
    assert node["router"] == f"tcp://routera:{port},tcp://routerb:{port}", "the nodes list both routers"
    for service in ("routera", "routerb"):
        assert services[service]["command"] == ["serve", "--config", "/etc/plexmq/router.toml"]
        assert services[service]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_the_tenants_example_loads_with_its_two_tenants_and_their_limits() -> None:
    loaded = cfg.load(str(DEPLOY / "tenants.toml"), {})
    assert sorted(loaded["tenants"]) == ["acme", "beta"] and loaded["tenant_required"]
    assert loaded["tenants"]["acme"]["max_connections"] == 10000
    assert loaded["tenants"]["beta"]["listeners"] == ["mqtt://127.0.0.1:1884"]


def test_a_non_editable_install_lists_every_package_and_the_consoles_assets() -> None:
    """The image's `pip install .` installs only the packages and data pyproject.toml lists, where a checkout
    and an editable install import any folder: a package left out (or the console's pages) passes every
    test here and fails only in the image."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = set()
    for top, dirs, files in os.walk(ROOT / "plexmq", followlinks=True):  # plexmq/router -> ../router ...
        dirs[:] = [name for name in dirs if name != "__pycache__"]
        if any(name.endswith(".py") for name in files):
            folders.add(".".join(Path(top).relative_to(ROOT).parts))
    assert sorted(setuptools["packages"]) == sorted(folders)
    patterns = setuptools["package-data"]["plexmq.router.console"]  # ASSETS: the folder assets/ of that package
    assert [item.name for item in ASSETS.iterdir() if not any(fnmatch(f"assets/{item.name}", p) for p in patterns)] == []
