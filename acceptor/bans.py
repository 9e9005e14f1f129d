"""`plexmq ban`, `plexmq unban` and `plexmq bans`: the banned clients of a running broker (router/bans.py),
by client id, username, or address or network, in one tenant (`--tenant NAME`, "" the default tenant) or
in every tenant (the default). A ban closes the clients it names at once and refuses them until it is
lifted or its time (`--for 2h`) is up.

Admin requests, as `plexmq clients` makes them: with the broker's admin token (router/ops/admin.py), read
from the run dir of the broker of `--config`, the token file of this user's broker on the endpoint's
port, or from `--token-file`."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.parse
from collections.abc import Callable

import orjson

from plexmq.acceptor import endpoint
from plexmq.bans import BROKER, KINDS
from plexmq.units import parse_duration


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    endpoint.add_arguments(parser)
    parser.add_argument("--token-file", metavar="FILE",
                        help="the broker's admin token (default: RUN_DIR/admin-PORT.token of the broker of --config, "
                             "or of this user's broker on that port)")
    return parser


def _named(parser: argparse.ArgumentParser) -> None:
    """The arguments that name one ban."""
    parser.add_argument("kind", choices=KINDS, help="what the ban names")
    parser.add_argument("value", help="the client id, the username, or the address or network (a.b.c.d/len, IPv6 too)")
    parser.add_argument("--tenant", metavar="NAME", default=BROKER,
                        help='the tenant it holds in ("": the default tenant; default *: every tenant)')


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _send(prog: str, args: argparse.Namespace, act: Callable[[str, str], str]) -> int:
    """Find the broker and its token, make the request `act(url, token)`, print what it said."""
    try:
        found = endpoint.find(args)
        said = act(found.url, endpoint.admin_token(args.token_file or endpoint.token_file(found)))
    except endpoint.Refused as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print(said)
    return 0


def ban(argv: list[str]) -> int:
    parser = _parser("plexmq ban", "Ban clients: those connected are closed, and refused until the ban is lifted.")
    _named(parser)
    parser.add_argument("--reason", default="", help="why (a 5.0 client hears it in its CONNACK)")
    parser.add_argument("--for", dest="duration", type=_duration, default=0.0, metavar="DURATION",
                        help="how long it lasts: 30m, 2h, 7d (default: until plexmq unban)")
    args = parser.parse_args(argv)
    body = orjson.dumps({"kind": args.kind, "value": args.value, "tenant": args.tenant, "reason": args.reason,
                         "duration": args.duration})
    return _send("plexmq ban", args, lambda url, token: endpoint.request(url, token, "/bans/add", body).decode().strip())


def unban(argv: list[str]) -> int:
    parser = _parser("plexmq unban", "Lift a ban.")
    _named(parser)
    args = parser.parse_args(argv)
    body = orjson.dumps({"kind": args.kind, "value": args.value, "tenant": args.tenant})
    return _send("plexmq unban", args, lambda url, token: endpoint.request(url, token, "/bans/remove", body).decode().strip())


def bans(argv: list[str]) -> int:
    parser = _parser("plexmq bans", "List the bans.")
    parser.add_argument("--filter", default="", help="only bans whose value, reason or maker contains this text")
    parser.add_argument("--tenant", metavar="NAME", help='only the bans of this tenant ("": the default tenant; '
                                                         "*: those of every tenant)")
    parser.add_argument("--page", type=int, default=1, help="which page (default 1)")
    parser.add_argument("--per-page", type=int, default=50, help="bans per page (default 50)")
    args = parser.parse_args(argv)
    asked = {"filter": args.filter, "offset": (max(args.page, 1) - 1) * args.per_page, "limit": args.per_page}
    if args.tenant is not None:
        asked["tenant"] = args.tenant

    def table(url: str, token: str) -> str:
        listing = orjson.loads(endpoint.request(url, token, f"/bans?{urllib.parse.urlencode(asked)}"))
        lines = [f"{'tenant':<12} {'kind':<9} {'value':<40} {'until':<20} {'by':<24} reason"]
        for tenant, kind, value, reason, expires, by, _created in listing["bans"]:
            until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(expires)) if expires else "lifted by hand"
            lines.append(f"{tenant or '-':<12} {kind:<9} {value:<40} {until:<20} {by:<24} {reason}")
        pages = max(1, -(-listing["total"] // args.per_page))
        lines.append(f"page {args.page} of {pages}, {listing['total']} bans")
        return "\n".join(lines)

    return _send("plexmq bans", args, table)
