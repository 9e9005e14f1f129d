"""The plexmq command line and the broker's HTTP endpoints as the tests run them: a config checked
or refused (`run`, `write`, `one_error_line`, `names_line`), `plexmq passwd`, the metrics-backed
commands (`cli`, `metrics_url`) and the health check."""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.conftest import ROOT, Broker, wait_for

PASSWD = [sys.executable, "-c", "import sys; from acceptor.passwd import main; sys.exit(main(sys.argv[1:]))"]


MODULE = [sys.executable, "-m", "plexmq.acceptor"]


def run(*args: str, timeout: float = 15) -> subprocess.CompletedProcess[str]:
    """Run the program to completion; a config that is wrongly accepted starts a broker and times out."""
    try:
        return subprocess.run([*MODULE, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"`plexmq {' '.join(args)}` did not stop (it accepted the config?): {exc.stderr!r}") from None


def write(tmp_path: Path, text: str, name: str = "plexmq.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """Exit status 2 and exactly one line on stderr; that line."""
    assert result.returncode == 2, f"exit status {result.returncode}, stderr:\n{result.stderr}"
    lines = result.stderr.strip("\n").splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return lines[0]


def names_line(message: str, path: Path, line: int) -> bool:
    """The message names `path` and line `line` (as path:LINE, or 'line LINE' elsewhere in it)."""
    rest = message.replace(str(path), "\0")
    return f"\0:{line}" in rest or re.search(rf"\bline {line}\b", rest) is not None


def metrics_url(b: Broker) -> str:
    found = wait_for(lambda: re.search(r"metrics on (http://\S+)/metrics", b.output()), 10, "the metrics line")
    return found.group(1)


def cli(command: str, url: str, *args: str) -> str:
    """What `plexmq COMMAND --metrics URL ARGS` prints (it must exit 0)."""
    out = subprocess.run([sys.executable, "-m", "plexmq.acceptor", command, "--metrics", url, *args],
                         cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def health(url: str) -> int:
    try:
        return urllib.request.urlopen(url + "/health", timeout=5).status
    except urllib.error.HTTPError as exc:
        return exc.code


CHEAP = 16  # scrypt n for the tests


def passwd(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`plexmq passwd ARGS` with no controlling terminal, so a prompt cannot wait for a person."""
    return subprocess.run([*PASSWD, *args], cwd=ROOT, input=stdin, stdin=subprocess.DEVNULL if stdin is None else None,
                          capture_output=True, text=True, timeout=30, start_new_session=True, check=False)
