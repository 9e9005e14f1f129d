"""The `plexmq passwd` command: add, change or delete a user of a password file.

`plexmq passwd FILE USER` asks for the password twice on the terminal (or reads one line from stdin
with `--password-stdin`) and creates the file when it is missing; `-D` deletes the user; `--role
read-only` makes a web console admin who looks but cannot act (`--role admin` undoes it). The file
is rewritten in one step with mode 0600. Every error is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import warnings
from typing import NoReturn

from plexmq.workers.auth import passwords


class _Usage(Exception):
    """A bad command line, reported as one line instead of argparse's usage block."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _Usage(f"{message} (see plexmq passwd --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="plexmq passwd", description="Add or change a user of a password file, or delete one.")
    parser.add_argument("-D", "--delete", action="store_true", help="delete USER instead")
    parser.add_argument("--password-stdin", action="store_true",
                        help="read the password from the first line of stdin instead of asking")
    parser.add_argument("--role", choices=passwords.ROLES,
                        help="a web console admin's role: read-only looks but cannot act (default: the line's, "
                             "admin for a new user)")
    parser.add_argument("file", metavar="FILE", help="the password file (created when missing, mode 0600)")
    parser.add_argument("user", metavar="USER", help="the user name")
    return parser


def _password(from_stdin: bool) -> str:
    if from_stdin:
        password = sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    else:
        with warnings.catch_warnings():  # no terminal: getpass would warn, then read the password from stdin
            warnings.simplefilter("error", getpass.GetPassWarning)
            try:
                password = getpass.getpass("Password: ")
                if getpass.getpass("Password again: ") != password:
                    raise _Usage("the passwords do not match")
            except getpass.GetPassWarning:
                raise _Usage("no terminal to ask for the password on; use --password-stdin") from None
            except (EOFError, KeyboardInterrupt):
                raise _Usage("no password given") from None
    if not password:
        raise _Usage("empty password")
    return password


def _run(ns: argparse.Namespace) -> None:
    if ns.delete:
        if ns.password_stdin:
            raise _Usage("-D takes no password")
        if not passwords.delete_user(ns.file, ns.user):
            raise _Usage(f"{ns.file}: no user {ns.user!r}")
        return
    error = passwords.username_error(ns.user)
    if error:
        raise _Usage(error)
    passwords.set_password(ns.file, ns.user, _password(ns.password_stdin), role=ns.role)


def _fail(message: str) -> int:
    print(f"plexmq passwd: {message}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    try:
        ns = _parser().parse_args(argv)
    except _Usage as exc:
        return _fail(str(exc))
    try:
        _run(ns)
    except (_Usage, ValueError) as exc:  # a PasswordFileError (a ValueError) already names file:line
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{ns.file}: {exc.strerror}")
    return 0
