"""Graphs listed in langgraph.json import and run end to end on an in-memory checkpointer."""

import importlib
import json
from pathlib import Path

import pytest
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


async def test_an_unknown_environment_transport_is_refused_by_name(tmp_path):
    from graphs.api import evaluate
    from state.context import ConfigError

    context = Context(agent_model="scripted:agent", catalog=str(FIXTURES), ledger=str(tmp_path / "l.db"), env_transport="pigeon")
    with pytest.raises(ConfigError, match=r"env_transport='pigeon' \(direct, memory or stdio\)"):
        await evaluate("H0", ["shop-reserve-drill"], context)


@pytest.mark.parametrize("transport", ["direct", "memory", "stdio"])
async def test_the_episode_graph_runs_on_its_own_given_a_pair_and_a_side_and_closes_what_it_opened(transport, tmp_path):
    """As Studio runs it: no evaluation around it, the graph opens the pair's side itself."""
    from graphs.episode import LIVE, graph
    from roles.models import scripted
    from state.context import EpisodeRequest
    from tests.scripts import shop_agent

    scripted.clear()
    scripted.register("agent", [shop_agent] * 3)  # the act side: get_item, reserve, answer
    context = Context(agent_model="scripted:agent", catalog=str(FIXTURES), ledger=str(tmp_path / "l.db"), env_transport=transport)
    try:
        out = await graph.ainvoke({"request": {"pair_id": "shop-reserve-drill", "side": "act", "bundle": "H0"}},  # as JSON gives it
                                  {"configurable": {"thread_id": "studio"}}, context=context)
        scripted.assert_consumed()
    finally:
        scripted.clear()
    assert out["termination"] == "final_answer" and out["answer"].startswith("Reserved 2")
    assert [(o.tool, o.ok) for o in out["observations"]] == [("get_item", True), ("reserve", True)]
    assert not LIVE  # the session is closed and forgotten
    with pytest.raises(KeyError):  # a pair the catalog does not hold fails the run, and leaves nothing open
        await graph.ainvoke({"request": EpisodeRequest(pair_id="no-such-pair", side="act", bundle="H0")}, context=context)
    assert not LIVE
