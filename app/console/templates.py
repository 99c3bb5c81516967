"""The pages' Jinja2 templates (autoescaped), kept in the package as strings so the
console needs no data files installed beside it."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from jinja2 import DictLoader, Environment, select_autoescape
from markupsafe import Markup, escape

_BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kip98 · {% block title %}{% endblock %}</title>
<style>
body{font-family:system-ui,sans-serif;margin:0;color:#222}
nav{background:#1f3b57;padding:.5em 1em}nav a{color:#fff;margin-right:1em;text-decoration:none}
main{padding:1em}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:.2em .5em;font-size:14px;text-align:left}
.aborted{background:#fdd}.open{background:#ffd}.marker{background:#ddf;font-style:italic}
.error{color:#a00}.muted{color:#777}form.inline{display:inline}
</style></head><body>
<nav>{% if user %}<a href="/">Overview</a><a href="/topics">Topics</a>
<a href="/transactions">Transactions</a><a href="/producers">Producers</a>
<a href="/groups">Groups</a>
<span style="color:#ccc">{{ user }}{% if read_only %} (read-only){% endif %}</span>
<form class="inline" method="post" action="/logout"><input type="hidden" name="csrf_token" value="{{ csrf_token }}">
<button>Log out</button></form>{% endif %}</nav>
<main>{% block main %}{% endblock %}</main></body></html>"""

_LOGIN = """{% extends "base.html" %}{% block title %}Log in{% endblock %}{% block main %}
<h1>Log in</h1>{% if error %}<p class="error" id="error">{{ error }}</p>{% endif %}
<form method="post" action="/login"><input type="hidden" name="next" value="{{ next }}">
<p><label>User <input name="username" autocomplete="username"></label></p>
<p><label>Password <input name="password" type="password" autocomplete="current-password"></label></p>
<button type="submit">Log in</button></form>{% endblock %}"""

_ERROR = """{% extends "base.html" %}{% block title %}Error{% endblock %}{% block main %}
<h1>Error {{ code }}</h1><p class="error" id="error">{{ message }}</p>{% endblock %}"""

_OVERVIEW = """{% extends "base.html" %}{% block title %}Overview{% endblock %}{% block main %}
<h1>Overview</h1>
<table id="counts"><tr><th>Topics</th><td>{{ d.topics }}</td></tr>
<tr><th>Partitions</th><td>{{ d.partitions }}</td></tr><tr><th>Groups</th><td>{{ d.groups }}</td></tr>
<tr><th>Open transactions</th><td id="open-transactions">{{ d.open_transactions }}</td></tr>
<tr><th>Oldest open transaction</th><td id="oldest-open">{% if d.oldest_open_transaction %}<span title="begun {{ d.oldest_open_transaction | iso }}">open for {{ d.oldest_open_transaction_age_ms | age }}</span>{% else %}—{% endif %}</td></tr>
<tr><th>Database</th><td>{{ d.database.role }}</td></tr></table>
<h2>kip98 serve nodes</h2><table id="nodes"><tr><th>node</th><th>host</th><th>pid</th><th>last heartbeat</th><th>lease expires</th></tr>
{% for n in d.nodes %}<tr><td>{{ n.node_id }}</td><td>{{ n.host }}</td><td>{{ n.pid }}</td><td>{{ n.last_heartbeat_at | iso }}</td><td>{{ n.lease_expires_at | iso }}</td></tr>{% endfor %}</table>
<h2>Coordinator leases</h2><table><tr><th>owner</th><th>partitions</th></tr>
{% for l in d.leases %}<tr><td>{{ l.owner }}</td><td>{{ l.leases }}</td></tr>{% endfor %}</table>
<h2>Standbys</h2><table><tr><th>name</th><th>address</th><th>state</th><th>replay lag (ms)</th></tr>
{% for s in d.database.standbys %}<tr><td>{{ s.application_name }}</td><td>{{ s.client_addr }}</td><td>{{ s.state }}</td><td>{{ s.replay_lag_ms }}</td></tr>{% endfor %}</table>
<h2>The last {{ (d.series.window_ms or 0) // 60000 }} minutes</h2>
<p class="muted">Read from the tables when the page is asked for: commits from the coordinator's events, records from their timestamps (probed by offset, so the rate is interpolated between probes), the LSO lag of the partitions that took the most records.</p>
<div id="charts">{% for c in charts %}<figure class="chart" id="{{ c.id }}" style="display:inline-block;margin:0 1em 0 0">
<figcaption>{{ c.title }}: <b>{{ c.last }}</b></figcaption>{{ c.svg }}</figure>{% endfor %}</div>
<h2>LSO lag of the busiest partitions</h2><figure class="chart" id="lso-lag" style="margin:0">{{ lag_chart }}</figure>
{% endblock %}"""

_TOPICS = """{% extends "base.html" %}{% block title %}Topics{% endblock %}{% block main %}
<h1>Topics</h1>{% if d.log_bytes is not none %}<p id="log-size">The log on disk, all topics together: <b>{{ d.log_bytes | bytes }}</b></p>{% endif %}
<table id="topics"><tr><th>topic</th><th>partitions</th><th>records (sum of high watermarks)</th><th>open transactions</th><th title="{{ estimate_note }}">size (estimate)</th></tr>
{% for t in d.topics %}<tr><td><a href="/topics/{{ t.topic | urlencode }}">{{ t.topic }}</a></td><td>{{ t.partitions }}</td><td>{{ t.high_watermark }}</td><td>{{ t.open_transactions }}</td><td class="size" title="{{ estimate_note }}">≈ {{ t.estimated_bytes | bytes }}</td></tr>{% endfor %}
</table><p class="muted">Sizes are estimates: {{ estimate_note }}</p>{% endblock %}"""

_TOPIC = """{% extends "base.html" %}{% block title %}{{ d.topic }}{% endblock %}{% block main %}
<h1>Topic {{ d.topic }}</h1>{% if message %}<p id="message">{{ message }}</p>{% endif %}
<table id="partitions"><tr><th>partition</th><th>log start</th><th>high watermark</th><th>LSO</th><th>open transactions</th><th title="{{ estimate_note }}">size (estimate)</th>{% if may_delete %}<th></th>{% endif %}</tr>
{% for p in d.partitions %}<tr><td><a href="?partition={{ p.partition }}&isolation={{ d.isolation }}">{{ p.partition }}</a></td><td>{{ p.log_start_offset }}</td><td>{{ p.high_watermark }}</td><td>{{ p.last_stable_offset }}</td><td>{{ p.open_transactions }}</td><td class="size" title="{{ estimate_note }}">≈ {{ p.estimated_bytes | bytes }}</td>{% if may_delete %}<td><form class="inline delete-records" method="post" action="/topics/delete-records"
onsubmit="return confirm('Delete the records of {{ d.topic }}-{{ p.partition }} before offset ' + this.before_offset.value + '?')">
<input type="hidden" name="csrf_token" value="{{ csrf_token }}"><input type="hidden" name="topic" value="{{ d.topic }}">
<input type="hidden" name="partition" value="{{ p.partition }}"><input name="before_offset" size="8" placeholder="offset">
<button>Delete records before</button></form></td>{% endif %}</tr>{% endfor %}</table>
<p id="topic-size">The topic: <b>≈ {{ d.estimated_bytes | bytes }}</b> <span class="muted">(an estimate: {{ estimate_note }})</span>{% if d.log_bytes is not none %}; <span id="log-size">the log on disk, all topics together: <b>{{ d.log_bytes | bytes }}</b></span>{% endif %}</p>
<p>Configs: {% for k, v in d.config.items() %}<code>{{ k }}={{ v }}</code> {% else %}<span class="muted">defaults</span>{% endfor %}</p>
<h2>Partition {{ d.partition }}, offsets {{ d.from_offset }} to {{ d.next_offset }}</h2>
<form method="get" id="browse"><input type="hidden" name="partition" value="{{ d.partition }}">
<label>Isolation <select name="isolation" id="isolation">
{% for i in ["read_committed", "read_uncommitted"] %}<option {% if i == d.isolation %}selected{% endif %}>{{ i }}</option>{% endfor %}</select></label>
<label>Offset <input name="offset" size="10"></label> <label>or time <input name="timestamp" size="24" placeholder="2026-11-28 05:12:03Z or ms"></label>
<label>Limit <input name="limit" size="5" value="{{ d.limit }}"></label> <button>Show</button></form>
<table id="records"><tr><th>offset</th><th>timestamp</th><th>key</th><th>value</th><th>producer</th><th>status</th></tr>
{{ d.records | record_rows }}</table>
{% if d.from_offset > d.log_start_offset %}<a id="previous" href="?partition={{ d.partition }}&isolation={{ d.isolation }}&offset={{ [d.from_offset - d.limit, d.log_start_offset] | max }}&limit={{ d.limit }}">previous page</a> {% endif %}
{% if d.next_offset < (d.high_watermark if d.isolation == "read_uncommitted" else d.last_stable_offset) %}
<a id="next" href="?partition={{ d.partition }}&isolation={{ d.isolation }}&offset={{ d.next_offset }}&limit={{ d.limit }}">next page</a>{% endif %}
{% endblock %}"""

_ABORT_FORM = """<form class="inline" method="post" action="/transactions/abort"
onsubmit="return confirm('Abort the transaction at offset {{ h.start_offset }} of {{ h.topic }}-{{ h.partition }}?')">
<input type="hidden" name="csrf_token" value="{{ csrf_token }}"><input type="hidden" name="topic" value="{{ h.topic }}">
<input type="hidden" name="partition" value="{{ h.partition }}"><input type="hidden" name="start_offset" value="{{ h.start_offset }}">
<button class="abort">Abort</button></form>"""

_TRANSACTIONS = (
    """{% extends "base.html" %}{% block title %}Transactions{% endblock %}{% block main %}
<h1>Transactions</h1>{% if message %}<p id="message">{{ message }}</p>{% endif %}
<table id="transactions"><tr><th>transactional id</th><th>state</th><th>producer</th><th>partitions</th></tr>
{% for t in d.transactions %}<tr><td><a href="/transactions/{{ t.transactional_id | urlencode }}">{{ t.transactional_id }}</a></td><td class="state">{{ t.state }}</td><td>{{ t.producer_id }}/{{ t.producer_epoch }}</td><td>{% for p in t.partitions %}{{ p[0] }}-{{ p[1] }} {% endfor %}</td></tr>{% endfor %}</table>
<h2 id="find-hanging">Hanging transactions</h2>
<table id="hanging"><tr><th>partition</th><th>producer</th><th>start offset</th><th>started</th><th></th></tr>
{% for h in d.hanging %}<tr><td>{{ h.topic }}-{{ h.partition }}</td><td>{{ h.producer_id }}/{{ h.producer_epoch }}</td><td>{{ h.start_offset }}</td><td class="time">{{ h.started_at | iso }}</td>
<td>{% if actions and h.topic in may_abort %}"""
    + _ABORT_FORM
    + """{% endif %}</td></tr>{% else %}<tr><td colspan="5" class="muted">none</td></tr>{% endfor %}</table>
{% endblock %}"""
)

_TRANSACTION = """{% extends "base.html" %}{% block title %}{{ d.transactional_id }}{% endblock %}{% block main %}
<h1>Transaction {{ d.transactional_id }}</h1><p>State: <b id="state">{{ d.state }}</b></p>
<h2>Timeline</h2>
{{ timeline | safe }}
<table id="events"><tr><th>event</th><th>state</th><th>producer</th><th>partitions added</th><th>updated</th><th>reason</th></tr>
{% for e in d.events %}<tr><td>{{ e.event_id }}</td><td class="state">{{ e.state }}</td><td>{{ e.producer_id }}/{{ e.producer_epoch }}</td><td>{% for p in e.added_partitions %}{{ p[0] }}-{{ p[1] }} {% endfor %}</td><td class="time">{{ e.updated_ms | iso }}</td><td>{{ e.reason or "" }}</td></tr>{% endfor %}</table>
<h2>Producer epochs</h2><table id="epochs"><tr><th>event</th><th>change</th><th>producer</th><th>was</th><th>state</th><th>time</th><th>reason</th></tr>
{% for c in d.epochs %}<tr class="{{ c.kind | replace(" ", "-") }}"><td>{{ c.event_id }}</td><td class="kind">{{ c.kind }}</td><td>{{ c.producer_id }}/{{ c.producer_epoch }}</td><td>{% if c.previous %}{{ c.previous[0] }}/{{ c.previous[1] }}{% endif %}</td><td>{{ c.state }}</td><td class="time">{{ c.updated_ms | iso }}</td><td class="reason">{{ c.reason or "" }}</td></tr>{% endfor %}</table>
<h2>Markers written</h2><table id="markers"><tr><th>partition</th><th>offset</th><th>marker</th><th>epoch</th><th>time</th></tr>
{% for m in d.markers %}<tr><td>{{ m.topic }}-{{ m.partition }}</td><td>{{ m.offset }}</td><td>{{ m.control_type }}</td><td>{{ m.producer_epoch }}</td><td class="time">{{ m.timestamp | iso }}</td></tr>{% endfor %}</table>
{% endblock %}"""

_PRODUCERS = """{% extends "base.html" %}{% block title %}Producers{% endblock %}{% block main %}
<h1>Producers</h1><p class="muted">A transactional producer's epoch bumps and fences are on its transactional id's page.</p>
<table id="producers"><tr><th>partition</th><th>transactional id</th><th>producer id</th><th>epoch</th><th>last sequence</th><th>last timestamp</th><th>coordinator epoch</th><th>open transaction at</th></tr>
{% for p in d.producers %}<tr><td>{{ p.topic }}-{{ p.partition }}</td><td>{% if p.transactional_id %}<a href="/transactions/{{ p.transactional_id | urlencode }}">{{ p.transactional_id }}</a>{% endif %}</td><td>{{ p.producer_id }}</td><td>{{ p.producer_epoch }}</td><td>{{ p.last_sequence }}</td><td class="time">{{ p.last_timestamp | iso }}</td><td>{{ p.coordinator_epoch }}</td><td>{{ p.current_txn_start_offset if p.current_txn_start_offset is not none else "" }}</td></tr>{% endfor %}</table>
{% endblock %}"""

_GROUPS = """{% extends "base.html" %}{% block title %}Groups{% endblock %}{% block main %}
<h1>Consumer groups</h1><table id="groups"><tr><th>group</th><th>state</th><th>generation</th><th>protocol</th></tr>
{% for g in d.groups %}<tr><td><a href="/groups/{{ g.group_id | urlencode }}">{{ g.group_id }}</a></td><td>{{ g.state }}</td><td>{{ g.generation_id }}</td><td>{{ g.protocol or "" }}</td></tr>{% endfor %}</table>
{% endblock %}"""

_GROUP = """{% extends "base.html" %}{% block title %}{{ d.group.group_id }}{% endblock %}{% block main %}
<h1>Group {{ d.group.group_id }}</h1><p>State {{ d.group.state }}, generation {{ d.group.generation_id }}</p>
<h2>Members</h2><table id="members"><tr><th>member</th><th>instance</th><th>client</th><th>host</th><th>assignment</th></tr>
{% for m in d.members %}<tr><td>{{ m.member_id }}</td><td>{{ m.group_instance_id or "" }}</td><td>{{ m.client_id }}</td><td>{{ m.client_host }}</td><td class="assignment">{% for p in m.assignment %}{{ p[0] }}-{{ p[1] }} {% endfor %}</td></tr>{% endfor %}</table>
<h2>Committed offsets</h2><table id="offsets"><tr><th>partition</th><th>committed</th><th>LSO</th><th>high watermark</th><th>lag to LSO</th><th>lag</th></tr>
{% for o in d.offsets %}<tr><td>{{ o.topic }}-{{ o.partition }}</td><td>{{ o.committed_offset }}</td><td>{{ o.last_stable_offset }}</td><td>{{ o.high_watermark }}</td><td>{{ o.lag_to_lso }}</td><td>{{ o.lag }}</td></tr>{% endfor %}</table>
<h2>Pending transactional offsets</h2><ul>{% for p in d.pending_transactional_offsets %}<li>{{ p.topic }}-{{ p.partition }}</li>{% else %}<li class="muted">none</li>{% endfor %}</ul>
{% endblock %}"""

TEMPLATES = {
    "base.html": _BASE, "login.html": _LOGIN, "error.html": _ERROR, "overview.html": _OVERVIEW,
    "topics.html": _TOPICS, "topic.html": _TOPIC, "transactions.html": _TRANSACTIONS,
    "transaction.html": _TRANSACTION, "producers.html": _PRODUCERS, "groups.html": _GROUPS,
    "group.html": _GROUP,
}  # fmt: skip


def environment() -> Environment:
    env = Environment(loader=DictLoader(TEMPLATES), autoescape=select_autoescape(default=True))
    env.filters["iso"] = iso_ms
    env.filters["bytes"] = human_bytes
    env.filters["age"] = human_age
    env.globals["estimate_note"] = ESTIMATE_NOTE
    env.filters["record_rows"] = record_rows
    return env


def record_rows(records: list[dict[str, Any]]) -> Markup:
    """The record browser's rows (up to 1,000 a page), built here rather than in a Jinja
    loop: the loop autoescaped nine values a row, most of them integers, and was most of
    the page's time. Keys, values and statuses are escaped; the numbers are ints."""
    out = []
    for r in records:
        status = escape(r["status"])
        key, value = r["key"], r["value"]
        out.append(
            f'<tr class="{escape(r["status"].split(" ")[0])}" data-offset="{int(r["offset"])}">'
            f'<td>{int(r["offset"])}</td><td class="time">{iso_ms(r["timestamp"])}</td>'
            f"<td>{escape(key) if key else ''}</td><td>{escape(value) if value else ''}</td>"
            f"<td>{int(r['producer_id'])}/{int(r['producer_epoch'])}</td>"
            f'<td class="status">{status}</td></tr>'
        )
    return Markup("".join(out))


ESTIMATE_NOTE = (
    "the log's size on disk (PostgreSQL's pg_total_relation_size of its records table) "
    "shared out by the offsets each partition spans; kip98 keeps no byte count per topic "
    "or partition"
)


def human_age(ms: int | None) -> str:
    """A duration in its two largest units (``3 min 12 s``, ``2 h 5 min``, ``812 ms``)."""
    if ms is None:
        return ""
    if ms < 1000:
        return f"{int(ms)} ms"
    seconds = int(ms) // 1000
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")]
    while parts and parts[0][0] == 0:
        parts.pop(0)
    return " ".join(f"{n} {unit}" for n, unit in parts[:2])


def human_bytes(n: int) -> str:
    """A byte count in binary units, exact below 1 KiB (``1.5 MiB``, ``812 bytes``)."""
    if n < 1024:
        return f"{n} bytes"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:.1f} {unit}"


@lru_cache(maxsize=4096)
def _iso_second(seconds: int) -> str:
    """A second since the epoch, formatted once: a page of records shares few seconds."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def iso_ms(value: object) -> str:
    """A time as ISO-8601 UTC with milliseconds (``2026-11-28 05:12:03.771Z``): epoch
    milliseconds (the log's and the coordinator's times) or an ISO string or datetime (the
    SQL views' timestamps). Empty for none; anything else is shown as it is."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):  # whole milliseconds, free of float rounding
        ms = int(value)
        return f"{_iso_second(ms // 1000)}.{ms % 1000:03d}Z"
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(str(value))
        except ValueError:
            return str(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _outcome(state: str) -> str:
    return "commit" if "COMMIT" in state else "abort" if "ABORT" in state else "open"


_COLOURS = {"commit": "#3c9a4a", "abort": "#c8413b", "open": "#e0a526"}


def _rows_for(labels: list[tuple[float, str]], width: int) -> list[tuple[float, int]]:
    """Where each label goes: at its x (pulled left to fit), on the first row where it
    overlaps none before it, so crowded events stack rather than overprint."""
    ends: list[float] = []
    out = []
    for lx, text in labels:
        w = 7.0 * len(text) + 6  # about 11px sans-serif
        lx = max(0.0, min(lx, width - w))
        row = next((r for r, end in enumerate(ends) if end <= lx), len(ends))
        if row == len(ends):
            ends.append(0.0)
        ends[row] = lx + w
        out.append((lx, row))
    return out


def timeline_svg(
    events: list[dict[str, Any]], markers: list[dict[str, Any]], width: int = 900
) -> str:
    """A transaction's history drawn on one time axis (server-side: no script, no asset):
    a lane of its states, one segment per coordinator event until the next, coloured by
    the outcome of the transaction it belongs to (commit green, abort red, still open
    amber); and a lane per partition added, a bar from its addition to the marker that
    closed it, the marker a tick labelled with its type and offset. ``events`` and
    ``markers`` are the transaction page's (``data.transaction``), oldest first."""
    if not events:
        return '<p class="muted">no events</p>'
    times = [int(e["updated_ms"]) for e in events] + [int(m["timestamp"]) for m in markers]
    t0, t1 = min(times), max(times)
    left, right = 130, width - 60
    span = max(t1 - t0, 1)

    def x(t: int) -> float:
        return left + (t - t0) * (right - left) / span

    # Each event's outcome: that of the first PREPARE/COMPLETE at or after it, open if none.
    outcomes: list[str] = []
    pending = "open"
    for e in reversed(events):
        state = str(e["state"])
        if state.startswith(("PREPARE_", "COMPLETE_")):
            pending = _outcome(state)
        outcomes.append(pending)
        if state in ("EMPTY", "BEGIN"):
            pending = "open"
    outcomes.reverse()

    parts: list[str] = []
    axis_y = 24
    parts.append(
        f'<line x1="{left}" y1="{axis_y}" x2="{right}" y2="{axis_y}" stroke="#555"></line>'
    )
    axis = [t0 + span * i // 4 for i in range(5)] if t1 > t0 else [t0]
    shown_to = 0.0
    for i, t in enumerate(axis):
        tx = x(t)
        label = iso_ms(t) if i == 0 else iso_ms(t)[11:]
        lx = tx if i == 0 else min(tx - 3.25 * len(label), width - 6.5 * len(label))
        parts.append(
            f'<line x1="{tx:.1f}" y1="{axis_y - 4}" x2="{tx:.1f}" y2="{axis_y + 4}" '
            f'stroke="#555"></line>'
        )
        if lx >= shown_to:  # a label that would overprint the one before is left out
            parts.append(
                f'<text class="axis" x="{lx:.1f}" y="{axis_y - 8}" font-size="11">'
                f"{escape(label)}</text>"
            )
            shown_to = lx + 6.5 * len(label) + 8

    lane_y = 44
    parts.append(f'<text x="0" y="{lane_y + 14}" font-size="12">state</text>')
    labels = [(x(int(e["updated_ms"])), f"{e['state']} e{e['producer_epoch']}") for e in events]
    places = _rows_for(labels, width)
    for i, e in enumerate(events):
        start = int(e["updated_ms"])
        x0 = x(start)
        x1 = x(int(events[i + 1]["updated_ms"])) if i + 1 < len(events) else right + 40
        state = str(e["state"])
        label = labels[i][1]
        lx, row = places[i]
        ly = lane_y + 34 + 13 * row
        parts.append(
            f'<rect class="segment" data-state="{escape(state)}" '
            f'data-outcome="{outcomes[i]}" x="{x0:.1f}" y="{lane_y}" '
            f'width="{max(x1 - x0, 3.0):.1f}" height="20" fill="{_COLOURS[outcomes[i]]}" '
            f'stroke="#fff" stroke-width="0.5">'
            f"<title>{escape(label)} at {escape(iso_ms(start))}</title></rect>"
            f'<line x1="{x0:.1f}" y1="{lane_y + 20}" x2="{lx:.1f}" y2="{ly - 9}" '
            f'stroke="#bbb"></line>'
            f'<text class="label" x="{lx:.1f}" y="{ly}" font-size="11">{escape(label)}</text>'
        )
    # An epoch change over the state lane: a fence (an open transaction cut off) as a
    # tall black tick, any other bump as a short grey one.
    for e in events:
        kind = e.get("epoch_change")
        if kind not in ("fence", "epoch bump"):
            continue
        fx = x(int(e["updated_ms"]))
        fence = kind == "fence"
        parts.append(
            f'<line class="{"fence" if fence else "bump"}" data-event="{e["event_id"]}" '
            f'x1="{fx:.1f}" y1="{lane_y - (8 if fence else 2)}" x2="{fx:.1f}" '
            f'y2="{lane_y + (28 if fence else 22)}" stroke="{"#000" if fence else "#888"}" '
            f'stroke-width="{3 if fence else 1.5}"><title>{escape(kind)} to epoch '
            f"{e['producer_epoch']} at {escape(iso_ms(int(e['updated_ms'])))}"
            f"{': ' + escape(str(e['reason'])) if e.get('reason') else ''}</title></line>"
        )
    rows = max(row for _x, row in places) + 1

    added: dict[tuple[str, int], list[int]] = {}
    for e in events:
        for t, p in e.get("added_partitions") or []:
            added.setdefault((str(t), int(p)), []).append(int(e["updated_ms"]))
    y = lane_y + 34 + 13 * rows
    for (topic, partition), at in sorted(added.items()):
        name = f"{topic}-{partition}"
        ticks = [m for m in markers if (str(m["topic"]), int(m["partition"])) == (topic, partition)]
        parts.append(
            f'<g class="partition" data-partition="{escape(name)}">'
            f'<text x="0" y="{y + 14}" font-size="12">{escape(name)}</text>'
        )
        for a in at:
            closing = next((m for m in ticks if int(m["timestamp"]) >= a), None)
            end = x(int(closing["timestamp"])) if closing else right + 40
            colour = _COLOURS[_outcome(str(closing["control_type"])) if closing else "open"]
            parts.append(
                f'<rect class="added" x="{x(a):.1f}" y="{y + 6}" width="{max(end - x(a), 3):.1f}" '
                f'height="8" fill="{colour}" opacity="0.5"><title>added at '
                f"{escape(iso_ms(a))}</title></rect>"
            )
        tick_labels = [
            (x(int(m["timestamp"])), f"{m['control_type']} @{m['offset']}") for m in ticks
        ]
        tick_places = _rows_for(tick_labels, width)
        for m, (mx, label), (lx, row) in zip(ticks, tick_labels, tick_places, strict=True):
            kind = str(m["control_type"])
            colour = _COLOURS[_outcome(kind)]
            parts.append(
                f'<line class="marker" data-marker="{escape(kind)}" data-offset="{m["offset"]}" '
                f'x1="{mx:.1f}" y1="{y}" x2="{mx:.1f}" y2="{y + 20}" stroke="{colour}" '
                f'stroke-width="3"><title>{escape(kind)} at offset {m["offset"]}, '
                f"{escape(iso_ms(m['timestamp']))}</title></line>"
                f'<text class="label" x="{lx:.1f}" y="{y + 33 + 13 * row}" font-size="11">'
                f"{escape(label)}</text>"
            )
        parts.append("</g>")
        y += 40 + 13 * (max((r for _x, r in tick_places), default=0) + 1)
    return (
        f'<svg id="timeline" width="{width}" height="{y}" role="img" '
        f'aria-label="the transaction over time">' + "".join(parts) + "</svg>"
    )
