"""The sample pipelines: a six-node ontology extraction over a database schema, and its review.

Deterministic nodes (entity and relationship discovery) alternate with simulated slow LLM nodes that
work item by item. Every LLM call is a memoized step and every item's result is checkpointed with it,
so a worker killed mid-node costs at most the item in flight: the run resumes at the next item.

The review is started by the log: every `OntologyExtracted` event in an `ontology-…` stream starts one
run, which drafts a review and then waits, holding no worker, for a person's approval (signal `approve`).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from workflows.context import NodeContext
from workflows.definition import Workflow
from workflows.node_spec import RetryPolicy
from workflows.run_sources import Trigger
from workflows.workflow_registry import WorkflowRegistry

extraction = Workflow("ontology_extraction", version="1")
registry = WorkflowRegistry()

#: Seconds one simulated LLM call takes (`ledgerflow demo --llm-delay` passes it to its worker).
LLM_DELAY = float(os.environ.get("LEDGERFLOW_DEMO_LLM_DELAY", "0.15"))
_LLM_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.2, max_backoff=2.0)


def sample_schema(tables: int = 38) -> dict[str, Any]:
    """A made-up warehouse schema: `tables` tables, each with an id, a few columns and foreign keys."""
    rng = random.Random(42)
    names = [
        f"{kind}_{i}"
        for i, kind in zip(
            range(tables),
            ["orders", "customers", "products", "invoices", "shipments", "payments", "returns"] * 10,
            strict=False,
        )
    ]
    schema = []
    for i, name in enumerate(names):
        columns = ["id", "created_at", *[f"attr_{j}" for j in range(rng.randint(2, 6))]]
        fks = [names[j] for j in rng.sample(range(i), k=min(i, rng.randint(0, 2)))] if i else []
        schema.append({"table": name, "columns": columns, "references": fks})
    return {"tables": schema}


def fake_llm(prompt: str) -> str:
    """A slow, paid call: the demo counts on it being made once per prompt."""
    time.sleep(LLM_DELAY)
    return f"summary of {prompt.split(':', 1)[-1].strip()}"


@extraction.node()
def entity_discovery(ctx: NodeContext) -> Any:
    tables = ctx.input["tables"]
    ctx.progress(0, len(tables), "reading primary keys")
    entities = [t["table"] for t in tables if "id" in t["columns"]]
    ctx.progress(len(tables), len(tables), f"found {len(entities)} entities")
    return {"entities": entities}


@extraction.node(depends_on=["entity_discovery"], retry=_LLM_RETRY, progress_deadline=60)
def entity_enrichment(ctx: NodeContext) -> Any:
    entities = ctx.outputs["entity_discovery"]["entities"][:12]
    described = ctx.map(
        entities,
        lambda e: ctx.step(f"llm:{e}", lambda: fake_llm(f"describe entity: {e}")),
        message=lambda e: f"describing {e}",
    )
    return {"descriptions": dict(zip(entities, described, strict=True))}


@extraction.node(depends_on=["entity_enrichment"])
def relationship_discovery(ctx: NodeContext) -> Any:
    tables = ctx.input["tables"]
    relationships = [f"{t['table']}->{ref}" for t in tables for ref in t["references"]]
    ctx.progress(len(tables), len(tables), f"found {len(relationships)} foreign keys")
    return {"relationships": relationships}


@extraction.node(depends_on=["relationship_discovery"], retry=_LLM_RETRY, progress_deadline=60)
def relationship_enrichment(ctx: NodeContext) -> Any:
    relationships = ctx.outputs["relationship_discovery"]["relationships"][:15]
    described = ctx.map(
        relationships,
        lambda r: ctx.step(f"llm:{r}", lambda: fake_llm(f"relationship: {r}")),
        message=lambda r: f"describing {r}",
    )
    return {"count": len(described)}


@extraction.node(depends_on=["relationship_enrichment"], retry=_LLM_RETRY)
def ontology_finalization(ctx: NodeContext) -> Any:
    ctx.progress(0, 1, "summarising the domain")
    summary = ctx.step("llm:domain", lambda: fake_llm("domain summary: the whole schema"))
    ctx.progress(1, 1, "domain summary written")
    return {"summary": summary}


@extraction.node(depends_on=["ontology_finalization"], retry=_LLM_RETRY, progress_deadline=60)
def column_enrichment(ctx: NodeContext) -> Any:
    tables = ctx.input["tables"]
    done = ctx.map(
        tables,
        lambda t: ctx.step(f"llm:{t['table']}", lambda: fake_llm(f"columns of: {t['table']}")),
        key=lambda t: t["table"],
        message=lambda t: f"enriching columns of {t['table']}",
    )
    return {"tables": len(done)}


registry.register(extraction)

#: The event that starts a review, in a stream of category `ontology`.
ONTOLOGY_EXTRACTED = "OntologyExtracted"
review = Workflow("ontology_review", triggers=[Trigger(event_type=ONTOLOGY_EXTRACTED, category="ontology")])


@review.node()
def draft_review(ctx: NodeContext) -> Any:
    extracted = ctx.input["data"]
    return ctx.step("llm:review", lambda: fake_llm(f"review of: {extracted['entities']} entities"))


@review.node(depends_on=["draft_review"])
def approval(ctx: NodeContext) -> Any:
    # Waits for a person, durably: the node holds no worker while it waits, and a day's wait survives
    # any number of restarts. A reviewer who never answers is told apart from a refusal.
    decision = ctx.wait_for_signal("approve", timeout=24 * 3600)
    if not isinstance(decision, dict):
        decision = {"approved": decision}
    return {
        "approved": bool(decision.get("approved")),
        "by": decision.get("by"),
        "draft": ctx.outputs["draft_review"],
    }


registry.register(review)
