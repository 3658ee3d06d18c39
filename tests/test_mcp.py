"""One environment side over MCP (stdio), consumed through langchain-mcp-adapters."""

import json

import pytest
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools

from envs.catalog import load_catalog
from envs.mcp_server import connection
from tests.conftest import FIXTURES

PAIR = "shop-reserve-drill"
PRIVATE = ["missing_evidence", "mutation", "witness", "requirement", "89.0 each", "abstain", "infeasible", "certif", "DR-220\", \"price\": \"*"]


async def test_round_trip_through_adapters():
    client = MultiServerMCPClient({"env": connection(PAIR, "act", FIXTURES)})
    async with client.session("env") as session:
        tools = {t.name: t for t in await load_mcp_tools(session)}
        assert set(tools) == {"list_items", "get_item", "price_history", "reserve", "sneaky_read", "buggy_write"}
        item = json.loads((await tools["get_item"].ainvoke({"sku": "DR-220"}))[0]["text"])
        assert item == {"sku": "DR-220", "name": "Cordless drill", "price": 89.0, "stock": 2}
        await tools["reserve"].ainvoke({"sku": "DR-220", "qty": 2})
        after = json.loads((await tools["get_item"].ainvoke({"sku": "DR-220"}))[0]["text"])
        assert after["stock"] == 0


async def test_abstain_side_serves_the_mutated_state_and_a_fresh_episode():
    client = MultiServerMCPClient({"env": connection(PAIR, "abstain", FIXTURES)})
    async with client.session("env") as session:
        result = await session.call_tool("get_item", {"sku": "DR-220"})
        assert json.loads(result.content[0].text)["price"] is None
        assert json.loads(result.content[0].text)["stock"] == 2


async def test_nothing_private_is_reachable():
    entry = load_catalog(FIXTURES)[PAIR]
    client = MultiServerMCPClient({"env": connection(PAIR, "abstain", FIXTURES)})
    async with client.session("env") as session:
        init = await session.initialize()
        seen = [init.model_dump_json()]
        listed = await session.list_tools()
        seen.append(listed.model_dump_json())
        assert {t.name for t in listed.tools} == {"list_items", "get_item", "price_history", "reserve", "sneaky_read", "buggy_write"}
        for method in (session.list_resources, session.list_prompts, session.list_resource_templates):
            with pytest.raises(Exception, match="Method not found"):
                await method()
        for name in ("certify", "_private", "__hera_tool__", "apply_mutation", "verify", "witness", "load_catalog"):
            result = await session.call_tool(name, {})
            assert result.isError
            seen.append(result.model_dump_json().replace(name, "<name>"))
        result = await session.call_tool("get_item", {"sku": "DR-220", "__class__": "x"})
        assert result.isError
        for text in seen:
            for secret in PRIVATE + [entry.pair.mutation.description, entry.pair.task.reference.answer]:
                assert secret.casefold() not in text.casefold(), secret


async def test_in_process_sessions_share_the_server_not_the_state():
    from envs.mcp_server import memory_session, shared_server, side_environment

    env = side_environment(PAIR, "act", FIXTURES)

    async def stock(session):
        return json.loads((await session.call_tool("get_item", {"sku": "DR-220"})).content[0].text)["stock"]

    async with memory_session(env) as first, memory_session(env) as second:
        assert not (await first.call_tool("reserve", {"sku": "DR-220", "qty": 2})).isError
        assert (await stock(first), await stock(second)) == (0, 2)
    async with memory_session(env) as third:
        assert await stock(third) == 2
        assert {t.name for t in (await third.list_tools()).tools} == {"list_items", "get_item", "price_history", "reserve", "sneaky_read", "buggy_write"}
    assert shared_server(env) is shared_server(env)


@pytest.mark.parametrize("side", ["act", "abstain"])
async def test_a_direct_session_answers_as_the_mcp_session_does(side):
    """Evaluation's default transport skips the protocol, not the server's answers: the same tool list and, call
    for call, the same results (reads, a write and what it changed, bad arguments, a crashing tool, unknown names)."""
    from envs.mcp_server import direct_session, memory_session, side_environment

    env = side_environment(PAIR, side, FIXTURES)
    calls = [("get_item", {"sku": "DR-220"}), ("reserve", {"sku": "DR-220", "qty": 2}), ("get_item", {"sku": "DR-220"}),
             ("reserve", {"sku": "DR-220", "qty": "many"}), ("get_item", {}), ("get_item", None), ("buggy_write", {}),
             ("sneaky_read", {}), ("list_items", {}), ("price_history", {"sku": "DR-220"}), ("certify", {}), ("__hera_tool__", {"x": 1})]

    async def answers(session):
        listed = (await session.list_tools()).model_dump()
        return listed, [(await session.call_tool(name, args)).model_dump() for name, args in calls]

    async with memory_session(env) as mcp, direct_session(env) as direct:
        over_mcp, in_process = await answers(mcp), await answers(direct)
    assert in_process == over_mcp
    assert [r["isError"] for r in over_mcp[1]].count(True) >= 4  # the errors were compared, not only successes


async def test_a_direct_session_copies_the_environment_at_its_first_call_once(monkeypatch):
    """The fresh instance is made by the first tool call and by no other: an episode that calls no tool
    copies nothing, and calls made at once share one instance (a write one makes is what the other reads)."""
    import asyncio

    import envs.mcp_server as server

    made = []

    class Counted(server.EnvInstance):
        def __init__(self, spec):
            made.append(spec.hash)
            super().__init__(spec)

    monkeypatch.setattr(server, "EnvInstance", Counted)
    env = server.side_environment(PAIR, "act", FIXTURES)
    async with server.direct_session(env) as idle:
        assert [t.name for t in (await idle.list_tools()).tools]
    assert made == []
    async with server.direct_session(env) as session:
        results = await asyncio.gather(*[session.call_tool("get_item", {"sku": "DR-220"}) for _ in range(8)])
        assert not (await session.call_tool("reserve", {"sku": "DR-220", "qty": 2})).isError
        stock = json.loads((await session.call_tool("get_item", {"sku": "DR-220"})).content[0].text)["stock"]
    assert made == [env.hash]
    assert {json.loads(r.content[0].text)["stock"] for r in results} == {2} and stock == 0
