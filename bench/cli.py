"""`plexmq bench SCENARIO [options]` (also `python -m plexmq.bench`): run one scenario against any MQTT 3.1.1 or 5.0 broker.

SCENARIO is a kind (conn, fanin, fanout, p2p) or a preset of bench.presets (p2p2k1, ...), so one name
means the same run here, in compare and in RESULTS.md; options given on the command line override the preset's.

`plexmq bench TOOL ...` hands over to the bench module of that name (`TOOLS`: compare, sweep, mqload, ...).
Exit status: 0 the run went through; 1 protocol errors or a lost QoS 1/2 message; 2 usage;
3 clients failed to connect or were dropped (a limit, or the broker refused them).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from plexmq.bench import presets
from plexmq.bench.client import MIN_SIZE
from plexmq.bench.plan import SCENARIOS, Options
from plexmq.bench.wire import LEVELS

# the tools `plexmq bench NAME ...` hands over to (plexmq.bench.NAME's main), each with --help of its own
TOOLS = {
    "compare": "the same scenarios against plexmq and mosquitto in one run, with ratios",
    "mqload": "compare's presets with the independent C generator mqload as the load",
    "sweep": "one scenario against plexmq --workers 1..K",
    "scale": "plexmq --workers 1..K over fan-in, fan-out, pairs on one and across workers, connects: msgs/s, router µs/msg",
    "protocols": "the same scenarios with MQTT 3.1.1 and 5.0 clients",
    "profile": "a running broker's CPU, context switches and py-spy profile, per process",
    "reconnect": "N idle clients, the broker restarted: time until all are back",
    "ceiling": "messages per router CPU-second, every one through the router",
    "durability": "10,000 offline sessions with 100 queued messages each: the restart",
    "failover": "kill -9 of the active router (PostgreSQL store): time until messages flow",
    "store_cost": "a persistent QoS 1 stream: SQLite normal/full against PostgreSQL",
    "acl": "an ACL of 100 rules: what judging read access at every delivery costs",
    "subscriptions": "memory per subscription, router and worker, mosquitto beside it",
    "floor": "memory of one idle connection in a worker, before any MQTT state",
    "tenants": "a noisy tenant at its message_rate beside a quiet one",
    "tenant_cost": "what declaring tenants costs",
    "console_cost": "what open web consoles cost the router",
    "topology": "a router and one node per port on this host",
    "codec": "ns per operation of the MQTT codecs",
    "bridge": "a bridge's msgs/s to a remote mosquitto at QoS 0 and 1, plexmq's beside mosquitto's own",
}

_EPILOG = """scenarios:
  conn    open -c clients at --conn-rate, hold them -d seconds with keepalive pings
  fanin   -P publishers to <topic>/<i>, -S subscribers on <topic>/# (default 100 -> 1)
  fanout  -P publishers (default 1) to <topic>/all, -S subscribers (default 1000)
  p2p     -c pairs: publisher i -> <topic>/p2p/<i> -> subscriber i (default 100)
presets (a scenario with its options, as bench/RESULTS.md names them):
{presets}
tools (plexmq bench TOOL --help):
{tools}
bench/RESULTS.md opens with the current table, plexmq beside mosquitto, and the command of each row"""


def add_options(parser: argparse.ArgumentParser, scenario: bool = True) -> None:
    """The load options, shared with compare and sweep."""
    if scenario:
        parser.add_argument("scenario", choices=(*SCENARIOS, *presets.PRESETS), metavar="SCENARIO")
        parser.add_argument("-H", "--host", default="127.0.0.1", help="broker address (default 127.0.0.1)")
        parser.add_argument("-p", "--port", type=int, default=1883, help="broker port (default 1883)")
        parser.add_argument("--ports", type=lambda text: [int(p) for p in text.split(",")], default=[],
                            metavar="P1,P2", help="spread the clients over these ports (nodes of one router): "
                                                  "publisher i on the (i mod n)-th, subscriber i on the next")
        parser.add_argument("--broker-pid", type=int, help="sum CPU and RSS over this process and its children")
    parser.add_argument("--protocol", type=int, choices=LEVELS, default=4,
                        help="MQTT protocol level of every client: 4 = 3.1.1 (default), 5 = 5.0")
    parser.add_argument("-c", "--clients", type=int, default=0, help="conn: connections (1000); p2p: pairs (100)")
    parser.add_argument("-P", "--pubs", type=int, default=0, help="publishers (fanin 100, fanout 1)")
    parser.add_argument("-S", "--subs", type=int, default=0, help="subscribers (fanin 1, fanout 1000)")
    parser.add_argument("-q", "--qos", type=int, choices=(0, 1, 2), default=0)
    parser.add_argument("-s", "--size", type=int, default=64, help=f"payload bytes, >= {MIN_SIZE} (default 64)")
    parser.add_argument("-r", "--rate", type=float, default=0.0,
                        help="msgs/s per publisher; 0 = max rate, closed loop (default)")
    parser.add_argument("-w", "--window", type=int, default=10, help="QoS 1/2: unacknowledged per publisher (10)")
    parser.add_argument("-e", "--e2e-window", type=int, default=10,
                        help="max rate: messages per publisher not yet received by its subscribers (10); 0 = open loop")
    parser.add_argument("-d", "--duration", type=float, default=10.0, help="publish (or conn: hold) seconds (10)")
    parser.add_argument("-R", "--conn-rate", type=float, default=0.0, help="new connections/s, 0 = unlimited")
    parser.add_argument("--max-pending", type=int, default=64, help="handshakes in flight per process (64)")
    parser.add_argument("--connect-timeout", type=float, default=10.0)
    parser.add_argument("-k", "--keepalive", type=int, default=30, help="keepalive s; PINGREQ every k/2 (30)")
    parser.add_argument("--client-prefix", default="plexbench-")
    parser.add_argument("--username", default="", help="user name of every client, e.g. bench@acme for a tenant "
                                                      "(default: none)")
    parser.add_argument("--persistent-subs", action="store_true",
                        help="subscribers connect with clean session 0 and stable ids <client-prefix>s<i> "
                             "(their sessions, and what is queued for them, outlive the run)")
    parser.add_argument("--persistent-conns", action="store_true",
                        help="conn: every connection connects with clean session 0, a session the broker keeps "
                             "(ids carry the run id: each run makes new ones)")
    parser.add_argument("--sub-identifier", type=int, default=0,
                        help="5.0: subscribers subscribe with this subscription identifier, 1 to 268435455 (0: none)")
    parser.add_argument("--topic-prefix", default="bench")
    parser.add_argument("--procs", type=int, default=0, help="generator processes (default: cores, more for fds)")
    parser.add_argument("--source-addrs", type=int, default=-1,
                        help="bind to N source addresses 127.0.0.2..; -1 auto above 25k connections, 0 never")
    parser.add_argument("--drain", type=float, default=10.0, help="max seconds to wait for late deliveries (10)")
    parser.add_argument("--settle", type=float, default=0.3, help="pause after the last SUBACK (0.3 s)")
    parser.add_argument("--out", metavar="DIR", help="write raw samples (gzip JSON lines) here")
    parser.add_argument("--max-samples", type=int, default=1_000_000, help="latency samples kept per process")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (table to stderr)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def options_from(ns: argparse.Namespace, **override: object) -> Options:
    fields = {k: v for k, v in vars(ns).items() if k in Options.__dataclass_fields__}
    fields["progress"] = not ns.quiet
    fields.update(override)
    return Options(**fields)


def scenario_options(parser: argparse.ArgumentParser, ns: argparse.Namespace, scenario: str) -> Options:
    """A preset's Options with what the command line changed from its defaults over them, or a plain
    scenario's from the command line; a usage error ends the program."""
    if scenario in presets.PRESETS:
        given = {k: v for k, v in vars(ns).items()
                 if k in Options.__dataclass_fields__ and k != "scenario" and parser.get_default(k) != v}
        opts = presets.options(scenario, **given)
        opts.progress = not ns.quiet
    else:
        opts = options_from(ns, scenario=scenario)
    error = check(opts)
    if error:
        parser.error(error)
    return opts


def check(opts: Options) -> str | None:
    """A usage error, or None."""
    if opts.size < MIN_SIZE:
        return f"--size must be at least {MIN_SIZE} (the payload carries time, run, publisher and sequence)"
    if opts.qos and opts.window < 1:
        return "--window must be at least 1 for QoS 1/2"
    if opts.window > 65535:
        return "--window must be at most 65535 (packet identifiers)"
    if opts.sub_identifier and (opts.protocol != 5 or not 0 < opts.sub_identifier < 1 << 28):
        return "--sub-identifier is for --protocol 5, 1 to 268435455"
    if opts.duration <= 0:
        return "--duration must be positive"
    if opts.scenario in ("conn", "p2p") and opts.clients < 0 or min(opts.pubs, opts.subs) < 0:
        return "client counts must be positive"
    return None


def exit_status(result: dict) -> int:
    if result["protocol_errors"] or (result["qos"] and result["lost"]):
        return 1
    if result["connect_failed"] or result["dropped"]:
        return 3
    return 0


def _listed(named: dict) -> str:
    """One line per name: a tool's purpose, or a preset's options."""
    return "\n".join(f"  {name:<13} {what if isinstance(what, str) else _preset(what)}" for name, what in named.items())


def _preset(fields: dict) -> str:
    return " ".join(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}" for key, value in fields.items())


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in TOOLS:
        return int(importlib.import_module(f"plexmq.bench.{args[0]}").main(args[1:]))
    parser = argparse.ArgumentParser(prog="plexmq bench", description="MQTT 3.1.1 and 5.0 load generator.",
                                     usage="plexmq bench SCENARIO [options] | plexmq bench TOOL [options]",
                                     epilog=_EPILOG.format(presets=_listed(presets.PRESETS), tools=_listed(TOOLS)),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser)
    ns = parser.parse_args(args)
    opts = scenario_options(parser, ns, ns.scenario)
    from plexmq.bench import report, runner

    result = runner.run(opts)
    text = report.table(result)
    if ns.json:
        print(text, file=sys.stderr)
        print(json.dumps(result, indent=1))
    else:
        print(text)
    sys.stdout.flush()
    return exit_status(result)


if __name__ == "__main__":
    sys.exit(main())
