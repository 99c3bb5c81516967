"""The console's times and its drawn transaction timeline (app/console/templates.py): one
filter shows every time as ISO-8601 UTC with milliseconds, and the timeline is a pure
function from the page's events and markers to an inline SVG."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

from app.console.data import assigned, epoch_changes
from app.console.templates import (
    environment,
    human_age,
    human_bytes,
    iso_ms,
    record_rows,
    timeline_svg,
)

T = 1_795_842_723_771  # 2026-11-28 05:12:03.771Z


def test_times_are_iso_utc_with_milliseconds() -> None:
    assert iso_ms(T) == "2026-11-28 05:12:03.771Z"
    assert iso_ms(0) == "1970-01-01 00:00:00.000Z"
    assert iso_ms("2026-11-28T06:12:03.771+01:00") == "2026-11-28 05:12:03.771Z"
    assert iso_ms(datetime(2026, 11, 28, 5, 12, 3, 771999, tzinfo=UTC)) == (
        "2026-11-28 05:12:03.771Z"
    )
    assert iso_ms(None) == ""
    assert iso_ms("not a time") == "not a time"
    assert environment().from_string("{{ t | iso }}").render(t=T) == "2026-11-28 05:12:03.771Z"


def _event(i: int, state: str, at: int, epoch: int = 0, added: list[list[object]] | None = None):
    return {"event_id": i, "state": state, "producer_id": 7, "producer_epoch": epoch,
            "updated_ms": at, "added_partitions": added or []}  # fmt: skip


def test_timeline_draws_states_partitions_and_markers() -> None:
    events = [
        _event(1, "EMPTY", T),
        _event(2, "BEGIN", T + 10, added=[["t", 0], ["u<&>", 1]]),
        _event(3, "PREPARE_COMMIT", T + 20),
        _event(4, "COMPLETE_COMMIT", T + 30),
        _event(5, "BEGIN", T + 40, epoch=1, added=[["t", 0]]),
        _event(6, "PREPARE_ABORT", T + 50, epoch=1),
        _event(7, "COMPLETE_ABORT", T + 60, epoch=1),
        _event(8, "BEGIN", T + 70, epoch=1, added=[["t", 0]]),
    ]
    markers = [
        {"topic": "t", "partition": 0, "offset": 2, "control_type": "COMMIT", "timestamp": T + 25},
        {"topic": "u<&>", "partition": 1, "offset": 0, "control_type": "COMMIT",
         "timestamp": T + 26},
        {"topic": "t", "partition": 0, "offset": 4, "control_type": "ABORT", "timestamp": T + 55},
    ]  # fmt: skip
    svg = timeline_svg(events, markers)
    assert svg.startswith('<svg id="timeline"') and svg.endswith("</svg>")
    assert "<script" not in svg
    # One segment per event, each coloured by the outcome of its transaction.
    assert svg.count('class="segment"') == 8
    for state, outcome in [
        ("EMPTY", "open"), ("BEGIN", "commit"), ("PREPARE_COMMIT", "commit"),
        ("COMPLETE_COMMIT", "commit"), ("PREPARE_ABORT", "abort"), ("COMPLETE_ABORT", "abort"),
    ]:  # fmt: skip
        assert f'data-state="{state}" data-outcome="{outcome}"' in svg
    assert svg.count('data-state="BEGIN" data-outcome="abort"') == 1
    assert svg.count('data-state="BEGIN" data-outcome="open"') == 1  # the one still running
    assert ">BEGIN e1<" in svg and ">PREPARE_COMMIT e0<" in svg
    # A lane per partition added; a tick per marker with its offset.
    assert svg.count('class="partition"') == 2
    assert svg.count('class="marker"') == 3
    assert 'data-marker="COMMIT" data-offset="2"' in svg
    assert 'data-marker="ABORT" data-offset="4"' in svg
    assert ">COMMIT @2<" in svg and ">ABORT @4<" in svg
    assert svg.count('class="added"') == 4  # t-0 three times, u<&>-1 once
    # The axis shows ISO times; names are escaped.
    assert "2026-11-28 05:12:03.771Z" in svg
    assert "u<&>" not in svg and "u&lt;&amp;&gt;-1" in svg


def test_timeline_of_one_instant_and_of_nothing() -> None:
    svg = timeline_svg([_event(1, "EMPTY", T)], [])
    assert svg.count('class="segment"') == 1 and 'class="partition"' not in svg
    assert "no events" in timeline_svg([], [])


def test_epoch_changes_name_fences_and_bumps() -> None:
    events = [
        {**_event(1, "EMPTY", T), "reason": "InitProducerId: new transactional id"},
        {**_event(2, "BEGIN", T + 10), "reason": "AddPartitionsToTxn"},
        {**_event(3, "PREPARE_ABORT", T + 20, epoch=1),
         "reason": "InitProducerId: fenced the previous instance"},
        {**_event(4, "COMPLETE_ABORT", T + 30, epoch=1), "reason": "markers written"},
        {**_event(5, "EMPTY", T + 40, epoch=2), "reason": "InitProducerId"},
        {**_event(6, "EMPTY", T + 50, epoch=0), "producer_id": 8, "reason": "InitProducerId"},
    ]  # fmt: skip
    changes = epoch_changes(events)
    assert [(c["event_id"], c["kind"]) for c in changes] == [
        (1, "new producer id"), (3, "fence"), (5, "epoch bump"), (6, "new producer id"),
    ]  # fmt: skip
    fence = changes[1]
    assert fence["previous"] == [7, 0] and fence["producer_epoch"] == 1
    assert fence["updated_ms"] == T + 20
    assert fence["reason"] == "InitProducerId: fenced the previous instance"
    assert changes[0]["previous"] is None and changes[3]["previous"] == [7, 2]
    assert epoch_changes([]) == []


def test_timeline_marks_fences_apart_from_bumps() -> None:
    events = [
        _event(1, "BEGIN", T),
        {**_event(2, "PREPARE_ABORT", T + 10, epoch=1), "epoch_change": "fence",
         "reason": "transaction timed out"},
        _event(3, "COMPLETE_ABORT", T + 20, epoch=1),
        {**_event(4, "EMPTY", T + 30, epoch=2), "epoch_change": "epoch bump"},
    ]  # fmt: skip
    svg = timeline_svg(events, [])
    assert svg.count('class="fence"') == 1 and svg.count('class="bump"') == 1
    assert 'class="fence" data-event="2"' in svg
    assert "fence to epoch 1 at 2026-11-28 05:12:03.781Z: transaction timed out" in svg


def test_sizes_in_binary_units() -> None:
    assert human_bytes(0) == "0 bytes" and human_bytes(1023) == "1023 bytes"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(200 * 1024**2) == "200.0 MiB"
    assert human_bytes(3 * 1024**5) == "3072.0 TiB"
    assert environment().from_string("{{ n | bytes }}").render(n=8192) == "8.0 KiB"


def test_record_rows_escape_keys_values_and_mark_statuses() -> None:
    rows = record_rows(
        [
            {"offset": 3, "timestamp": T, "key": "<k&>", "value": None, "producer_id": 7,
             "producer_epoch": 1, "status": "marker COMMIT"},
            {"offset": 4, "timestamp": T + 1, "key": None, "value": "v\"'", "producer_id": -1,
             "producer_epoch": -1, "status": ""},
        ]
    )  # fmt: skip
    assert rows.count("<tr ") == 2
    assert '<tr class="marker" data-offset="3"><td>3</td>' in rows
    assert '<td class="time">2026-11-28 05:12:03.771Z</td>' in rows
    assert "<td>&lt;k&amp;&gt;</td><td></td><td>7/1</td>" in rows
    assert '<td class="status">marker COMMIT</td>' in rows
    assert "<td>v&#34;&#39;</td><td>-1/-1</td>" in rows and '<tr class="" data-offset="4">' in rows
    html = environment().get_template("topic.html").render(
        d={"topic": "t", "config": {}, "partitions": [], "partition": 0, "isolation":
           "read_uncommitted", "from_offset": 3, "next_offset": 5, "high_watermark": 5,
           "last_stable_offset": 5, "limit": 2, "log_bytes": None, "estimated_bytes": 0, "log_start_offset": 0,
           "records": [{"offset": 3, "timestamp": T, "key": "<k&>", "value": None,
                        "producer_id": 7, "producer_epoch": 1, "status": "aborted"}]},
        user="admin",
    )  # fmt: skip
    assert "<td>&lt;k&amp;&gt;</td>" in html and "&amp;lt;" not in html  # escaped once


def test_an_age_in_its_two_largest_units() -> None:
    assert human_age(812) == "812 ms"
    assert human_age(192_000) == "3 min 12 s"
    assert human_age(2 * 3600_000 + 5 * 60_000 + 7_000) == "2 h 5 min"
    assert human_age(86400_000 + 1000) == "1 d 0 h"
    assert human_age(None) == ""


def test_a_members_assignment_native_or_classic() -> None:
    assert assigned([["t", 1], ["t", 0]], None) == [("t", 0), ("t", 1)]
    # A classic consumer's ConsumerProtocolAssignment v1: version, [topic, [partitions]],
    # user data (null); a later version's fields at the end are not read.
    topic = b"orders"
    body = (
        struct.pack(">hi", 1, 1) + struct.pack(">h", len(topic)) + topic
        + struct.pack(">iii", 2, 3, 0) + struct.pack(">i", -1)
    )  # fmt: skip
    assert assigned([], body) == [("orders", 0), ("orders", 3)]
    assert assigned([], b"\x00") == [] and assigned([], None) == []
