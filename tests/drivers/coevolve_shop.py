"""Run a two-round co-evolution on a shop catalog with scripted models,
logging every model call the scripts answer, for the SIGKILL resume test.

    python -m tests.drivers.coevolve_shop CATALOG LEDGER LOG RUN_ID
"""

import asyncio
import sys
import time
from pathlib import Path

from graphs import api
from tests.test_coevolution import SETTINGS, models, register_models


def main(catalog: str, ledger: str, log_path: str, run_id: str) -> None:
    register_models(lambda name, step: logged(name, step, log_path))
    asyncio.run(api.run_coevolution("H0", models(Path(catalog), Path(ledger)), run_id=run_id, **SETTINGS))


def logged(name, step, log_path):
    def answer(messages, second):
        time.sleep(0.02)  # slow enough for the test to kill the run between two calls
        with open(log_path, "a") as f:
            f.write(f"{name}\n")
        return step(messages, second) if callable(step) else step
    return answer


if __name__ == "__main__":
    main(*sys.argv[1:])
