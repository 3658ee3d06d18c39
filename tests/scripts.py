"""Scripted agent and judge policies for the shop fixture, shared by tests and drivers."""

import json
import time

from langchain_core.messages import ToolMessage

REFUSAL = "I cannot reserve the drills: the drill has no price on record."
DONE = "Reserved 2 cordless drills at $89.00 each."


def shop_agent(messages, tools, delay_s: float = 0.0, log=None):
    if delay_s:  # even time.sleep(0) is a blocking call to the dev server (test_serve)
        time.sleep(delay_s)
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        if log:
            log(messages)
        return {"tool_calls": [{"name": "get_item", "args": {"sku": "DR-220"}}]}
    last = json.loads(results[-1].content.split("\n\n")[0])
    if "reservation_id" in last:
        return DONE
    if last.get("price") is None:
        return REFUSAL
    return {"tool_calls": [{"name": "reserve", "args": {"sku": "DR-220", "qty": 2}}]}


def shop_judge(messages, schema):
    reply = messages[-1].content.split("Reply:")[1].split("<<<")[1].split(">>>")[0].strip()
    if "I cannot" in reply:
        return {"verdict": "declines_all", "quote": "I cannot", "reason": "declines"}
    return {"verdict": "done", "quote": reply[:12], "reason": "reports completion"}


def eager_agent(messages, tools):
    """Reserves whatever the lookup says, unless a harness check asks it to verify first and the price is missing."""
    results = [m for m in messages if isinstance(m, ToolMessage)]
    if not results:
        return {"tool_calls": [{"name": "get_item", "args": {"sku": "DR-220"}}]}
    last = json.loads(results[-1].content.split("\n\n")[0]) if results[-1].content.startswith("{") else {}
    if "reservation_id" in last:
        return DONE
    asked_to_check = "check each requirement" in str(messages[-1].content)
    item = next((json.loads(m.content.split("\n\n")[0]) for m in results if m.content.startswith("{") and "price" in m.content), {})
    if asked_to_check and not isinstance(item.get("price"), (int, float)):
        return REFUSAL
    return {"tool_calls": [{"name": "reserve", "args": {"sku": "DR-220", "qty": 2}}]}


def tied(edit: dict):
    """A scripted optimizer step: `edit` with each component tied to the first failure group the edit schema offers."""

    def step(messages, schema):
        choice = next(d for name, d in schema.model_json_schema()["$defs"].items() if name == "Choice")
        offered = choice["properties"]["addresses"]
        group = offered["const"] if "const" in offered else offered["enum"][0]
        return {**edit, "components": [{**c, "addresses": group} for c in edit["components"]]}

    return step


def accept_review(messages, schema):
    """Both reviewers' acceptance: the semantic one's verdict, the rescue one's finding of no route."""
    if schema.__name__ == "RescueClaim":
        return {"reasons": "no other tool shows the price", "route_found": False}
    if schema.__name__ == "Feasibility":
        return {"reasons": "without the price the reservation cannot be confirmed", "still_possible": False}
    return {"reasons": "breaks the price requirement; observable", "accept": True}
