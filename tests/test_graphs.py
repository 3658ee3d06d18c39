"""Graphs listed in langgraph.json import and run end to end on an in-memory checkpointer."""

import importlib
import json
from dataclasses import replace
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


@pytest.mark.parametrize("given, error", [
    ({"env_transport": "pigeon"}, "context: env_transport='pigeon' (direct, memory or stdio)"),
    ({"max_infra_retries": -5, "max_turns": 0}, "context: max_infra_retries=-5 (at least 0); max_turns=0 (at least 1, or None)"),
    ({"max_turns": "10", "model_timeout_s": 0}, "context: max_turns='10' (at least 1, or None); model_timeout_s=0 (a number above 0)"),
    ({"proposals": "any", "task_proposals": None}, "context: proposals='any' (menu or free); task_proposals=None (menu or free)"),
])
async def test_a_context_no_run_can_use_is_refused_by_field_however_it_is_given(given, error, tmp_path):
    """As a dataclass (the API) or as JSON to a graph (Studio, the dev server): an evaluation with no infrastructure
    retry at all would otherwise finish having run nothing, and report itself incomplete."""
    from graphs.evaluate import graph as evaluate_graph
    from state.context import ConfigError

    settings = {"agent_model": "scripted:none", "judge_model": "scripted:none", "catalog": str(FIXTURES), "ledger": str(tmp_path / "l.db")}
    with pytest.raises(ConfigError) as refused:
        Context(**settings, **given)
    assert str(refused.value) == error
    with pytest.raises(ConfigError) as refused:
        await evaluate_graph.ainvoke({"run_id": "r1", "bundle": "H0", "pair_ids": ["shop-reserve-drill"], "trials": 1, "seed": 0},
                                     context={**settings, **given})
    assert str(refused.value).startswith(error)
    assert not (tmp_path / "l.db").exists()


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


# Input as Studio, the dev server's API or `graph.ainvoke` hand it over: LangGraph checks nothing of a TypedDict's.

EVALUATE = {"run_id": "r1", "bundle": "H0", "pair_ids": ["shop-reserve-drill"], "trials": 1, "seed": 0}
HARNESS = {"run_id": "r1", "base": "H0", "pool": ["shop-reserve-drill"], "validation": ["shop-rescued"], "candidates": 1, "mode": "fdcr",
           "channel": "structured", "rounds": 1, "rule": "hera"}
COEVOLUTION = {**HARNESS, "train": ["shop-reserve-drill"], "bench": [], "env": "coevolve", "proposers": 1, "batch_size": 1, "tau": 0.4,
               "budget": 1, "max_refinements": 0, "review_rounds": 1}


@pytest.mark.parametrize("name, given, error", [
    ("evaluate", {**EVALUATE, "run_id": "../../up"},
     "evaluate input: run_id: Input should be one file or folder name: no '/', '\\', control character or undecodable byte, "
     "not starting with '.' (got '../../up')"),
    ("evaluate", {**EVALUATE, "pair_ids": "shop-reserve-drill", "trials": 0},
     "evaluate input: pair_ids: Input should be a valid list (got 'shop-reserve-drill'); "
     "trials: Input should be greater than or equal to 1 (got 0)"),
    ("evaluate", {**EVALUATE, "sides": ["sideways"]}, "evaluate input: sides.0: Input should be 'act' or 'abstain' (got 'sideways')"),
    ("evaluate", {**EVALUATE, "pair_ids": ["no-such-pair"]}, "evaluate input: pair_ids: no pair 'no-such-pair' in"),
    ("evaluate", {**EVALUATE, "pair_ids": ["../shop/pairs/shop-rescued"]}, "evaluate input: pair_ids.0: Input should be one file or folder"),
    ("evaluate", {**EVALUATE, "bundle": "/"}, "/manifest.yaml: (file): a bundle's manifest; it does not exist"),
    ("certify", {"pair_ids": ["shop-rescued"], "rescue_budget": 0}, "certify input: rescue_budget: Input should be greater than or equal to 1"),
    ("fdcr", {"diagnosis": {"groups": "none"}, "harness": "H0", "rounds": -1, "review": True},
     "fdcr input: diagnosis.groups: Input should be a valid tuple (got 'none'); rounds: Input should be greater than or equal to 0 (got -1)"),
    ("harness_evolution", {**HARNESS, "pool": [], "gate_level": 0}, "harness_evolution input: pool: List should have at least 1 item"),
    ("env_evolution", {"run_id": "r1", "parents": ["shop-reserve-drill"]}, "env_evolution input: diagnosis: required; harness: required"),
    ("construct", {"theme": "", "out": "o", "tasks": 1, "max_attempts": 1, "max_turns": 1},
     "construct input: theme: String should have at least 1 character (got '')"),
    ("coevolution", {**COEVOLUTION, "tau": 1.5, "mode": "guess"},
     "coevolution input: tau: Input should be less than or equal to 1 (got 1.5); mode: Input should be 'fdcr', 'aggregate' or 'serial'"),
    ("coevolution", {**COEVOLUTION, "train": ["no-such-pair"]}, "coevolution input: no pair 'no-such-pair' in"),
    # JSON's "\ud83d" alone, in text a model would be asked about: sent to a model, each call fails as a malformed reply
    ("construct", {"theme": "caf\ud83d", "out": "o", "tasks": 1, "max_attempts": 1, "max_turns": 1},
     "construct input: theme: text that is not Unicode (half of a character)"),
    ("episode", {"request": {"pair_id": "shop-reserve-drill", "side": "sideways", "bundle": "H0"}},
     "episode input: request.side: Input should be 'act' or 'abstain' (got 'sideways')"),
])
async def test_a_graph_refuses_input_its_schema_does_not_allow_by_field_before_anything_runs(name, given, error, tmp_path):
    """Every model is scripted with no reply (a call would fail the test otherwise than expected), and nothing is
    written: neither the ledger nor the runs root. A bundle's files are the bundle loader's to name (`SpecError`)."""
    from envs.spec import SpecError
    from state.context import ConfigError

    spec = json.loads((ROOT / "langgraph.json").read_text())["graphs"][name]
    module, attr = spec["path"].split(":")
    graph = getattr(importlib.import_module(module.removeprefix("./").removesuffix(".py").replace("/", ".")), attr)
    models = {f"{role}_model": "scripted:none" for role in ("agent", "judge", "analyst", "optimizer", "proposer", "reviewer", "builder",
                                                            "task", "solver")}
    context = Context(**models, catalog=str(FIXTURES), ledger=str(tmp_path / "ledger.db"))
    with pytest.raises((ConfigError, SpecError)) as refused:
        await graph.ainvoke(given, {"configurable": {"thread_id": "t"}}, context=context)
    assert error in str(refused.value), str(refused.value)
    assert not (tmp_path / "ledger.db").exists() and not (tmp_path / "runs").exists()


async def test_a_diagnosis_given_as_json_is_read_as_a_diagnosis(context):
    """What Studio sends the fdcr graph: the roles read the same prompt as from a `Diagnosis`."""
    from graphs.fdcr import graph as fdcr_graph
    from roles.models import scripted
    from state.evolution import Diagnosis, FailureGroup

    diagnosis = Diagnosis(groups=(FailureGroup(kind="did_not_abstain", category="missing_evidence", pair_ids=("a",), recurring=True,
                                               cause="acts on missing facts", evidence="writes"),), episodes=2, failures=1)
    spec, context = {"failure_patterns": [], "changes": []}, replace(context, analyst_model="scripted:analyst")
    prompts = []
    for given in (diagnosis, json.loads(diagnosis.model_dump_json())):
        scripted.register("analyst", ["A1", "C1", "E1", spec])
        out = await fdcr_graph.ainvoke({"diagnosis": given, "harness": "H0", "rounds": "1", "review": True}, context=context)
        scripted.assert_consumed()
        prompts.append([c.messages[0].content for c in scripted.calls("analyst")])
        scripted.clear()
        assert [t.role for t in out["transcript"]] == ["analyst", "critic", "engineer"]
    assert prompts[0] == prompts[1] and "acts on missing facts" in prompts[0][0]
