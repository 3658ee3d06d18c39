"""Graphs listed in langgraph.json import and run end to end on an in-memory checkpointer."""

import importlib
import json
from pathlib import Path

from langgraph.checkpoint.memory import InMemorySaver

from graphs.certify import builder
from state.context import Context
from tests.conftest import FIXTURES

ROOT = Path(__file__).resolve().parent.parent


def test_langgraph_json_entries_import():
    spec = json.loads((ROOT / "langgraph.json").read_text())
    for name, entry in spec["graphs"].items():
        assert entry["description"].strip(), name
        module, attr = entry["path"].split(":")
        graph = getattr(importlib.import_module(module.removeprefix("./").removesuffix(".py").replace("/", ".")), attr)
        assert graph.name == name
        assert graph.checkpointer is None


async def test_certify_graph_fans_out_and_reports(tmp_path):
    graph = builder.compile(checkpointer=InMemorySaver())
    result = await graph.ainvoke(
        {"pair_ids": ["shop-reserve-drill", "shop-rescued"]},
        {"configurable": {"thread_id": "t1"}},
        context=Context(catalog=str(FIXTURES), ledger=str(tmp_path / "ledger.db")),
    )
    assert {k: v.passed for k, v in result["certifications"].items()} == {"shop-reserve-drill": True, "shop-rescued": False}
    assert result["problems"] == ["shop-rescued failed certification"]  # a custom catalog: no split quotas


def test_a_hooks_lookup_passes_ids_it_read_as_text_in_the_types_the_tool_takes():
    from graphs.episode import _typed
    from state.records import ToolInfo

    schema = {"type": "object", "properties": {"user_id": {"type": "integer"}, "ratio": {"type": "number"}, "code": {"type": "string"}}}
    tool = ToolInfo(name="get_user", description="", input_schema=schema, read_only=True)
    assert _typed(tool, {"user_id": "75", "ratio": "0.5", "code": "75"}) == {"user_id": 75, "ratio": 0.5, "code": "75"}
    assert _typed(tool, {"user_id": "U-75", "other": "1"}) == {"user_id": "U-75", "other": "1"}  # what does not read so stays
