"""`python -m plexmq.bench.acl`: what judging read access at every delivery costs, with the C
generator mqload as the load, each (scenario, broker) on a fresh broker as in bench.mqload.

The ACL has 100 rules for anonymous clients: `bench/#` readwrite, 98 read rules elsewhere and one
deny. In the `covered` form the deny is outside `bench/`, so every subscription of the benchmark is
covered whole and plexmq checks no message (the connection is not screened); in the `checked` form
the deny is `bench/never/denied`, which `bench/#` could reach, so the fan-in subscriber looks up the
topic of every message it gets (fan-out's `bench/all` stays covered: no deny can reach it).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from plexmq.bench import brokers, compare, presets
from plexmq.bench.mqload import binary_option, check_binary, measure

RULES = 100
DENIES = {"covered": "topic deny elsewhere/denied", "checked": "topic deny bench/never/denied"}


def acl_text(form: str) -> str:
    """The benchmark's ACL of RULES lines in `form` (covered or checked)."""
    lines = ["topic readwrite bench/#", *(f"topic read elsewhere/{i}/#" for i in range(RULES - 2)), DENIES[form]]
    return "\n".join(lines) + "\n"


def spec(name: str, log_dir: str) -> brokers.BrokerSpec:
    """plexmq or mosquitto, with `-covered` or `-checked` for the ACL in that form."""
    kind, _, form = name.partition("-")
    acl_file = ""
    if form:
        acl_file = os.path.join(log_dir, f"acl-{form}")
        with open(acl_file, "w") as f:
            f.write(acl_text(form))
        os.chmod(log_dir, 0o755)  # mosquitto, started as root, reads it as its own user
        os.chmod(acl_file, 0o644)
    return brokers.BrokerSpec(name, kind, acl_file=acl_file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m plexmq.bench.acl", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="fanin0,fanout0,fanin1", help="presets (default fanin0,fanout0,fanin1)")
    parser.add_argument("--brokers", default="plexmq,plexmq-covered,plexmq-checked,mosquitto,mosquitto-checked",
                        help="comma-separated, first is the base: plexmq or mosquitto, -covered or -checked for an ACL")
    parser.add_argument("-d", "--duration", type=float, default=8.0, help="publish seconds per run (8)")
    binary_option(parser)
    ns = parser.parse_args(argv)
    check_binary(parser, ns.mqload)
    names = ns.brokers.split(",")
    log_dir = tempfile.mkdtemp(prefix="plexbench-acl-")
    results: dict[str, dict[str, dict]] = {}
    for scen in ns.scenarios.split(","):
        results[scen] = {}
        for name in names:
            print(f"== {scen} on {name}", file=sys.stderr, flush=True)
            try:
                results[scen][name] = measure(spec(name, log_dir), presets.options(scen, ns.duration), ns.mqload, log_dir)
            except RuntimeError as exc:
                results[scen][name] = {"skipped": f"failed: {exc}"}
    print(compare.table(results, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
