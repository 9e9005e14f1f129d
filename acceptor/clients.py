"""`plexmq clients`: the connected clients of a running broker (from its metrics endpoint), a page
at a time, optionally only those whose client id contains some text; `--disconnect ID` closes one
(an administrative action: its session stays, its will is published, a 5.0 client hears 0x98)."""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.parse
import urllib.request

import orjson


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="plexmq clients", description="List the connected clients.")
    parser.add_argument("--metrics", default="http://127.0.0.1:9883", metavar="URL",
                        help="the broker's metrics endpoint (default http://127.0.0.1:9883)")
    parser.add_argument("--filter", default="", help="only client ids that contain this text")
    parser.add_argument("--page", type=int, default=1, help="which page (default 1)")
    parser.add_argument("--per-page", type=int, default=50, help="clients per page (default 50)")
    parser.add_argument("--disconnect", metavar="CLIENT_ID", help="close this client's connection instead")
    args = parser.parse_args(argv)
    if args.disconnect is not None:
        return _disconnect(args.metrics, args.disconnect)
    query = urllib.parse.urlencode({"filter": args.filter, "offset": (max(args.page, 1) - 1) * args.per_page,
                                    "limit": args.per_page})
    try:
        with urllib.request.urlopen(f"{args.metrics.rstrip('/')}/clients?{query}", timeout=15) as answer:
            listing = orjson.loads(answer.read())
    except (urllib.error.URLError, OSError) as exc:
        print(f"plexmq clients: cannot read {args.metrics}/clients: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return 1
    print(f"{'client id':<40} {'worker':>6} {'address':<22} {'keepalive':>9} {'queued':>7} {'inflight':>8} "
          f"{'persistent':<10} protocol")
    for client_id, worker, address, keepalive, queued, inflight, persistent, protocol in listing["clients"]:
        print(f"{client_id:<40} {worker:>6} {address:<22} {keepalive:>9} {queued:>7} {inflight:>8} "
              f"{'yes' if persistent else 'no':<10} {protocol}")
    pages = max(1, -(-listing["total"] // args.per_page))
    note = "" if listing["complete"] else " (a worker did not answer: the list may be short)"
    print(f"page {args.page} of {pages}, {listing['total']} clients{note}")
    return 0


def _disconnect(metrics: str, client_id: str) -> int:
    """Ask the broker to close `client_id`'s connection; 1 when it is not connected."""
    query = urllib.parse.urlencode({"client_id": client_id})
    request = urllib.request.Request(f"{metrics.rstrip('/')}/clients/disconnect?{query}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=15) as answer:
            print(answer.read().decode().strip())
            return 0
    except urllib.error.HTTPError as exc:
        print(f"plexmq clients: {exc.read().decode().strip()}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"plexmq clients: cannot reach {metrics}: {getattr(exc, 'reason', exc)}", file=sys.stderr)
        return 1
