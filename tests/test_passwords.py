"""The password file (`workers.auth.passwords`) and the `plexmq passwd` command, run as a real process.

Hashes made here use a small scrypt `n` so the tests stay fast; the command uses the real default.
"""

from __future__ import annotations

import base64
import hashlib
import os
import pty
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from plexmq.workers.auth import passwords as pw
from plexmq.workers.auth.passwords import PasswordFile, PasswordFileError
from tests.cli import CHEAP, PASSWD, one_error_line, passwd
from tests.conftest import ROOT

# made by `mosquitto_passwd -b FILE alice secret` (mosquitto 2.0.11)
MOSQUITTO_ALICE = ("$7$101$XX0zZX+QVUtXsQNj$"
                   "qAwph9uYrQJsBae3GYe+CtvhDQtFlKPmvZwzjx2tcU5IoXHEi3jgwbAN+lOHK+xRuIyy3vCq4caG5kmppDf7bQ==")


def pbkdf2_line(password: str, iterations: int = 1000) -> str:
    salt = os.urandom(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    return f"$pbkdf2-sha512${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "passwords"
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------ hashes


def test_hash_is_self_describing_and_salted() -> None:
    first, second = pw.hash_password("secret", n=CHEAP), pw.hash_password("secret", n=CHEAP)
    assert first.startswith(f"$scrypt$n={CHEAP},r=8,p=1$")
    assert first != second  # a fresh salt each time
    assert pw.verify(first, "secret") and pw.verify(second, "secret")
    assert not pw.verify(first, "Secret") and not pw.verify(first, "")
    assert pw.verify(first, b"secret")  # MQTT passwords are bytes


def test_default_hash_uses_the_strong_parameters() -> None:
    stored = pw.hash_password("pw")
    assert stored.startswith("$scrypt$n=16384,r=8,p=1$")
    assert pw.verify(stored, "pw")


def test_parameters_come_from_the_stored_line() -> None:
    stored = pw.hash_password("pw", n=2 ** 15)  # above OpenSSL's default scrypt memory cap
    assert pw.verify(stored, "pw")


def test_pbkdf2_and_mosquitto_hashes_verify() -> None:
    line = pbkdf2_line("hunter2")
    assert pw.verify(line, "hunter2") and not pw.verify(line, "hunter3")
    assert pw.verify(MOSQUITTO_ALICE, "secret") and not pw.verify(MOSQUITTO_ALICE, "Secret")


@pytest.mark.parametrize("stored, reason", [
    ("plain", "not a hash"),
    ("$md5$1$c2FsdA==$aGFzaA==", "unknown hash scheme 'md5'"),
    ("$scrypt$n=1000,r=8,p=1$c2FsdHNhbHQ=$" + "A" * 44, "power of two"),
    ("$scrypt$n=16,r=8$c2FsdHNhbHQ=$" + "A" * 44, "n=N,r=R,p=P"),
    ("$scrypt$c2FsdHNhbHQ=$" + "A" * 44, "not a hash of the form $scrypt$params$salt$hash"),
    ("$scrypt$n=16,r=8,p=1,p=1$c2FsdHNhbHQ=$" + "A" * 44, "n=N,r=R,p=P"),
    ("$scrypt$n=1048576,r=64,p=1$c2FsdHNhbHQ=$" + "A" * 44, "1 GiB"),
    ("$scrypt$n=16,r=8,p=1$not base64!$" + "A" * 44, "salt is not valid base64"),
    ("$scrypt$n=16,r=8,p=1$c2FsdHNhbHQ=$aGFzaA==", "shorter than 16 bytes"),
    ("$pbkdf2-sha512$0$c2FsdA==$" + "A" * 88, "iterations"),
    ("$pbkdf2-sha512$²$c2FsdA==$" + "A" * 88, "iterations"),
])
def test_malformed_hashes_say_why(stored: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        pw.verify(stored, "x")
    assert reason in str(info.value)


# ------------------------------------------------------------------------------------ the file


def test_load_and_check(tmp_path: Path) -> None:
    path = write(tmp_path, f"# users\n\nalice:{pw.hash_password('a-pass', n=CHEAP)}\n"
                           f"bob:{pbkdf2_line('b-pass')}\r\n"
                           f"carol:{MOSQUITTO_ALICE}\n"
                           f"with:colon:{pw.hash_password('c', n=CHEAP)}\n")
    users = PasswordFile.load(str(path))
    assert len(users) == 4 and "alice" in users and "users" not in users
    assert users.check("alice", "a-pass") and users.check("alice", b"a-pass")
    assert not users.check("alice", "b-pass")
    assert users.check("bob", "b-pass") and users.check("carol", "secret")
    assert users.check("with:colon", "c")  # the hash has no ':', so the user name may
    assert not users.check("nobody", "a-pass") and not users.check("", "")


def test_unknown_user_costs_a_hash_like_a_known_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    users = PasswordFile.load(str(write(tmp_path, f"alice:{pw.hash_password('pw', n=CHEAP)}\n")))
    calls: list[int] = []
    real = hashlib.scrypt

    def counting(password: bytes, **kwargs: int) -> bytes:
        calls.append(kwargs["n"])
        return real(password, **kwargs)  # type: ignore[arg-type]  # n, r, p, maxmem, dklen: ints

    monkeypatch.setattr(hashlib, "scrypt", counting)
    assert not users.check("mallory", "pw")
    assert not users.check("alice", "wrong")
    assert calls == [CHEAP, CHEAP]


@pytest.mark.parametrize("line, reason", [
    ("alice", "expected username:hash"),
    (":$scrypt$n=16,r=8,p=1$c2FsdHNhbHQ=$" + "A" * 44, "empty user name"),
    ("alice:plaintext", "not a hash"),
    ("alice:$6$salt$hash", "unknown hash scheme '6'"),
    ("alice:$scrypt$n=17,r=8,p=1$c2FsdHNhbHQ=$" + "A" * 44, "power of two"),
])
def test_malformed_lines_name_file_and_line(tmp_path: Path, line: str, reason: str) -> None:
    path = write(tmp_path, f"# comment\nok:{pw.hash_password('x', n=CHEAP)}\n{line}\n")
    with pytest.raises(PasswordFileError) as info:
        PasswordFile.load(str(path))
    assert str(info.value).startswith(f"{path}:3: ")
    assert reason in str(info.value)
    assert isinstance(info.value, ValueError)


def test_duplicate_user_and_bad_encoding(tmp_path: Path) -> None:
    stored = pw.hash_password("x", n=CHEAP)
    path = write(tmp_path, f"a:{stored}\nb:{stored}\na:{stored}\n")
    with pytest.raises(PasswordFileError, match=f"^{path}:3: user 'a' again \\(first on line 1\\)$"):
        PasswordFile.load(str(path))
    path.write_bytes(b"a:\xff\n")
    with pytest.raises(PasswordFileError, match=f"^{path}:1: not UTF-8$"):
        PasswordFile.load(str(path))
    with pytest.raises(PasswordFileError, match="no such file"):
        PasswordFile.load(str(tmp_path / "missing"))


def test_set_and_delete_rewrite_the_file_atomically(tmp_path: Path) -> None:
    path = str(tmp_path / "passwords")
    assert pw.set_password(path, "alice", "one", n=CHEAP) is True
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path, "a") as f:
        f.write("# keep me\n")
    assert pw.set_password(path, "bob", "two", n=CHEAP) is True
    assert pw.set_password(path, "alice", "three", n=CHEAP) is False  # changed in place
    lines = Path(path).read_text().splitlines()
    assert [line.split(":")[0] for line in lines] == ["alice", "# keep me", "bob"]
    users = PasswordFile.load(path)
    assert users.check("alice", "three") and not users.check("alice", "one") and users.check("bob", "two")
    assert pw.delete_user(path, "alice") is True
    assert pw.delete_user(path, "alice") is False
    assert Path(path).read_text().splitlines()[0] == "# keep me"
    assert "alice" not in PasswordFile.load(path)
    assert os.listdir(tmp_path) == ["passwords"]  # no temporary file left behind
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_set_password_refuses_what_the_file_cannot_hold(tmp_path: Path) -> None:
    path = str(tmp_path / "passwords")
    for name in ("", "a\nb", "#admin", "x" * 65536):
        with pytest.raises(ValueError):
            pw.set_password(path, name, "pw", n=CHEAP)
    with pytest.raises(ValueError, match="password longer"):
        pw.set_password(path, "alice", b"x" * 65536, n=CHEAP)
    assert not os.path.exists(path)
    Path(path).write_text("broken\n")
    with pytest.raises(PasswordFileError, match=f"^{path}:1: "):
        pw.set_password(path, "alice", "pw", n=CHEAP)
    assert Path(path).read_text() == "broken\n"


# ------------------------------------------------------------------------------------ the command


def test_passwd_adds_changes_and_deletes(tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "passwords")
    os.mkdir(tmp_path / "sub")
    result = passwd(path, "alice", "--password-stdin", stdin="first pass\n")
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == ""
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    line = Path(path).read_text()
    assert line.startswith("alice:$scrypt$n=16384,r=8,p=1$")
    assert PasswordFile.load(path).check("alice", "first pass")  # only the newline is taken off

    assert passwd(path, "bob", "--password-stdin", stdin="bob's\nnot this line\n").returncode == 0
    assert passwd(path, "alice", "--password-stdin", stdin="second\r\n").returncode == 0
    users = PasswordFile.load(path)
    assert users.check("alice", "second") and not users.check("alice", "first pass")
    assert users.check("bob", "bob's")

    assert passwd("-D", path, "alice").returncode == 0
    users = PasswordFile.load(path)
    assert "alice" not in users and users.check("bob", "bob's")
    assert sorted(os.listdir(tmp_path / "sub")) == ["passwords"]


@pytest.mark.parametrize("args, stdin, expected", [
    ((), None, "the following arguments are required: FILE, USER"),
    (("{file}",), None, "the following arguments are required: USER"),
    (("--bogus", "{file}", "u"), None, "unrecognized arguments: --bogus"),
    (("-D", "--password-stdin", "{file}", "u"), "x\n", "-D takes no password"),
    (("-D", "{file}", "nobody"), None, "{file}: no user 'nobody'"),
    (("-D", "{missing}", "u"), None, "{missing}: no such file"),
    (("{file}", "u", "--password-stdin"), "\n", "empty password"),
    (("{file}", "u", "--password-stdin"), "", "empty password"),
    (("{file}", "#u", "--password-stdin"), "pw\n", "user name starts with '#'"),
    (("{file}", "u"), None, "no terminal to ask for the password on; use --password-stdin"),
    (("{nodir}", "u", "--password-stdin"), "pw\n", "{nodir}: No such file or directory"),
])
def test_passwd_errors_are_one_line_and_status_2(tmp_path: Path, args: tuple[str, ...], stdin: str | None,
                                                 expected: str) -> None:
    path = tmp_path / "passwords"
    pw.set_password(str(path), "alice", "pw", n=CHEAP)
    before = path.read_bytes()
    names = {"file": str(path), "missing": str(tmp_path / "missing"), "nodir": str(tmp_path / "no" / "file")}
    result = passwd(*(a.format(**names) for a in args), stdin=stdin)
    assert one_error_line(result).startswith(f"plexmq passwd: {expected.format(**names)}")
    assert path.read_bytes() == before


def test_passwd_reports_a_malformed_file_by_line(tmp_path: Path) -> None:
    path = write(tmp_path, f"alice:{pw.hash_password('x', n=CHEAP)}\nbob:nothing\n")
    line = one_error_line(passwd(str(path), "carol", "--password-stdin", stdin="pw\n"))
    assert line.startswith(f"plexmq passwd: {path}:2: ")


def _prompted(path: str, answers: list[bytes]) -> tuple[int, bytes]:
    """Run the command on a new terminal, typing each answer after a prompt; (exit status, what it showed)."""
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(ROOT)
        os.execv(sys.executable, [*PASSWD, path, "alice"])
    shown = b""
    typed = 0
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                chunk = os.read(fd, 1024)
            except OSError:  # the child is gone: EIO on Linux
                break
            if not chunk or time.monotonic() > deadline:
                break
            shown += chunk
            if typed < len(answers) and shown.count(b"Password") > typed:
                os.write(fd, answers[typed] + b"\n")
                typed += 1
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), shown


def test_passwd_asks_twice_on_the_terminal(tmp_path: Path) -> None:
    path = str(tmp_path / "passwords")
    status, shown = _prompted(path, [b"typed secret", b"typed secret"])
    assert status == 0, shown
    assert b"Password: " in shown and b"Password again: " in shown and b"typed secret" not in shown
    assert PasswordFile.load(path).check("alice", "typed secret")

    status, shown = _prompted(path, [b"new one", b"typo"])
    assert status == 2 and b"plexmq passwd: the passwords do not match" in shown
    assert PasswordFile.load(path).check("alice", "typed secret")


@pytest.mark.skipif(shutil.which("mosquitto_passwd") is None, reason="mosquitto_passwd is not installed")
def test_a_mosquitto_password_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "mosquitto.passwd"
    path.touch()
    for user, password in (("alice", "a-secret"), ("bob", "b-secret")):
        subprocess.run(["mosquitto_passwd", "-b", str(path), user, password], check=True, capture_output=True)
    users = PasswordFile.load(str(path))
    assert users.check("alice", "a-secret") and users.check("bob", "b-secret")
    assert not users.check("alice", "b-secret")


def test_a_read_only_role_ends_a_line_is_kept_by_a_new_password_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    """A web console admin's role (router/console/auth.py): ` role=read-only` at the end of the line."""
    path = str(tmp_path / "admins")
    pw.set_password(path, "viewer", "one", n=CHEAP, role="read-only")
    pw.set_password(path, "ops", "two", n=CHEAP)
    pw.set_password(path, "viewer", "three", n=CHEAP)  # a new password: the role stays
    loaded = PasswordFile.load(path)
    assert (loaded.role("viewer"), loaded.role("ops"), loaded.role("nobody")) == ("read-only", "admin", "admin")
    assert loaded.check("viewer", "three") and not loaded.check("viewer", "one")
    pw.set_password(path, "viewer", "three", n=CHEAP, role="admin")
    assert PasswordFile.load(path).role("viewer") == "admin" and " role=" not in Path(path).read_text()
    Path(path).write_text(Path(path).read_text().replace("\n", " role=root\n", 1))
    with pytest.raises(PasswordFileError, match=r"admins:1: unknown role 'root'"):
        PasswordFile.load(path)
