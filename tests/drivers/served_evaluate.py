"""The `evaluate` graph with the shop fixture's scripted agent and judge
registered, for the dev server in test_serve (scripts live in the server's process).

One pair, one trial: five agent steps (act: get_item, reserve, answer;
abstain: get_item, refusal) and two judge verdicts.
"""

from graphs.evaluate import graph
from roles.models import scripted
from tests.scripts import shop_agent, shop_judge

scripted.register("agent", [shop_agent] * 5)
scripted.register("judge", [shop_judge] * 2)

__all__ = ["graph"]
