"""`plexmq clients`: the connected clients of a running broker (from its metrics endpoint), a page
at a time, optionally only those whose client id contains some text, or only those of one tenant
(`--tenant NAME`); `--disconnect ID` closes one (an administrative action: its session stays, its will
is published, a 5.0 client hears 0x98), with `--tenant NAME` the client of that id in that tenant.

Both are admin requests: they carry the broker's admin token (`router/ops/admin.py`), read from the run dir
of the broker of `--config`, the token file of this user's broker on the endpoint's port, or from
`--token-file`."""

from __future__ import annotations

import argparse
import sys
import urllib.parse

import orjson

from plexmq.acceptor import endpoint
from plexmq.mqtt import PROTOCOLS
from plexmq.router.listing import FIELDS


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="plexmq clients", description="List the connected clients.")
    endpoint.add_arguments(parser)
    parser.add_argument("--token-file", metavar="FILE",
                        help="the broker's admin token (default: RUN_DIR/admin-PORT.token of the broker of --config, "
                             "or of this user's broker on that port)")
    parser.add_argument("--filter", default="",
                        help="only clients whose id, username, address or worker (NODE/wN) contains this text")
    parser.add_argument("--page", type=int, default=1, help="which page (default 1)")
    parser.add_argument("--per-page", type=int, default=50, help="clients per page (default 50)")
    parser.add_argument("--protocol", choices=PROTOCOLS.values(), help="only the clients of this MQTT version")
    parser.add_argument("--sort", choices=FIELDS, default="client_id", help="the order of the pages (default client_id)")
    parser.add_argument("--desc", action="store_true", help="the largest first")
    parser.add_argument("--disconnect", metavar="CLIENT_ID", help="close this client's connection instead")
    parser.add_argument("--tenant", metavar="NAME", help='only the clients of this tenant ("": the default tenant); '
                        "with --disconnect, the tenant of that client (default: the default tenant)")
    args = parser.parse_args(argv)
    try:
        found = endpoint.find(args)
        url = found.url
        token = endpoint.admin_token(args.token_file or endpoint.token_file(found))
        if args.disconnect is not None:
            body = orjson.dumps({"client_id": args.disconnect, "tenant": args.tenant or ""})
            print(endpoint.request(url, token, "/clients/disconnect", body).decode().strip())
            return 0
        asked = {"filter": args.filter, "offset": (max(args.page, 1) - 1) * args.per_page, "limit": args.per_page}
        if args.sort != "client_id" or args.desc:
            asked.update(sort=args.sort, order="desc" if args.desc else "asc")
        if args.tenant is not None:
            asked["tenant"] = args.tenant
        if args.protocol:
            asked["protocol"] = args.protocol
        listing = orjson.loads(endpoint.request(url, token, f"/clients?{urllib.parse.urlencode(asked)}"))
    except endpoint.Refused as exc:
        print(f"plexmq clients: {exc}", file=sys.stderr)
        return 1
    print(f"{'client id':<40} {'worker':>6} {'address':<22} {'keepalive':>9} {'queued':>7} {'inflight':>8} "
          f"{'persistent':<10} {'msgs in':>9} {'msgs out':>9} {'username':<20} {'protocol':<8} tenant")
    for (client_id, worker, address, keepalive, queued, inflight, persistent, protocol, tenant, username, _connected_at,
         messages_in, messages_out, *_bytes) in listing["clients"]:
        print(f"{client_id:<40} {worker:>6} {address:<22} {keepalive:>9} {queued:>7} {inflight:>8} "
              f"{'yes' if persistent else 'no':<10} {messages_in:>9} {messages_out:>9} {username or '-':<20} "
              f"{protocol:<8} {tenant or '-'}")
    pages = max(1, -(-listing["total"] // args.per_page))
    note = "" if listing["complete"] else " (a worker did not answer: the list may be short)"
    print(f"page {args.page} of {pages}, {listing['total']} clients{note}")
    return 0

