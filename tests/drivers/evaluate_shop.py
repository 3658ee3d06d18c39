"""Run an evaluation of H0 on the shop fixture with slow scripted models,
logging each episode's first model call, for the SIGKILL resume test.

    python -m tests.drivers.evaluate_shop LEDGER LOG RUN_ID
"""

import asyncio
import sys
from functools import partial

from graphs import api
from roles.models import scripted
from state.context import Context
from tests.conftest import FIXTURES
from tests.scripts import shop_agent, shop_judge

PAIRS = ["shop-out-of-scope", "shop-reserve-drill", "shop-rescued"]


def main(ledger: str, log_path: str, run_id: str) -> None:
    def log(messages):
        with open(log_path, "a") as f:
            f.write(messages[1].content[:20] + "|" + messages[0].content[-40:].replace("\n", " ") + "\n")

    scripted.register("agent", [partial(shop_agent, delay_s=0.3, log=log)] * 200)
    scripted.register("judge", [shop_judge] * 200)
    context = Context(agent_model="scripted:agent", judge_model="scripted:judge", catalog=str(FIXTURES), ledger=ledger)
    asyncio.run(api.evaluate("H0", PAIRS, context, trials=2, run_id=run_id))


if __name__ == "__main__":
    main(*sys.argv[1:])
