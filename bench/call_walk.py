"""The walk of an append's calls through ledgerflow's modules: how often the path returns to a module it
had left. Run by hand (it is not a test, and not a timing):

    python -m bench.call_walk [--url postgresql://postgres@127.0.0.1:5432/postgres] [--show]

In a fresh database it appends once to warm the store (pinned connection, statements, partitions), then
records the product functions entered (calls and generator resumptions, through `sys.setprofile`) during
each of these appends: one event to one stream (`append`), three events to one stream, and two streams in
one `append_many`. Then a node's end, as a worker records it (`Lifecycle.succeeded`, with the worker's
claimant so that it hands itself the next node): the first node of a three-node run (its successor claimed
in the same statement) and the last (the run's end). Consecutive calls in one module are one *stay*; a
*return* is a stay in a module the path had already left. Third-party code (psycopg, pydantic) is not
counted; its callbacks into ledgerflow are.
"""

from __future__ import annotations

import argparse
import functools
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from psycopg import sql

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eventstore import DatabaseSettings, EventStore, NewEvent, StreamAppend, open_store
from workflows import Engine, NodeContext, Workflow, WorkflowRegistry, WorkflowWorker

_walked = Workflow("walked")


@_walked.node()
def first(ctx: NodeContext) -> str:
    return "a"


@_walked.node(depends_on=["first"])
def second(ctx: NodeContext) -> str:
    return "b"


@_walked.node(depends_on=["second"])
def third(ctx: NodeContext) -> str:
    return "c"


ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eventstore", "projector", "workflows", "ops")


def _module(frame: FrameType) -> str | None:
    path = Path(frame.f_code.co_filename)
    try:
        rel = path.relative_to(ROOT)
    except ValueError:
        return None
    if rel.parts[0] not in PACKAGES:
        return None
    return ".".join(rel.with_suffix("").parts)


def walk(action: Callable[[], Any]) -> list[str]:
    """The modules of the product functions entered while `action` runs, in order."""
    return walk_returning(action)[0]


def walk_returning(action: Callable[[], Any]) -> tuple[list[str], Any]:
    """`walk`'s list, and what `action` returned."""
    entered: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            module = _module(frame)
            if module is not None:
                entered.append(f"{module}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        returned = action()
    finally:
        sys.setprofile(None)
    return entered, returned


def stays(entered: list[str]) -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for call in entered:
        module, name = call.split(":")
        if out and out[-1][0] == module:
            out[-1][1].append(name)
        else:
            out.append((module, [name]))
    return out


def returns(path: list[tuple[str, list[str]]]) -> int:
    seen: set[str] = set()
    count = 0
    for module, _ in path:
        if module in seen:
            count += 1
        seen.add(module)
    return count


def report(title: str, entered: list[str], show: bool) -> None:
    path = stays(entered)
    per_module: dict[str, int] = {}
    for module, _ in path:
        per_module[module] = per_module.get(module, 0) + 1
    top = max(per_module.items(), key=lambda kv: kv[1])
    print(
        f"{title}: {len(entered)} calls, {len(path)} stays, {returns(path)} returns, "
        f"{len(per_module)} modules; most entered: {top[0]} {top[1]} times"
    )
    if show:
        for module, names in path:
            print(f"    {module}: {', '.join(names)}")


def walk_node_ends(store: EventStore, show: bool) -> None:
    """A node's end in the middle of a run and at its end, after one whole run to warm the statements. The
    worker's loop does not run: its claim and its claimant (what a node's end hands the next node to) are
    used as the loop uses them."""
    registry = WorkflowRegistry()
    registry.register(_walked)
    engine = Engine(store, registry)
    worker = WorkflowWorker(engine, registry, name="walker")
    titles = {"first": "node end, successor claimed", "third": "node end, the run's end"}
    for round_ in ("warm", "walk"):
        run = engine.start("walked")
        claim: Any = worker._claim(limit=1)[0]
        state = engine.load(run.run_id)
        for node, output in (("first", "a"), ("second", "b"), ("third", "c")):
            assert claim is not None, node
            assert claim.node == node, claim
            end = functools.partial(
                worker.lifecycle.succeeded,
                claim,
                _walked,
                output,
                0.001,
                run=state,
                claim_next=worker._claimant,
            )
            if round_ == "walk" and node in titles:
                entered, claim = walk_returning(end)
                report(titles[node], entered, show)
            else:
                claim = end()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--show", action="store_true", help="print every stay and its functions")
    args = parser.parse_args()
    name = f"lf_walk_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = args.url.rsplit("/", 1)[0] + "/" + name
    try:
        settings = DatabaseSettings(pool_min_size=1, pool_max_size=2)
        store: EventStore
        with open_store(settings, url=url) as store:
            store.append("walk-0", [NewEvent("Warmed", {"i": 0})])
            store.append("walk-0", [NewEvent("Warmed", {"i": i}) for i in range(3)])
            store.append_many(
                [
                    StreamAppend("walk-a", [NewEvent("Warmed", {})]),
                    StreamAppend("walk-b", [NewEvent("W", {})]),
                ]
            )
            report(
                "append, one event",
                walk(lambda: store.append("walk-1", [NewEvent("Walked", {"i": 1})])),
                args.show,
            )
            report(
                "append, three events",
                walk(lambda: store.append("walk-1", [NewEvent("Walked", {"i": i}) for i in range(3)])),
                args.show,
            )
            report(
                "append_many, two streams",
                walk(
                    lambda: store.append_many(
                        [
                            StreamAppend("walk-2", [NewEvent("Walked", {})]),
                            StreamAppend("walk-3", [NewEvent("Walked", {})]),
                        ]
                    )
                ),
                args.show,
            )
            walk_node_ends(store, args.show)
    finally:
        with psycopg.connect(args.url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


if __name__ == "__main__":
    main()
