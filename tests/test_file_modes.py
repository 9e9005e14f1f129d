"""The files that hold clients' messages are the broker's user's alone, whatever the umask:
the data dir 0700, the store with its -wal and -shm 0600, the archive's segments 0600 (or 0640 for
the group `archive.group` names); a password file others may read is warned about (or refused)."""

from __future__ import annotations

import grp
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from plexmq.files import Access
from plexmq.workers.archive import ArchiveWriter
from plexmq.workers.auth.passwords import set_password
from tests.archives import T0, run
from tests.conftest import ROOT, Broker, wait_for
from tests.mqtt import Client
from tests.steps import uid


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The usual umask, which leaves new files readable by others (the broker inherits it)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def other_group() -> grp.struct_group:
    return next(g for g in grp.getgrall() if g.gr_gid != os.getgid())


def test_store_and_archive_are_private(tmp_path: Path, start_broker: Callable[..., Broker], loose_umask: None) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text(f'[archive]\nenabled = true\ndir = "{tmp_path / "archive"}"\n')
    data = tmp_path / "data"
    b = start_broker("--workers", "1", "--config", str(config), "--data-dir", str(data))
    c = Client(b.port, f"keep-{uid()}", clean=False)
    c.subscribe("kept/#", 1)
    c.publish("kept/retained", b"secret payload", 1, retain=True)  # acknowledged after the store's commit
    assert mode(data) == 0o700
    for name in ("plexmq.db", "plexmq.db-wal", "plexmq.db-shm"):
        assert mode(data / name) == 0o600, name
    c.disconnect()
    b.stop()
    segments = list((tmp_path / "archive").rglob("*.seg"))
    assert segments
    assert {mode(s) for s in segments} == {0o600}
    assert {mode(d) for d in (tmp_path / "archive").rglob("*") if d.is_dir()} | {mode(tmp_path / "archive")} == {0o700}


def test_a_data_dir_open_to_others_is_closed_and_said(tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    b = start_broker("--workers", "1", "--data-dir", str(data))
    assert mode(data) == 0o700
    assert f"data dir {data} was open to other users (mode 755): now 700" in b.output()


def test_the_archive_may_be_shared_with_one_group(tmp_path: Path, loose_umask: None) -> None:
    group = other_group()
    w = ArchiveWriter(str(tmp_path / "archive"), 0, ["#"], 1 << 20, 60.0, Access(group.gr_name))
    w.append("", run(T0, b"x"))
    w.close()
    (segment,) = (tmp_path / "archive").rglob("*.seg")
    assert mode(segment) == 0o640 and segment.stat().st_gid == group.gr_gid
    assert mode(segment.parent) == 0o750 and segment.parent.stat().st_gid == group.gr_gid


def test_an_unknown_archive_group_stops_startup(tmp_path: Path) -> None:
    config = tmp_path / "plexmq.toml"
    config.write_text('[archive]\nenabled = true\ngroup = "no-such-group-here"\n')
    out = subprocess.run([sys.executable, "-m", "plexmq.acceptor", "serve", "--config", str(config)], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert "archive.group" in out.stderr and "no group 'no-such-group-here' on this host" in out.stderr


def passwords(tmp_path: Path, file_mode: int) -> Path:
    path = tmp_path / "passwd"
    set_password(str(path), "alice", "wonderland", n=2 ** 10)
    os.chmod(path, file_mode)
    return path


def test_a_password_file_others_may_read_is_warned_about_at_start_and_reload(
        tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    path = passwords(tmp_path, 0o644)
    config = tmp_path / "plexmq.toml"
    config.write_text(f'password_file = "{path}"\n')
    b = start_broker("--workers", "1", "--config", str(config))
    said = f"password_file: {path} is readable by other users (mode 644)"
    assert b.output().count(said) == 1
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: b.output().count(said) == 2, 10, "the warning again at the reload")
    os.chmod(path, 0o600)
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: b.output().count("reloaded its settings") >= 2, 10, "the second reload")
    assert b.output().count(said) == 2


def test_strict_file_modes_refuse_a_password_file_others_may_read(tmp_path: Path) -> None:
    path = passwords(tmp_path, 0o604)
    config = tmp_path / "plexmq.toml"
    config.write_text(f'password_file = "{path}"\nstrict_file_modes = true\n')
    out = subprocess.run([sys.executable, "-m", "plexmq.acceptor", "serve", "--config", str(config)], cwd=ROOT,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
    assert f"password_file: {path} is readable by other users (mode 604)" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
