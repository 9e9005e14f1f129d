"""The worker's archive writer and the segment format (no Spark): what goes in comes out, in the right files."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from paho.mqtt.client import MQTTv5, MQTTv31

from plexmq.archive_format import (
    HOUR_US,
    VERSION,
    Record,
    Run,
    UnknownVersion,
    decode_segment,
    encode_chunk,
    records,
    segment_header,
    sender,
)
from plexmq.mqtt import v4
from plexmq.workers import archive
from plexmq.workers.archive import ArchiveWriter
from tests.archives import T0, publish_properties, run, version_2_segment
from tests.conftest import Broker
from tests.mqtt import Client


def sealed(root: Path) -> list[Path]:
    return sorted(root.glob("date=*/hour=*/*.seg"))


def parts(root: Path) -> list[Path]:
    return sorted((root / archive.STAGING).glob("*" + archive.PART_SUFFIX))


def read_all(root: Path) -> list[Record]:
    out: list[Record] = []
    for path in sealed(root):
        segment = decode_segment(path.read_bytes())
        assert segment.damage is None, path
        out += records(segment)
    return sorted(out)


def chunk(records: list[Record]) -> bytes:
    return b"".join(encode_chunk([r.run() for r in records]))


def append(w: ArchiveWriter, r: Record) -> None:
    w.append("", r.run())


def writer(root: Path, worker_id: int = 0, roll_bytes: int = 1 << 20, roll_seconds: float = 60.0) -> ArchiveWriter:
    return ArchiveWriter(str(root), worker_id, ["#"], roll_bytes, roll_seconds)


def test_records_round_trip_exactly(tmp_path: Path) -> None:
    sent = [
        Record(T0, "sensors/a/temp", 0, False, b"21.5", "dev-a", "alice"),
        Record(T0 + 1, "sensors/b/temp", 1, True, bytes(range(256)), "dev-b", None),
        Record(T0 + 2, "capteurs/é/température", 2, False, b"", "appareil-ü", ""),
        Record(T0 + 3, "bin", 1, False, b"\x00\r\n\xff" * 1000, "", "bob"),
    ]
    w = writer(tmp_path, worker_id=7)
    for r in sent:
        append(w, r)
    w.close()
    assert parts(tmp_path) == []
    (path,) = sealed(tmp_path)
    segment = decode_segment(path.read_bytes())
    assert segment.worker_id == 7
    assert list(records(segment)) == sent


def test_segments_are_partitioned_by_utc_date_and_hour(tmp_path: Path) -> None:
    times = [T0 - 1, T0, T0 + HOUR_US - 1, T0 + HOUR_US, T0 + 25 * HOUR_US]
    w = writer(tmp_path)
    for t in times:  # all in one chunk: the writer splits it at the hour boundaries
        w.append("", run(t, b"x"))
    w.close()
    found = {}
    for path in sealed(tmp_path):
        found[str(path.parent.relative_to(tmp_path))] = [r.recv_us for r in records(decode_segment(path.read_bytes()))]
    assert found == {
        "date=2024-04-30/hour=23": [T0 - 1],
        "date=2024-05-01/hour=00": [T0, T0 + HOUR_US - 1],
        "date=2024-05-01/hour=01": [T0 + HOUR_US],
        "date=2024-05-02/hour=01": [T0 + 25 * HOUR_US],
    }


def test_segments_roll_by_bytes_between_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(archive, "WRITE_SECONDS", 0.0)  # every flush writes a chunk
    sent = [Record(T0 + i, "t", 0, False, bytes(500), "c", None) for i in range(10)]
    w = writer(tmp_path / "a", roll_bytes=2000)
    for r in sent:
        append(w, r)
        w.flush()
    w.close()
    assert [len(list(records(decode_segment(p.read_bytes())))) for p in sealed(tmp_path / "a")] == [4, 4, 2]
    w = writer(tmp_path / "b", roll_bytes=2000)
    for r in sent:
        append(w, r)
    w.close()  # one chunk of 10: a chunk is never split
    assert len(sealed(tmp_path / "b")) == 1
    assert read_all(tmp_path / "a") == read_all(tmp_path / "b") == sent


def test_segments_roll_by_age_even_when_idle(tmp_path: Path) -> None:
    w = writer(tmp_path, roll_seconds=0.05)
    w.append("", run(T0, b"x"))
    w.flush()  # the first write goes out at once
    assert sealed(tmp_path) == [] and len(parts(tmp_path)) == 1
    time.sleep(0.06)
    w.flush()  # nothing pending: only the age check
    assert parts(tmp_path) == [] and len(sealed(tmp_path)) == 1


def test_records_wait_for_a_full_chunk_under_load(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.append("", run(T0, b"x"))
    w.flush()
    (part,) = parts(tmp_path)
    size = part.stat().st_size
    big = run(T0, bytes(1000))
    for _ in range(archive.CHUNK_BYTES // len(big[2])):
        w.append("", big)
        w.flush()
    assert part.stat().st_size == size  # within WRITE_SECONDS of the last write: kept in memory
    w.append("", big)
    w.flush()
    assert part.stat().st_size > size


def test_a_torn_or_damaged_chunk_is_skipped_and_counted(tmp_path: Path) -> None:
    first = [Record(T0, "a", 0, False, b"one", "c", None)]
    second = [Record(T0 + 1, "b", 1, True, b"two", "c", "u")] * 3
    data = segment_header(1) + chunk(first) + chunk(second)
    at = len(segment_header(1) + chunk(first))  # where the second chunk starts
    for cut in (1, 10, len(chunk(second)) - 1):
        segment = decode_segment(data[:-cut])
        assert list(records(segment)) == first
        what = "truncated chunk header" if cut > len(chunk(second)) - 12 else "truncated chunk"
        assert segment.damage == f"{what} at byte {at} ({len(chunk(second)) - cut} bytes)"
        assert segment.skipped_bytes == len(chunk(second)) - cut
    zero_filled = decode_segment(segment_header(1) + chunk(first) + bytes(4096))
    assert list(records(zero_filled)) == first and zero_filled.skipped_bytes == 4096
    assert zero_filled.damage == f"unreadable chunk header at byte {at} (4096 bytes)"
    assert decode_segment(b"PK\x03\x04 not a segment").damage == "not a plexmq archive segment at byte 0 (18 bytes)"


def test_reading_goes_on_after_a_damaged_chunk_and_says_where() -> None:
    """A bit flipped in a chunk's body (bad storage) or a body that does not parse costs that chunk
    only: the reader skips it by its length and keeps the chunks after it."""
    runs = [[Record(T0 + i, "t", 0, False, b"payload %d" % i, "c", None)] for i in range(4)]
    chunks = [chunk(r) for r in runs]
    data = bytearray(segment_header(1) + b"".join(chunks))
    starts = [len(segment_header(1)) + sum(map(len, chunks[:i])) for i in range(4)]
    data[starts[2] - 2] ^= 0x10  # the end of the second chunk's payload
    data[starts[3] - 2] ^= 0x10  # and of the third's
    segment = decode_segment(bytes(data))
    assert list(records(segment)) == runs[0] + runs[3]
    assert segment.damage == (f"damaged chunk at byte {starts[1]} ({len(chunks[1])} bytes); "
                              f"damaged chunk at byte {starts[2]} ({len(chunks[2])} bytes)")
    assert segment.skipped_bytes == len(chunks[1]) + len(chunks[2])


def test_a_segment_of_an_unknown_version_stops_the_reader() -> None:
    newer = struct.pack("<4sII", b"PXAR", VERSION + 1, 1) + chunk([Record(T0, "t", 0, False, b"x", "c", None)])
    expected = f"^segment format version {VERSION + 1}; this plexmq reads versions 2 and 3$"
    with pytest.raises(UnknownVersion, match=expected):
        decode_segment(newer)


def test_a_restarted_worker_seals_what_its_crashed_predecessor_left(tmp_path: Path) -> None:
    crashed = writer(tmp_path, worker_id=3)
    crashed.append("", run(T0, b"kept"))
    crashed.flush()
    crashed.append("", run(T0, b"lost with the process"))
    other = writer(tmp_path, worker_id=4)  # alive: its segment is left alone
    other.append("", run(T0, b"x"))
    other.flush()
    assert sealed(tmp_path) == []
    writer(tmp_path, worker_id=3)
    (path,) = sealed(tmp_path)
    assert path.name.startswith("w3-") and [r.payload for r in records(decode_segment(path.read_bytes()))] == [b"kept"]
    assert [p.name[:3] for p in parts(tmp_path)] == ["w4-"]


def test_write_errors_drop_records_but_not_the_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = writer(tmp_path)

    def full(fd: int, data: list[bytes]) -> int:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(archive.os, "writev", full)
        w.append("", run(T0, b"x"))
        w.flush()
    assert w.dropped_bytes == len(run(T0, b"x")[2])
    w.append("", run(T0 + 1, b"y"))
    w.close()
    assert [r.payload for r in read_all(tmp_path)] == [b"y"]


def test_filters_match_like_subscriptions_and_hash_skips_sys(tmp_path: Path) -> None:
    w = ArchiveWriter(str(tmp_path), 0, ["sensors/#", "+/status"], 1 << 20, 60)
    assert w.wants(b"sensors/a/temp") and w.wants(b"sensors") and w.wants(b"dev1/status")
    assert not w.wants(b"dev1/status/x") and not w.wants(b"other")
    every = ArchiveWriter(str(tmp_path), 1, ["#"], 1 << 20, 60)
    assert every.wants(b"a/b") and not every.wants(b"$SYS/broker/load")
    assert ArchiveWriter(str(tmp_path), 2, ["$SYS/#"], 1 << 20, 60).wants(b"$SYS/broker/load")


def test_5_0_records_keep_user_properties_and_content_type(tmp_path: Path) -> None:
    sent = [
        Record(T0, "s/a", 1, False, b"{}", "dev-5", "eve", 5, "application/json",
               (("unit", "C"), ("tag", "a"), ("tag", "b"), ("é", ""))),
        Record(T0 + 1, "s/b", 0, True, b"", "dev-5", "eve", 5, None, ()),  # 5.0 without properties
        Record(T0 + 2, "s/c", 2, False, b"x", "dev-5", "eve", 5, "", (("k", "v"),)),  # empty content type
        Record(T0 + 3, "s/d", 0, False, b"y", "dev-4", None),  # 3.1.1 beside them in the chunk
        Record(T0 + 4, "s/e", 1, False, b"z", "dev-3", None, 3),
    ]
    w = writer(tmp_path)
    for r in sent:
        append(w, r)
    w.close()
    assert read_all(tmp_path) == sent


def test_version_2_segments_are_still_read() -> None:
    old = Record(T0, "old/t", 1, False, b"kept", "dev-old", "olga", level=0)
    segment = decode_segment(version_2_segment(6, old))
    assert segment.worker_id == 6 and segment.damage is None
    assert list(records(segment)) == [old]


def test_a_5_0_run_whose_property_block_does_not_fit_is_a_damaged_chunk() -> None:
    good = Record(T0, "a", 0, False, b"one", "c", None, 5, "text/plain", ())
    bad_run: Run = (T0, sender("c", None, 5), v4.encode_publish(b"a", b"\x05abc"))  # no property block
    data = segment_header(1) + chunk([good]) + b"".join(encode_chunk([bad_run]))
    segment = decode_segment(data)
    assert list(records(segment)) == [good]
    at = len(segment_header(1) + chunk([good]))
    assert segment.damage == f"damaged chunk at byte {at} ({len(data) - at} bytes)"


def test_a_broker_archives_what_paho_clients_publish_with_their_properties(
        tmp_path: Path, start_broker: Callable[..., Broker]) -> None:
    """paho 5.0, 3.1.1 and 3.1 clients publish through one worker; after a clean stop the segments
    hold each message with the publisher's level, and the 5.0 ones with exactly their user properties
    (order and repeats kept) and content type."""
    config = tmp_path / "plexmq.toml"
    config.write_text(f'[archive]\nenabled = true\ndir = "{tmp_path / "archive"}"\n')
    b = start_broker("--workers", "1", "--config", str(config))
    pairs = [("unit", "°C"), ("site", "north"), ("unit", "K"), ("empty", "")]
    c5 = Client(b.port, "dev-5", protocol=MQTTv5, username="eve")
    c5.publish("sensors/5/temp", b"{\"t\": 21}", qos=0, properties=publish_properties("application/json", pairs))
    c5.publish("sensors/5/raw", b"\x00\x01", qos=2, properties=publish_properties(None, [("only", "one")]))
    c5.publish("sensors/5/bare", b"b", qos=1)  # its PUBACK follows the QoS 0 message before it
    c4, c3 = Client(b.port, "dev-4"), Client(b.port, "dev-3", protocol=MQTTv31)
    for c in (c4, c3):
        c.publish("sensors/old/temp", b"raw", qos=0)  # the raw QoS 0 path (archived as received)
        c.publish("sensors/old/hum", b"decoded", qos=1, retain=True)
    for c in (c5, c4, c3):
        c.disconnect()
    b.stop()

    got = sorted(r._replace(recv_us=0) for r in read_all(tmp_path / "archive"))
    assert got == sorted([
        Record(0, "sensors/5/temp", 0, False, b'{"t": 21}', "dev-5", "eve", 5, "application/json", tuple(pairs)),
        Record(0, "sensors/5/raw", 2, False, b"\x00\x01", "dev-5", "eve", 5, None, (("only", "one"),)),
        Record(0, "sensors/5/bare", 1, False, b"b", "dev-5", "eve", 5, None, ()),
        Record(0, "sensors/old/temp", 0, False, b"raw", "dev-4", None, 4, None, None),
        Record(0, "sensors/old/hum", 1, True, b"decoded", "dev-4", None, 4, None, None),
        Record(0, "sensors/old/temp", 0, False, b"raw", "dev-3", None, 3, None, None),
        Record(0, "sensors/old/hum", 1, True, b"decoded", "dev-3", None, 3, None, None),
    ])


def tenant_records(root: Path) -> dict[str, list[bytes]]:
    """The payloads of each tree's sealed segments: "" for the default tenant's, else the tenant's name."""
    found: dict[str, list[bytes]] = {}
    for path in sorted(root.rglob("*.seg")):
        relative = path.relative_to(root).parts
        tenant = relative[0].removeprefix("tenant=") if relative[0].startswith("tenant=") else ""
        found.setdefault(tenant, []).extend(r.payload for r in records(decode_segment(path.read_bytes())))
    return found


def test_each_tenant_has_its_own_tree_and_the_default_tenant_the_archive_itself(tmp_path: Path) -> None:
    """One chunk's worth of runs of three tenants, interleaved, comes out as one segment per tenant:
    the default tenant's where a broker without tenants writes them, the others' under tenant=NAME/."""
    w = writer(tmp_path)
    for i, tenant in enumerate(["", "acme", "", "beta", "acme"]):
        w.append(tenant, run(T0 + i, b"%s %d" % (tenant.encode(), i)))
    w.close()
    assert tenant_records(tmp_path) == {"": [b" 0", b" 2"], "acme": [b"acme 1", b"acme 4"], "beta": [b"beta 3"]}
    assert [str(p.relative_to(tmp_path).parent) for p in sorted(tmp_path.rglob("*.seg"))] == [
        "date=2024-05-01/hour=00", "tenant=acme/date=2024-05-01/hour=00", "tenant=beta/date=2024-05-01/hour=00"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_writing", "date=2024-05-01", "tenant=acme", "tenant=beta"]


def test_a_tenant_writes_its_parts_in_its_own_tree_and_they_roll_by_age_apart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(archive.time, "monotonic", lambda: now[0])
    w = writer(tmp_path, roll_seconds=10.0)
    w.append("acme", run(T0, b"a"))
    w.flush()  # the first write goes out at once
    (part,) = (tmp_path / "tenant=acme" / archive.STAGING).glob("*" + archive.PART_SUFFIX)
    assert parts(tmp_path) == []
    now[0] += 0.5
    w.append("", run(T0, b"d"))
    w.flush()  # within WRITE_SECONDS of acme's write: pending
    now[0] += 9.5
    w.flush()  # acme's segment is roll_seconds old: sealed; the default tenant's run is written
    assert not part.exists() and tenant_records(tmp_path) == {"acme": [b"a"]} and len(parts(tmp_path)) == 1
    now[0] += 9.9
    w.flush()  # the default tenant's segment is not old yet
    assert len(parts(tmp_path)) == 1
    now[0] += 0.1
    w.flush()
    assert parts(tmp_path) == [] and tenant_records(tmp_path) == {"": [b"d"], "acme": [b"a"]}


def test_a_restarted_worker_seals_its_parts_in_every_tenants_tree(tmp_path: Path) -> None:
    crashed = writer(tmp_path, worker_id=3)
    for tenant in ("", "acme", "beta"):
        crashed.append(tenant, run(T0, tenant.encode() or b"default"))
    crashed.flush()
    other = writer(tmp_path, worker_id=4)  # alive: its segment is left alone
    other.append("acme", run(T0, b"other"))
    other.flush()
    assert list(tmp_path.rglob("*.seg")) == []
    writer(tmp_path, worker_id=3)
    assert tenant_records(tmp_path) == {"": [b"default"], "acme": [b"acme"], "beta": [b"beta"]}
    assert [p.name[:3] for p in (tmp_path / "tenant=acme" / archive.STAGING).iterdir()] == ["w4-"]
