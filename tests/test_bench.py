"""The load generator against a real plexmq: each scenario briefly, checking the accounting, not the speed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plexmq.bench import bridge as bridge_bench
from plexmq.bench import brokers, cli, compare, durability, mqload, presets, profile, protocols, report, runner, samples, tenants
from plexmq.bench.plan import Options, assign, with_defaults
from tests.conftest import ROOT
from tests.mqtt import RawClient

needs_mqload = pytest.mark.skipif(not os.access(mqload.DEFAULT_BINARY, os.X_OK),
                                  reason="mqload not built (make in its directory)")


def _records(out: Path, kind: samples.Kind) -> list[tuple]:
    rows: list[tuple] = []
    for path in (out / kind.name).glob("*" + samples.SUFFIX):
        region, damage, _ = samples.records_region(path.read_bytes(), kind)
        assert damage is None
        rows += kind.record.iter_unpack(region)
    return rows


def _run(broker, scenario: str, **fields) -> dict:
    opts = Options(scenario, port=broker.port, broker_pid=broker.proc.pid, progress=False, procs=2, settle=0.1,
                   **fields)
    return runner.run(opts)


def test_p2p_qos1_json_samples_then_conn(start_broker, tmp_path: Path, capsys) -> None:
    broker = start_broker()
    out = tmp_path / "samples"
    status = cli.main(["p2p", "-p", str(broker.port), "--broker-pid", str(broker.proc.pid), "-c", "4",
                       "-q", "1", "-d", "0.7", "--settle", "0.1", "--procs", "2", "--quiet", "--json", "--out", str(out)])
    result = json.loads(capsys.readouterr().out)
    assert status == 0, result
    assert set(report.KEYS) <= set(result)
    assert result["sent"] > 100
    assert result["received"] == result["sent"] == result["expected"] == result["acked"]
    assert result["lost"] == result["duplicated"] == 0
    assert result["connected"] == 8 and result["broker_procs"] >= 3
    assert result["latency_ms"]["samples"] == result["received"]
    latencies = _records(out, samples.LATENCY)
    assert len(latencies) == result["received"]
    assert all(lat >= 0 and abs(recv - send - lat) <= 1 for send, recv, lat, *_ in latencies)
    assert sum(row[2] for row in _records(out, samples.RATES)) == result["received"]
    assert {"router", "worker-0"} <= {row[2].rstrip(b"\0").decode() for row in _records(out, samples.PROCESSES)}
    assert next(out.glob("summary-*.json"))

    storm = _run(broker, "conn", clients=300, duration=1.2, keepalive=2)  # the same broker: starting one is slow
    assert storm["connected"] == 300 and storm["connect_failed"] == 0 and storm["dropped"] == 0
    assert storm["connect_rate"] > 0 and storm["pongs"] > 0
    assert storm["rss_per_conn_kb"] is not None


def test_preset_by_name_with_command_line_overrides(broker, capsys) -> None:
    """`plexmq bench p2p2k1 -c 3 -d 1`: the preset's QoS, window and rate, the command line's size and
    time; the broker's CPU seconds in the window are reported over all its processes."""
    status = cli.main(["p2p2k1", "-p", str(broker.port), "--broker-pid", str(broker.proc.pid), "-c", "3", "-d", "1",
                       "--settle", "0.1", "--procs", "2", "--quiet", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert status == 0 and result["ok"], result
    assert (result["scenario"], result["qos"], result["window"], result["rate"]) == ("p2p", 1, 10, 5.0)
    assert (result["clients"], result["duration"], result["connected"]) == (3, 1.0, 6)
    assert result["received"] == result["expected"] == result["acked"] == result["sent"] > 0
    assert result["broker_cpu_s"] is not None and result["broker_cpu_s"] >= 0 and result["broker_procs"] >= 3


def test_light_group_is_the_light_load_table() -> None:
    """Each row as the light-load table states it (bench/RESULTS.md, the `light` group): sizes, rates,
    QoS, 15 s for p2p, and the plexmq workers of the connect storm and the 100k idle clients."""
    assert presets.expand("light,lat0") == ["lat0", "p2p2k0", "p2p2k1", "p2p9k1", "connstorm15k", "idle100k", "fanin1"]
    p2p = presets.options("p2p9k1")
    assert (p2p.pubs, p2p.subs, p2p.qos, p2p.rate, p2p.duration) == (9000, 9000, 1, 2.0, 15.0)
    assert presets.options("p2p2k0", duration=2.0).duration == 2.0
    assert [compare.plexmq_workers(s, presets.options(s).connections, 1) for s in ("lat0", "p2p9k1", "connstorm15k",
                                                                                   "idle100k")] == [1, 1, 2, 8]
    with pytest.raises(KeyError):
        presets.expand("light,nope")


@pytest.mark.skipif(not os.path.exists(brokers.MOSQUITTO), reason="mosquitto not installed")
def test_compare_reports_broker_cpu_seconds_for_both_brokers(capsys) -> None:
    status = compare.main(["--scenarios", "lat0", "--brokers", "plexmq,mosquitto", "-d", "0.5", "--quiet", "--json"])
    out = capsys.readouterr().out
    assert status == 0
    results = json.loads(out[out.index("{"):])["lat0"]
    for name in ("plexmq", "mosquitto"):
        assert results[name]["ok"] and results[name]["broker_cpu_s"] >= 0 and results[name]["sent"] > 0
    assert any(line.split()[:3] == ["broker", "cpu", "s"] for line in out.splitlines())


def test_profile_counts_threads_of_every_broker_process(broker, tmp_path: Path, capsys) -> None:
    """Per process and per thread (the ZeroMQ I/O threads included): CPU and context switches, read
    from /proc over the window."""
    status = profile.main([str(broker.proc.pid), "-d", "0.5", "--out", str(tmp_path)])
    text = capsys.readouterr().out
    report_ = json.loads((tmp_path / "profile.json").read_text())
    assert status == 0 and {"acceptor", "router", "worker-0"} <= set(report_["processes"])
    router = report_["processes"]["router"]
    assert router["vcsw_per_s"] >= 0 and all({"thread", "cpu_pct", "vcsw_per_s"} <= set(t) for t in router["threads"])
    assert "router" in text and "voluntary" in text


def test_profile_summary_merges_lines_of_a_function() -> None:
    raw = ("_run_module_as_main (<frozen runpy>:198);main (w.py:10);flush (c.py:299) 6\n"
           "_run_module_as_main (<frozen runpy>:198);main (w.py:10);flush (c.py:301) 2\n"
           "_run_module_as_main (<frozen runpy>:198);main (w.py:12) 2\n")
    summary = profile.summarize(raw, top=5)
    assert summary["samples"] == 10
    assert summary["self"] == [("flush (c.py)", 80.0), ("main (w.py)", 20.0)]
    assert summary["inclusive"] == [("main (w.py)", 100.0), ("flush (c.py)", 80.0)]


def test_floor_measures_a_bare_connection_both_ways() -> None:
    """bench.floor holds real connections and says what each costs: a uvloop transport about a
    kilobyte (RSS growth over 2,000 connections: one clean-clone run measured 999 bytes, so no sharp line at
    1,000), the worker's Poller well under half of that (each run as its own process: RSS growth
    means nothing in one that has freed memory before)."""
    def per_connection(*how: str) -> int:
        said = subprocess.run([sys.executable, "-m", "plexmq.bench.floor", "-n", "2000", *how], capture_output=True,
                              text=True, check=True, timeout=120, cwd=ROOT).stdout
        return int(re.search(r"one-slot protocol: (\d+) bytes of RSS each", said).group(1))  # type: ignore[union-attr]  # the probe prints it
    uvloop_transport = per_connection("--uvloop")
    assert uvloop_transport > 800
    assert per_connection() < uvloop_transport / 2


def test_mqload_command_lines_follow_the_presets() -> None:
    """mqload gets the preset's sizes, the source addresses and processes that many sockets need, and a
    thread per core (or --procs)."""
    args = mqload.arguments(presets.options("p2p9k1"), 1883)
    given = dict(zip(args[1::2], args[2::2]))
    assert args[0] == "p2p" and {"-c": "9000", "-q": "1", "-r": "2", "-w": "10", "-d": "15", "-b": "2"}.items() <= given.items()
    idle = mqload.arguments(presets.options("idle100k"), 1883)
    assert idle[idle.index("-T") + 1] == "6" and "-F" in idle and idle[idle.index("-b") + 1] == "11"
    fanin = dict(zip(*[iter(mqload.arguments(presets.options("lat0"), 1883)[1:])] * 2))
    assert (fanin["-P"], fanin["-S"], fanin["-r"], fanin["-q"]) == ("100", "1", "100", "0")
    assert fanin["-T"] == str(os.cpu_count()) and "-F" not in fanin  # a thread per core, as our generator's processes
    assert dict(zip(*[iter(mqload.arguments(presets.options("lat0", procs=3), 1883)[1:])] * 2))["-T"] == "3"


def _mqload_on_plexmq(capsys, scenario: str, duration: str) -> tuple[int, dict]:
    """`python -m plexmq.bench.mqload` of one scenario on plexmq: its exit status and plexmq's result."""
    status = mqload.main(["--scenarios", scenario, "--brokers", "plexmq", "-d", duration, "--json"])
    out = capsys.readouterr().out
    return status, json.loads(out[out.index("{"):])[scenario]["plexmq"]


@needs_mqload
def test_mqload_run_reads_the_broker_cpu_over_its_window(capsys) -> None:
    status, result = _mqload_on_plexmq(capsys, "lat0", "1")
    assert status == 0 and result["mqload_exit"] == 0, result
    assert result["msgs_out_per_s"] > 0 and result["lost"] == 0 and result["broker_cpu_s"] > 0
    assert result["latency_ms"]["p50"] <= result["latency_ms"]["p99"]
    assert result["broker_connect_us"] is None  # its connect window holds subscribing: not a connect's cost


def test_broker_cpu_per_connect_comes_from_the_cpu_share_and_the_rate() -> None:
    assert report.per_connect_us(110.0, 10_000) == 110.0  # 1.1 cores at 10k conn/s: 110 µs each
    assert report.per_connect_us(None, 10_000) is None and report.per_connect_us(50.0, 0) is None
    raw = {"conns": "1000", "connect_rate": "20000", "connect_s": "0.05"}
    storm = mqload.report(raw, 0.1, 1.0, (0, 0), presets.options("connstorm15k"), (0.11, 0.1),
                          {"acceptor": 0.02, "router": 0.015, "workers": 0.075})
    assert storm["broker_connect_cpu_pct"] == 110.0 and storm["broker_connect_us"] == 110.0  # 0.11 s for 1,000
    assert (storm["acceptor_connect_us"], storm["router_connect_us"], storm["workers_connect_us"]) == (20.0, 15.0, 75.0)


@needs_mqload
def test_a_connect_storm_says_what_each_role_of_plexmq_spends(capsys) -> None:
    """The acceptor's, the router's and the workers' CPU per connection, measured over the connect phase."""
    status, result = _mqload_on_plexmq(capsys, "connstorm15k", "0.5")
    assert status == 0 and result["connected"] == 15_000, result
    shares = [result[f"{role}_connect_us"] for role in ("acceptor", "router", "workers")]
    assert all(share > 0 for share in shares) and sum(shares) <= result["broker_connect_us"] * 1.2 + 5, result


def test_fanin_and_fanout_count_every_delivery(start_broker) -> None:
    broker = start_broker()
    fanin = _run(broker, "fanin", pubs=6, subs=2, rate=200, duration=0.7)
    assert fanin["sent"] >= 700 and fanin["expected"] == 2 * fanin["sent"]
    assert fanin["received"] == fanin["expected"] and fanin["lost"] == 0 and fanin["ok"]
    fanout = _run(broker, "fanout", pubs=1, subs=20, duration=0.7, qos=2)  # max rate, end-to-end window
    assert fanout["sent"] > 50 and fanout["received"] == 20 * fanout["sent"]
    assert fanout["lost"] == fanout["duplicated"] == 0 and fanout["ok"]


def test_protocol_5_runs_count_every_delivery(start_broker, capsys) -> None:
    """--protocol 5: 5.0 CONNECT, SUBSCRIBE, PUBLISH (property blocks) and acks through the real broker,
    with the 3.1.1 runs' accounting; a kept 5.0 session needs an expiry, which the bench sends."""
    broker = start_broker("--workers", "1")
    status = cli.main(["fanin", "-p", str(broker.port), "--broker-pid", str(broker.proc.pid), "-P", "4", "-S", "2",
                       "-q", "1", "-d", "0.7", "--settle", "0.1", "--procs", "2", "--quiet", "--json",
                       "--protocol", "5"])
    fanin = json.loads(capsys.readouterr().out)
    assert status == 0 and fanin["ok"] and fanin["protocol"] == "5.0", fanin
    assert fanin["sent"] > 100 and fanin["acked"] == fanin["sent"]
    assert fanin["received"] == fanin["expected"] == 2 * fanin["sent"] and fanin["lost"] == fanin["duplicated"] == 0
    fanin0 = _run(broker, "fanin", protocol=5, pubs=6, subs=2, duration=0.7)  # max rate: the bulk counting path
    assert fanin0["sent"] > 100 and fanin0["received"] == fanin0["expected"] and fanin0["ok"]
    fanout = _run(broker, "fanout", protocol=5, pubs=1, subs=20, duration=0.7, qos=2)
    assert fanout["sent"] > 50 and fanout["received"] == 20 * fanout["sent"] and fanout["ok"]
    ided = _run(broker, "p2p", protocol=5, clients=4, qos=1, duration=0.5, sub_identifier=7)  # read past its property
    assert ided["ok"] and ided["received"] == ided["expected"] > 0
    kept = _run(broker, "fanin", protocol=5, pubs=2, subs=1, qos=1, duration=0.5, persistent_subs=True,
                client_prefix="p5bench-")
    assert kept["ok"] and kept["received"] == kept["expected"] > 0 and kept["protocol"] == "5.0"
    client = RawClient(broker.port)
    try:
        assert client.connect5("p5bench-s0", clean_start=False)[:2] == (True, 0)
    finally:
        client.close()


def test_protocol_5_refusals_are_counted_by_reason(start_broker, tmp_path: Path) -> None:
    """A 5.0 PUBACK with a failure reason (0x87: the ACL denies the topic) frees the publisher's window
    and is counted; its messages are lost, and the run says so."""
    acl = tmp_path / "acl"
    acl.write_text("topic read bench/#\n")
    config = tmp_path / "plexmq.toml"
    config.write_text(f'acl_file = "{acl}"\nallow_anonymous = true\n')
    broker = start_broker("--workers", "1", "--config", str(config))
    result = _run(broker, "fanin", protocol=5, pubs=2, subs=1, qos=1, rate=200, duration=0.5)
    assert result["sent"] > 50 and result["received"] == result["acked"] == result["protocol_errors"] == 0
    assert result["errors"] == {"refused_0x87": result["sent"]} and result["lost"] == result["expected"]
    assert not result["ok"] and cli.exit_status(result) == 1
    assert any("not authorized (0x87)" in note for note in result["notes"])


def test_protocols_table_sets_5_0_beside_3_1_1() -> None:
    """Each level's runs, their median, and the ratio of the medians; a metric no run has is '-'."""
    def run(out: int) -> dict:
        return {"msgs_out_per_s": out, "msgs_in_per_s": out, "lost": 0, "latency_ms": {"p50": 1.0, "p99": 2.0},
                "broker_cpu_pct": None, "generator_cpu_pct": 50.0, "broker_rss_mb": 100.0}

    text = protocols.table({"fanin0": {4: [run(100), run(300), run(200)], 5: [run(90), run(270), run(180)]}})
    rows = {cells[-6]: cells[-5:] for cells in (re.split(r"\s{2,}", line.strip()) for line in text.splitlines()[2:])}
    assert rows["msgs/s out"] == ["100 / 300 / 200", "200", "90 / 270 / 180", "180", "0.90"]
    assert rows["broker cpu %"] == ["- / - / -", "-", "- / - / -", "-", "-"]


def test_clients_spread_under_the_fd_cap() -> None:
    opts = with_defaults(Options("fanin", pubs=100, subs=1))
    shares = assign(opts, 2, cap=1000)
    assert shares[0].subs == [0] and shares[0].pubs == []  # the busy subscriber gets a process of its own
    assert sorted(shares[1].pubs) == list(range(100))
    pairs = assign(with_defaults(Options("p2p", clients=10)), 3, cap=1000)
    assert all(s.pubs == s.subs for s in pairs)  # a pair never spans processes


def test_persistent_subscribers_keep_their_sessions(start_broker) -> None:
    broker = start_broker("--workers", "1")
    fanin = _run(broker, "fanin", pubs=4, subs=2, qos=1, duration=0.5, persistent_subs=True,
                 client_prefix="pbench-")
    assert fanin["persistent_subs"] and fanin["ok"] and fanin["lost"] == 0
    assert fanin["received"] == fanin["expected"] > 0
    client = RawClient(broker.port)  # the subscriber's stable id finds the session it left behind
    try:
        assert client.connect("pbench-s1", clean=False) == (True, 0)
    finally:
        client.close()


def test_persistent_connections_each_leave_a_session(start_broker) -> None:
    broker = start_broker("--workers", "2")
    conn = _run(broker, "conn", clients=6, duration=0.3, persistent_conns=True, client_prefix="pconn-")
    assert conn["persistent_conns"] and conn["ok"] and conn["connected"] == 6
    client = RawClient(broker.port)  # the ids carry the run id: each run's sessions are its own
    try:
        assert client.connect(f"pconn-{conn['run_id']}-c0", clean=False) == (True, 0)
    finally:
        client.close()


def test_noisy_neighbour_script_small(capsys) -> None:
    """Tenant B's load alone and with tenant A flooding: B loses nothing, A is held near its limit; A's
    publishers alone, under and at its limit, each with the broker's CPU per message."""
    status = tenants.main(["-d", "1", "--lead", "0.5", "--b-pairs", "2", "--b-rate", "50", "--a-rate", "100",
                           "--a-pubs", "2", "--cost-duration", "1", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert status == 0, result
    for run in ("b_alone", "b_with_a"):
        assert result[run]["msgs_per_s"] > 0 and result[run]["lost"] == 0 and result[run]["p99_ms"] > 0
    assert 0 < result["a_achieved_per_s"] <= 2 * result["a_limit_per_s"] < result["a_sent_per_s"]
    assert set(result["a_cost"]) == {"unthrottled", "throttled"}
    # CPU time counts in 10 ms ticks: a second of throttled traffic may cost less than one
    assert all(run["msgs_per_s"] > 0 and run["us_per_msg"] >= 0 for run in result["a_cost"].values())


def test_durability_script_small(capsys) -> None:
    """The whole script on a small load: sessions, fill, restart, the probe's messages in order."""
    status = durability.main(["-n", "40", "-m", "5", "--publishers", "3", "--window", "7", "--json", "--quiet"])
    result = json.loads(capsys.readouterr().out)
    assert status == 0 and result["ok"], result
    assert result["sessions_ok"] == 40 and result["published"] == 200
    assert result["loaded_sessions"] == 40 and result["loaded_messages"] == 200
    assert result["probe_received"] == 5 and result["probe_in_order"] and result["session_present"]
    assert 0 < result["connack_s"] <= result["first_message_s"] <= result["all_messages_s"]
    assert result["disk_filled"]["total_mb"] > 0 and result["rss_filled_mb"]["router"] > 0
    assert not Path(result["data_dir"]).exists()  # the temporary data dir is gone


def test_latency_samples_are_decimated_evenly_and_stay_aligned() -> None:
    """Past the cap every other kept sample goes and the stride doubles; the columns stay rows."""
    from plexmq.bench.rawout import LatencySamples

    kept = LatencySamples(8)
    for i in range(100):
        kept.add(sent_ns=i, recv_ns=i + 1000, pub=i % 7, seq=i, sub=3)
    assert kept.stride == 16
    assert list(kept.seq) == list(range(0, 100, 16))
    assert [list(kept.sent_ns), list(kept.recv_ns), list(kept.pub), list(kept.sub)] == [
        list(kept.seq), [i + 1000 for i in kept.seq], [i % 7 for i in kept.seq], [3] * len(kept.seq)]


def test_bench_help_lists_every_preset_and_tool_and_each_tool_answers_help(tmp_path: Path) -> None:
    """A newcomer's first look: `plexmq bench --help` names the presets and the tools, and each tool is
    reached as `plexmq bench TOOL` (its own --help)."""
    run = [sys.executable, "-m", "plexmq.acceptor", "bench"]
    said = subprocess.run([*run, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True).stdout
    for name in [*presets.PRESETS, *cli.TOOLS]:
        assert re.search(rf"^  {name} ", said, re.MULTILINE), f"{name} not listed:\n{said}"
    for tool in cli.TOOLS:
        done = subprocess.run([*run, tool, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0 and "usage:" in done.stdout, (tool, done.stderr[-2000:])


def test_mqload_is_found_beside_the_working_directory_and_a_missing_one_says_how_to_build_it(tmp_path: Path) -> None:
    """An installed plexmq has no checkout beside it: mqload is looked for on the PATH and in
    shared/tools/mqload beside the working directory, and where there is none the line says how
    to build it."""
    built = tmp_path / "work" / "shared" / "tools" / "mqload" / "mqload"
    built.parent.mkdir(parents=True)
    built.write_text("#!/bin/sh\n")
    built.chmod(0o755)
    (tmp_path / "work" / "plexmq").mkdir()
    code = "from plexmq.bench import mqload; print(mqload.DEFAULT_BINARY)"
    env = {k: v for k, v in os.environ.items() if k != "MQLOAD"} | {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    found = subprocess.run([sys.executable, "-c", code], cwd=tmp_path / "work" / "plexmq", env=env, capture_output=True,
                           text=True, timeout=30, check=True).stdout.strip()
    if not os.access(ROOT.parent / "shared" / "tools" / "mqload" / "mqload", os.X_OK):  # a checkout's build comes first
        assert found == str(built)
    env["MQLOAD"] = str(tmp_path / "none")
    done = subprocess.run([sys.executable, "-m", "plexmq.bench.mqload"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 2 and "make -C ../shared/tools/mqload" in done.stderr, done.stderr


def test_scale_places_pairs_beside_or_across_and_tables_each_count_against_one_worker() -> None:
    """bench.scale: c pairs a multiple of K put each pair on one worker, one more puts every pair across
    two; the table gives each count's ratio to one worker and, per QoS, across against beside."""
    from plexmq.bench import scale

    assert [scale.options("p2p1-beside", k, 1.0).clients % k for k in (1, 2, 3, 14)] == [0, 0, 0, 0]
    assert [scale.options("p2p1-across", k, 1.0).clients % k for k in (2, 3, 14)] == [1, 1, 1]

    def run(msgs: int, router_us: float) -> dict:
        return {"scenario": "p2p", "msgs_out_per_s": msgs, "router_us_per_msg": router_us, "broker_cpu_pct": 90.0}

    results = {"p2p0-beside": {"plexmq-w1": run(100_000, 0.0), "plexmq-w2": run(180_000, 0.01), "mosquitto": run(50_000, 0)},
               "p2p0-across": {"plexmq-w1": run(100_000, 0.0), "plexmq-w2": run(90_000, 1.5), "mosquitto": run(50_000, 0)}}
    text = scale.table(results, [1, 2], ["mosquitto"])
    assert re.search(r"p2p0-beside\s+1\s+100,000\s+1\.00\s+0\.00\s+90\s+50,000", text), text
    assert re.search(r"^\s+2\s+180,000\s+1\.80\s+0\.01\s+90\s*$", text, re.MULTILINE), text
    assert "QoS 0, --workers 2: pairs across workers get 0.50 of pairs on one" in text


@pytest.mark.skipif(not os.path.exists(brokers.MOSQUITTO), reason="mosquitto not installed")
def test_bridge_counts_every_message_across_both_bridges(capsys) -> None:
    """`plexmq bench bridge` on 200 messages: plexmq's bridge and mosquitto's each carry all of them to
    the remote at QoS 0 and 1, in order at QoS 1, with a rate for each and a ratio for each QoS."""
    status = bridge_bench.main(["--qos0-messages", "200", "--qos1-messages", "200", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert status == 0, result
    assert sorted((r["broker"], r["qos"]) for r in result["runs"]) == [("mosquitto", 0), ("mosquitto", 1),
                                                                        ("plexmq", 0), ("plexmq", 1)]
    for run in result["runs"]:
        assert run["received"] == 200 and run["lost"] == 0 and run["msgs_per_s"] > 0, run
        assert run["local_us_per_msg"] >= 0  # CPU time counts in 10 ms ticks: 200 messages may cost less than one
        if run["qos"]:
            assert run["duplicates"] == 0 and run["out_of_order"] == 0, run
    assert result["summary"]["qos0"]["ratio"] > 0 and result["summary"]["qos1"]["ratio"] > 0


@pytest.mark.skipif(not os.path.exists(brokers.MOSQUITTO), reason="mosquitto not installed")
def test_bridge_memory_runs_plexmq_at_mosquittos_durability(capsys) -> None:
    """`--memory` adds plexmq with --no-persistence (its bridge's queue in memory, as mosquitto's in the bench)
    to the rotation: it carries every message too, and the summary gives its ratio beside the journaled one."""
    status = bridge_bench.main(["--qos0-messages", "50", "--qos1-messages", "50", "--memory", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert status == 0, result
    memory = [r for r in result["runs"] if r["broker"] == bridge_bench.MEMORY]
    assert sorted(r["qos"] for r in memory) == [0, 1]
    assert all(r["received"] == 50 and r["lost"] == 0 for r in memory), memory
    assert result["summary"]["qos1"]["memory_ratio"] > 0


@pytest.mark.skipif(not os.path.exists(brokers.MOSQUITTO), reason="mosquitto not installed")
def test_bridge_protocol_sets_what_both_bridges_speak_to_the_remote(capsys) -> None:
    """`--protocol 5.0`: plexmq's bridge (`protocol = "5.0"`) and mosquitto's (`bridge_protocol_version
    mqttv50`) both speak 5.0 to the remote, and carry every message; 3.1.1 is the default, as mosquitto's."""
    status = bridge_bench.main(["--qos0-messages", "50", "--qos1-messages", "50", "--protocol", "5.0", "--json"])
    result = json.loads(capsys.readouterr().out)
    assert status == 0, result
    assert {r["protocol"] for r in result["runs"]} == {"5.0"}
    assert all(r["received"] == 50 and r["lost"] == 0 for r in result["runs"]), result["runs"]
    confs = Path(result["log_dir"]).glob("*")
    said = "".join(path.read_text() for path in confs if path.suffix in (".conf", ".toml"))
    assert "bridge_protocol_version mqttv50" in said and 'protocol = "5.0"' in said
    assert bridge_bench.main(["--qos0-messages", "20", "--qos1-messages", "20", "--json"]) == 0
    assert {r["protocol"] for r in json.loads(capsys.readouterr().out)["runs"]} == {"3.1.1"}
