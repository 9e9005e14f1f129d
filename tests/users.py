"""The CLI run as another local user (`nobody`), for the checks of what a user may do to a broker
that is not theirs."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def as_nobody(command: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`plexmq COMMAND ARGV` as the user `nobody` (modules loaded first: the interpreter's files are root's)."""
    code = (f"import os, pwd, sys, urllib.request\nfrom acceptor import {command}\n"
            "user = pwd.getpwnam('nobody')\nos.setgroups([]); os.setgid(user.pw_gid); os.setuid(user.pw_uid)\n"
            f"sys.exit({command}.main(sys.argv[1:]))")
    return subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, capture_output=True, text=True, timeout=30)
