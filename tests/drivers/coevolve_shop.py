"""Run a two-round co-evolution on a shop catalog with scripted models, for
the SIGKILL resume test. The log gets the script's name when a scripted model
is called, and `done <role>` once a reply is kept in the call journal (a call
is finished then, not before).

    python -m tests.drivers.coevolve_shop CATALOG LEDGER LOG RUN_ID
"""

import asyncio
import json
import sys
import time
from pathlib import Path

from graphs import api
from state import journal
from tests.test_coevolution import SETTINGS, models, register_models


def main(catalog: str, ledger: str, log_path: str, run_id: str) -> None:
    register_models(lambda name, step: logged(name, step, log_path))
    keep = journal._write

    def write(target, items: list[tuple[str, str, str]]) -> None:
        keep(target, items)
        with open(log_path, "a") as f:
            f.writelines(f"done {json.loads(reply)['usage']['role']}\n" for _, _, reply in items)

    journal._write = write
    asyncio.run(api.run_coevolution("H0", models(Path(catalog), ledger), run_id=run_id, **SETTINGS))  # a ledger URL is no path


def logged(name, step, log_path):
    def answer(messages, second):
        time.sleep(0.02)  # slow enough for the test to kill the run between two calls
        with open(log_path, "a") as f:
            f.write(f"{name}\n")
        return step(messages, second) if callable(step) else step
    return answer


if __name__ == "__main__":
    main(*sys.argv[1:])
