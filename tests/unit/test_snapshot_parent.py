"""A run's snapshot keeps its parent link: a child loaded from its snapshot still names its parent."""

from __future__ import annotations

import uuid

from workflows import event_models as em
from workflows.run_state import RunState
from workflows.snapshots import from_json, to_json


def test_a_snapshot_keeps_the_parent_link() -> None:
    parent = em.ParentLink(run_id=str(uuid.uuid4()), node="spawn", parent_close="terminate")
    child = RunState(uuid.uuid4(), "acme", workflow="tree", parent=parent)
    orphan = RunState(uuid.uuid4(), "acme", workflow="tree")
    restored = from_json(child.run_id, "acme", to_json(child))
    assert restored is not None
    assert (restored.parent, restored.parent_run_id) == (parent, uuid.UUID(parent.run_id))
    alone = from_json(orphan.run_id, "acme", to_json(orphan))
    assert alone is not None
    assert alone.parent is None
