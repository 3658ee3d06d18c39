"""Structured action mode: one grammar-constrained tool call or a final answer per turn, for any endpoint."""

import asyncio

import jsonschema
import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from envs.catalog import load_catalog
from envs.spec import load_tools
from roles.models import scripted
from roles.models import InfrastructureError, chat_model
from roles.models.openai import OpenAICompatibleModel, local_slot
from roles.models.tool_calls import ACTION_INSTRUCTION, ActionError, action_schema, describe_tools, parse_action
from tests.test_models import TOOLS, chat_body, endpoint, model  # noqa: F401 (endpoint is a fixture)

CATALOG = load_catalog()


def test_the_grammar_of_every_catalog_environment_is_valid_and_admits_its_reference_calls():
    checked = set()
    for entry in CATALOG.values():
        tools = [t.info for t in load_tools(entry.env).values()]
        schema = action_schema(tools)
        if entry.env.id not in checked:
            jsonschema.Draft202012Validator.check_schema(schema)
            checked.add(entry.env.id)
        validator = jsonschema.Draft202012Validator(schema)
        for ref in entry.pair.task.reference.calls:
            errors = list(validator.iter_errors({"tool": ref.tool, "arguments": dict(ref.args)}))
            assert errors == [], f"{entry.pair.id}: {ref.tool}({ref.args}): {errors[0].message}"
        assert not list(validator.iter_errors({"final_answer": "Done."}))
    assert len(checked) == 12


@pytest.mark.parametrize("reply,why", [
    ('{"tool": "steal", "arguments": {}}', "neither a call"),
    ('{"tool": "buy", "arguments": {"sku": "A", "qty": 1, "extra": 1}}', "neither a call"),
    ('[{"tool": "get_item", "arguments": {"sku": "A"}}, {"tool": "buy", "arguments": {"sku": "A"}}]', "neither a call"),
    ('{"final_answer": "ok", "tool": "buy"}', "neither a call"),
    ("I will call get_item now.", "not JSON"),
    ('{"tool": "get_item", "arguments": {"sku": "A"', "not JSON"),
])
def test_a_reply_outside_the_grammar_is_an_action_error(reply, why):
    with pytest.raises(ActionError, match=why):
        parse_action(reply, TOOLS)


def test_parse_action_reads_one_call_or_a_final_answer():
    assert parse_action('{"tool": "get_item", "arguments": {"sku": "A"}}', TOOLS) == ("", [{"name": "get_item", "args": {"sku": "A"}}])
    assert parse_action('{"final_answer": "It costs 3."}', TOOLS) == ("It costs 3.", [])


def test_scripted_structured_turns_and_a_malformed_one():
    scripted.register("agent", [{"tool": "get_item", "arguments": {"sku": "A"}}, '{"final_answer": "3 left."}', "get_item(sku='A')"])
    try:
        llm = chat_model("scripted:agent", role="agent")
        first = asyncio.run(llm.complete([HumanMessage("How many A?")], TOOLS, action_mode="structured"))
        assert first.message.tool_calls[0]["name"] == "get_item" and first.message.content == ""
        second = asyncio.run(llm.complete([HumanMessage("How many A?")], TOOLS, action_mode="structured"))
        assert second.message.content == "3 left." and second.message.tool_calls == []
        with pytest.raises(InfrastructureError) as info:
            asyncio.run(llm.complete([HumanMessage("How many A?")], TOOLS, action_mode="structured"))
        assert info.value.kind == "malformed"  # not the agent's failure: recorded and re-run
    finally:
        scripted.clear()


async def test_an_endpoint_is_asked_for_one_action_by_json_schema(endpoint):  # noqa: F811
    fake = endpoint([chat_body('{"tool": "buy", "arguments": {"sku": "A"}}')])
    completion = await model().complete([SystemMessage("Shop."), HumanMessage("Buy A.")], TOOLS, action_mode="structured",
                                        max_tokens=8192)
    assert completion.message.tool_calls == [{"name": "buy", "args": {"sku": "A"}, "id": "call_1", "type": "tool_call"}]
    sent = fake.requests[0]
    assert "tools" not in sent and sent["response_format"]["json_schema"]["schema"] == action_schema(TOOLS)
    assert sent.get("max_completion_tokens", sent.get("max_tokens")) == 1536
    assert sent["messages"][0]["content"] == "Shop.\n\n" + describe_tools(TOOLS, ACTION_INSTRUCTION)


async def test_the_local_agent_keeps_a_server_slot_of_its_own(endpoint):  # noqa: F811
    fake = endpoint([chat_body("hi"), chat_body("hi")])

    async def own_server():
        return fake.url

    for role in ("agent", "abstention_judge"):
        llm = OpenAICompatibleModel("local", role=role, model="fake", record_as="local:fake", base_url=own_server, api_key="local",
                                    timeout_s=5, max_retries=0, retry_base_s=0, text_tools=True,
                                    sampling={"extra_body": {"id_slot": local_slot(role)}})
        await llm.complete([HumanMessage("hi")])
    assert [r["id_slot"] for r in fake.requests] == [0, 1]
