"""What the CLI's listings show a person reading them: a topic's configs with their defaults
and sources (as DescribeConfigs answers), times as ISO-8601."""

from __future__ import annotations

import json
import re
from datetime import datetime

from app.admin import AdminClient, ConfigResource
from tests.test_cli_admin import fails, ok, ok_json, table


def test_topics_describe_configs_lists_every_config_with_its_source(db_url: str) -> None:
    ok("topics", "create", "t", "-c", "cleanup.policy=compact")
    listed = ok_json("topics", "describe", "t", "--configs")
    by_name = {e["name"]: e for e in listed}
    assert by_name["cleanup.policy"] == {
        "name": "cleanup.policy",
        "value": "compact",
        "is_default": False,
        "source": "DYNAMIC_TOPIC_CONFIG",
    }
    assert by_name["retention.ms"]["is_default"] is True
    assert by_name["retention.ms"]["source"] == "DEFAULT_CONFIG"
    # Exactly what the broker's DescribeConfigs answers, every config of it.
    resource = ConfigResource("topic", "t")
    with AdminClient({"database.url": db_url}) as admin:
        entries = admin.describe_configs([resource])[resource].result()
    assert sorted(by_name) == sorted(entries) and len(listed) > 5
    assert all(by_name[n]["value"] == e.value for n, e in entries.items())

    header, rows = table(ok("topics", "describe", "t", "--configs"))
    assert header == ["NAME", "VALUE", "DEFAULT", "SOURCE"]
    assert ["cleanup.policy", "compact", "False", "DYNAMIC_TOPIC_CONFIG"] in rows
    assert len(rows) == len(listed)
    fails("topics", "describe", "nope", "--configs", expect="UNKNOWN_TOPIC_OR_PARTITION")


def test_users_list_shows_iso_times(db_url: str) -> None:
    ok("users", "add", "alice", "--password", "pw")
    header, rows = table(ok("users", "list"))
    assert header == ["NAME", "MECHANISM", "CREATED"]
    [[name, mechanism, created]] = rows
    assert (name, mechanism) == ("alice", "PLAIN")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", created), created
    [as_json] = json.loads(ok("users", "list", "-o", "json"))
    parsed = datetime.fromisoformat(as_json["created"].replace("Z", "+00:00"))
    assert int(parsed.timestamp() * 1000) == as_json["created_ms"]
    assert as_json["created"] == created
