"""The `certify` graph: certify catalog pairs in parallel branches.

`fan_out_pairs` sends one `PairTask` per requested pair (all of them when none
are named) to `pair_certifier`; `catalog_reviewer` then checks the split and
category rules over the whole catalog. Runs in LangGraph Studio through
`langgraph.json`, or programmatically through `certify_pairs` (which `hera envs certify` runs).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Callable

from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Send
from typing_extensions import NotRequired, TypedDict

from envs.catalog import CATALOG, catalog_problems, load_catalog, load_entry
from envs.certify import MAX_CALLS, certify
from envs.spec import SpecError
from graphs.inputs import AtLeastOne, Id, checked
from state.context import Context
from state.ledger import Ledger
from state.records import Certification, merge



class CertifyInput(TypedDict, total=False):
    pair_ids: list[Id]  # none: the whole catalog
    rescue_budget: AtLeastOne  # calls the rescue search may make per pair


class CertifyOutput(TypedDict):
    certifications: dict[str, Certification]
    problems: list[str]


class CertifyState(CertifyInput, CertifyOutput):
    certifications: Annotated[dict[str, Certification], merge]


class PairTask(TypedDict):
    pair_id: str
    rescue_budget: NotRequired[int]


def fan_out_pairs(state: CertifyState, runtime: Runtime[Context]) -> list[Send]:
    given = checked(CertifyInput, state, "certify")
    ids = given.get("pair_ids") or sorted(load_catalog(runtime.context.catalog))
    return [Send("pair_certifier", PairTask(pair_id=i, rescue_budget=given.get("rescue_budget", MAX_CALLS))) for i in ids]


async def pair_certifier(task: PairTask, runtime: Runtime[Context]) -> dict:
    """Certifies one pair; writes `certifications`."""

    def work() -> Certification:
        entry = load_entry(task["pair_id"], runtime.context.catalog)
        return certify(entry.pair, entry.env, task.get("rescue_budget", MAX_CALLS))

    cert = await asyncio.to_thread(work)
    return {"certifications": {cert.pair_id: cert}}


async def catalog_reviewer(state: CertifyState, runtime: Runtime[Context]) -> dict:
    """Records the certifications in the ledger and checks the catalog's public text and, for the built-in
    catalog, its split and category rules; writes `problems`."""

    def work() -> dict:
        ledger = Ledger(runtime.context.ledger)
        for cert in state["certifications"].values():
            ledger.record_certification(cert)
        root = Path(runtime.context.catalog)
        return load_catalog(root, errors=broken), root.resolve() == CATALOG.resolve()

    broken: list[SpecError] = []  # a pair or environment that does not load is a problem to report, not a crash
    entries, builtin = await asyncio.to_thread(work)
    failed = [f"{pid} failed certification" for pid, c in sorted(state["certifications"].items()) if not c.passed]
    return {"problems": failed + [str(e) for e in broken] + catalog_problems(entries, quotas=builtin)}


def build_certify() -> StateGraph:
    builder = StateGraph(CertifyState, context_schema=Context, input_schema=CertifyInput, output_schema=CertifyOutput)
    builder.add_node(pair_certifier)
    builder.add_node(catalog_reviewer)
    builder.add_conditional_edges(START, fan_out_pairs, ["pair_certifier"])
    builder.add_edge("pair_certifier", "catalog_reviewer")
    builder.add_edge("catalog_reviewer", END)
    return builder


builder = build_certify()
graph = builder.compile(name="certify")


async def certify_pairs(pair_ids: list[str], context: Context, *, rescue_budget: int = MAX_CALLS,
                        on_pair: Callable[[Certification], None] | None = None) -> CertifyOutput:
    """Certifies the pairs (every pair of the catalog when none is named) through this graph, in process and without
    checkpoints (certification is quick and recorded in the ledger); `on_pair` sees each certification as it comes."""
    final: CertifyOutput = {"certifications": {}, "problems": []}
    async for update in graph.astream({"pair_ids": pair_ids, "rescue_budget": rescue_budget}, context=context, stream_mode="updates"):
        for node, value in update.items():
            if node == "pair_certifier" and on_pair:
                for cert in value["certifications"].values():
                    on_pair(cert)
            elif node == "catalog_reviewer":
                final["problems"] = value["problems"]
            if node == "pair_certifier":
                final["certifications"] |= value["certifications"]
    return final
