"""A home made before the layout was named ``replica_set.json`` keeps working: its
``cluster.json`` is read, and the next save moves it to the new name."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from app.storage.replica_set import FORMER_LAYOUT, LAYOUT, EmbeddedReplicaSet, Layout


def test_a_former_layout_is_read_then_moved_at_the_next_save(tmp_path: Path) -> None:
    former = Layout(
        standbys=2,
        min_insync=1,
        primary="node1",
        nodes=["node0", "node1", "node2"],
        ports={"node0": 5440, "node1": 5441, "node2": 5442},
        rejoin=["node0"],
    )
    (tmp_path / FORMER_LAYOUT).write_text(json.dumps(asdict(former)))
    replica_set = EmbeddedReplicaSet(tmp_path)
    assert replica_set.layout() == former
    assert replica_set.primary().port_hint == 5441

    changed = replica_set.layout()
    changed.rejoin = []
    replica_set._save(changed)
    assert not (tmp_path / FORMER_LAYOUT).exists()
    assert json.loads((tmp_path / LAYOUT).read_text()) == asdict(changed)
    assert replica_set.layout() == changed


def test_the_new_layout_wins_over_a_former_one_left_behind(tmp_path: Path) -> None:
    (tmp_path / FORMER_LAYOUT).write_text(json.dumps(asdict(Layout(primary="node0"))))
    (tmp_path / LAYOUT).write_text(json.dumps(asdict(Layout(primary="node2"))))
    assert EmbeddedReplicaSet(tmp_path).layout().primary == "node2"


def test_a_home_without_a_layout_is_one_primary(tmp_path: Path) -> None:
    assert EmbeddedReplicaSet(tmp_path).layout() == Layout()
