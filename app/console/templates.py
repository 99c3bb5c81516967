"""The pages' Jinja2 templates (autoescaped), kept in the package as strings so the
console needs no data files installed beside it."""

from __future__ import annotations

from jinja2 import DictLoader, Environment, select_autoescape

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
<tr><th>Oldest open transaction</th><td>{{ d.oldest_open_transaction or "—" }}</td></tr>
<tr><th>Database</th><td>{{ d.database.role }}</td></tr></table>
<h2>kip98 serve nodes</h2><table id="nodes"><tr><th>node</th><th>host</th><th>pid</th><th>last heartbeat</th><th>lease expires</th></tr>
{% for n in d.nodes %}<tr><td>{{ n.node_id }}</td><td>{{ n.host }}</td><td>{{ n.pid }}</td><td>{{ n.last_heartbeat_at }}</td><td>{{ n.lease_expires_at }}</td></tr>{% endfor %}</table>
<h2>Coordinator leases</h2><table><tr><th>owner</th><th>partitions</th></tr>
{% for l in d.leases %}<tr><td>{{ l.owner }}</td><td>{{ l.leases }}</td></tr>{% endfor %}</table>
<h2>Standbys</h2><table><tr><th>name</th><th>address</th><th>state</th><th>replay lag (ms)</th></tr>
{% for s in d.database.standbys %}<tr><td>{{ s.application_name }}</td><td>{{ s.client_addr }}</td><td>{{ s.state }}</td><td>{{ s.replay_lag_ms }}</td></tr>{% endfor %}</table>
<h2>Rates</h2><div id="charts">{% for c in charts %}<figure style="display:inline-block;margin:0 1em 0 0">
<figcaption>{{ c.title }}: <b>{{ c.last }}</b></figcaption>{{ c.svg | safe }}</figure>{% endfor %}</div>
<h2>LSO lag of the busiest partitions</h2>{{ lag_chart | safe }}
{% endblock %}"""

_TOPICS = """{% extends "base.html" %}{% block title %}Topics{% endblock %}{% block main %}
<h1>Topics</h1><table id="topics"><tr><th>topic</th><th>partitions</th><th>records (sum of high watermarks)</th><th>open transactions</th></tr>
{% for t in d.topics %}<tr><td><a href="/topics/{{ t.topic | urlencode }}">{{ t.topic }}</a></td><td>{{ t.partitions }}</td><td>{{ t.high_watermark }}</td><td>{{ t.open_transactions }}</td></tr>{% endfor %}
</table>{% endblock %}"""

_TOPIC = """{% extends "base.html" %}{% block title %}{{ d.topic }}{% endblock %}{% block main %}
<h1>Topic {{ d.topic }}</h1>
<table id="partitions"><tr><th>partition</th><th>log start</th><th>high watermark</th><th>LSO</th><th>open transactions</th></tr>
{% for p in d.partitions %}<tr><td><a href="?partition={{ p.partition }}&isolation={{ d.isolation }}">{{ p.partition }}</a></td><td>{{ p.log_start_offset }}</td><td>{{ p.high_watermark }}</td><td>{{ p.last_stable_offset }}</td><td>{{ p.open_transactions }}</td></tr>{% endfor %}</table>
<p>Configs: {% for k, v in d.config.items() %}<code>{{ k }}={{ v }}</code> {% else %}<span class="muted">defaults</span>{% endfor %}</p>
<h2>Partition {{ d.partition }}, offsets {{ d.from_offset }} to {{ d.next_offset }}</h2>
<form method="get" id="browse"><input type="hidden" name="partition" value="{{ d.partition }}">
<label>Isolation <select name="isolation" id="isolation">
{% for i in ["read_committed", "read_uncommitted"] %}<option {% if i == d.isolation %}selected{% endif %}>{{ i }}</option>{% endfor %}</select></label>
<label>Offset <input name="offset" size="10"></label> <label>or time (ms) <input name="timestamp" size="14"></label>
<label>Limit <input name="limit" size="5" value="{{ d.limit }}"></label> <button>Show</button></form>
<table id="records"><tr><th>offset</th><th>timestamp</th><th>key</th><th>value</th><th>producer</th><th>status</th></tr>
{% for r in d.records %}<tr class="{{ r["status"].split(" ")[0] }}" data-offset="{{ r["offset"] }}"><td>{{ r["offset"] }}</td><td>{{ r["timestamp"] }}</td><td>{{ r["key"] or "" }}</td><td>{{ r["value"] or "" }}</td><td>{{ r["producer_id"] }}/{{ r["producer_epoch"] }}</td><td class="status">{{ r["status"] }}</td></tr>{% endfor %}</table>
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
{% for h in d.hanging %}<tr><td>{{ h.topic }}-{{ h.partition }}</td><td>{{ h.producer_id }}/{{ h.producer_epoch }}</td><td>{{ h.start_offset }}</td><td>{{ h.started_at }}</td>
<td>{% if actions and h.topic in may_abort %}"""
    + _ABORT_FORM
    + """{% endif %}</td></tr>{% else %}<tr><td colspan="5" class="muted">none</td></tr>{% endfor %}</table>
{% endblock %}"""
)

_TRANSACTION = """{% extends "base.html" %}{% block title %}{{ d.transactional_id }}{% endblock %}{% block main %}
<h1>Transaction {{ d.transactional_id }}</h1><p>State: <b id="state">{{ d.state }}</b></p>
<h2>Timeline</h2>
<table id="events"><tr><th>event</th><th>state</th><th>producer</th><th>partitions added</th><th>updated</th><th>reason</th></tr>
{% for e in d.events %}<tr><td>{{ e.event_id }}</td><td class="state">{{ e.state }}</td><td>{{ e.producer_id }}/{{ e.producer_epoch }}</td><td>{% for p in e.added_partitions %}{{ p[0] }}-{{ p[1] }} {% endfor %}</td><td>{{ e.updated_ms }}</td><td>{{ e.reason or "" }}</td></tr>{% endfor %}</table>
<h2>Markers written</h2><table id="markers"><tr><th>partition</th><th>offset</th><th>marker</th><th>epoch</th><th>time</th></tr>
{% for m in d.markers %}<tr><td>{{ m.topic }}-{{ m.partition }}</td><td>{{ m.offset }}</td><td>{{ m.control_type }}</td><td>{{ m.producer_epoch }}</td><td>{{ m.timestamp }}</td></tr>{% endfor %}</table>
{% endblock %}"""

_PRODUCERS = """{% extends "base.html" %}{% block title %}Producers{% endblock %}{% block main %}
<h1>Producers</h1><table id="producers"><tr><th>partition</th><th>producer id</th><th>epoch</th><th>last sequence</th><th>coordinator epoch</th><th>open transaction at</th></tr>
{% for p in d.producers %}<tr><td>{{ p.topic }}-{{ p.partition }}</td><td>{{ p.producer_id }}</td><td>{{ p.producer_epoch }}</td><td>{{ p.last_sequence }}</td><td>{{ p.coordinator_epoch }}</td><td>{{ p.current_txn_start_offset if p.current_txn_start_offset is not none else "" }}</td></tr>{% endfor %}</table>
{% endblock %}"""

_GROUPS = """{% extends "base.html" %}{% block title %}Groups{% endblock %}{% block main %}
<h1>Consumer groups</h1><table id="groups"><tr><th>group</th><th>state</th><th>generation</th><th>protocol</th></tr>
{% for g in d.groups %}<tr><td><a href="/groups/{{ g.group_id | urlencode }}">{{ g.group_id }}</a></td><td>{{ g.state }}</td><td>{{ g.generation_id }}</td><td>{{ g.protocol or "" }}</td></tr>{% endfor %}</table>
{% endblock %}"""

_GROUP = """{% extends "base.html" %}{% block title %}{{ d.group.group_id }}{% endblock %}{% block main %}
<h1>Group {{ d.group.group_id }}</h1><p>State {{ d.group.state }}, generation {{ d.group.generation_id }}</p>
<h2>Members</h2><table id="members"><tr><th>member</th><th>instance</th><th>client</th><th>host</th></tr>
{% for m in d.members %}<tr><td>{{ m.member_id }}</td><td>{{ m.group_instance_id or "" }}</td><td>{{ m.client_id }}</td><td>{{ m.client_host }}</td></tr>{% endfor %}</table>
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
    return Environment(loader=DictLoader(TEMPLATES), autoescape=select_autoescape(default=True))


def bar_chart(values: list[tuple[str, int]], width: int = 400) -> str:
    """An inline SVG bar chart (server-side: no script, no asset to fetch)."""
    from markupsafe import escape

    if not values:
        return '<p class="muted">no partitions</p>'
    top = max(v for _, v in values) or 1
    rows = []
    for i, (label, v) in enumerate(values):
        w = int((width - 160) * v / top)
        y = i * 22
        rows.append(
            f'<text x="0" y="{y + 15}" font-size="12">{escape(label)}</text>'
            f'<rect x="150" y="{y + 3}" width="{w}" height="16" fill="#4a7bb0"></rect>'
            f'<text x="{155 + w}" y="{y + 15}" font-size="12">{v}</text>'
        )
    return (
        f'<svg id="lso-lag" width="{width}" height="{len(values) * 22}" role="img">'
        + "".join(rows)
        + "</svg>"
    )


def sparkline(
    chart_id: str, points: list[tuple[int, float]], width: int = 240, height: int = 48
) -> str:
    """An inline SVG line over ``points`` (server-side: no script, no asset to fetch)."""
    if len(points) < 2:
        return (
            f'<svg id="{chart_id}" class="chart" width="{width}" height="{height}" role="img">'
            f'<text x="4" y="{height // 2}" font-size="12" fill="#777">collecting</text></svg>'
        )
    t0, t1 = points[0][0], points[-1][0]
    top = max(v for _, v in points) or 1.0
    xy = " ".join(
        f"{(t - t0) * (width - 4) / max(t1 - t0, 1) + 2:.1f},{height - 2 - v * (height - 4) / top:.1f}"
        for t, v in points
    )
    return (
        f'<svg id="{chart_id}" class="chart" width="{width}" height="{height}" role="img">'
        f'<rect width="{width}" height="{height}" fill="#f4f7fa"></rect>'
        f'<polyline fill="none" stroke="#4a7bb0" stroke-width="1.5" points="{xy}"></polyline></svg>'
    )
