"""Run an evaluation of H0 on one shop pair beside another process doing the
same, for the one-writer test. The log gets `<pid> agent` / `<pid> judge` for
each model call and `<pid> waiting` each time this process finds an episode
claimed by the other. Each process's first model call waits (a bounded while)
until the other has found one of its claims, so the two runs overlap.
Prints the run's metrics as JSON.

    python -m tests.drivers.evaluate_beside LEDGER LOG RUN_ID
"""

import asyncio
import os
import sys
import time

from graphs import api
from graphs import evaluate as evaluate_graph
from roles.models import scripted
from state.context import Context
from state.ledger import Ledger
from tests.conftest import FIXTURES
from tests.scripts import shop_agent, shop_judge


def main(ledger: str, log_path: str, run_id: str) -> None:
    me = str(os.getpid())

    def log(what: str) -> None:
        with open(log_path, "a") as f:
            f.write(f"{me} {what}\n")

    def other_waited() -> bool:
        with open(log_path) as f:
            return any(line.split()[0] != me and line.split()[1] == "waiting" for line in f)

    def agent(messages, tools):
        if not [line for line in open(log_path) if line.split() == [me, "agent"]]:
            for _ in range(300):  # a bounded wait: the other process must find this episode claimed before it can finish
                if other_waited():
                    break
                time.sleep(0.1)
        log("agent")
        return shop_agent(messages, tools)

    def judge(messages, schema):
        log("judge")
        return shop_judge(messages, schema)

    claim = Ledger.claim_episode

    def claim_episode(self, *args):
        cached, holder = claim(self, *args)
        if holder is not None:
            log("waiting")
        return cached, holder

    Ledger.claim_episode = claim_episode
    evaluate_graph.POLL_S = 0.05
    scripted.register("agent", [agent] * 5)
    scripted.register("judge", [judge] * 2)
    context = Context(agent_model="scripted:agent", judge_model="scripted:judge", catalog=str(FIXTURES), ledger=ledger)
    metrics = asyncio.run(api.evaluate("H0", ["shop-reserve-drill"], context, run_id=run_id)).metrics
    print(metrics.model_dump_json())


if __name__ == "__main__":
    main(*sys.argv[1:])
