"""Progress when the output is not a terminal: plain lines at the start, at each stage change, on a heartbeat and
at the end, and a long command's run id with how to resume it before it starts."""

import io
import re
import time

from rich.console import Console
from rich.progress import Progress

from graphs.cli import main, method_progress
from graphs.progress import Lines, progress
from roles.models import scripted
from tests.conftest import FIXTURES
from tests.scripts import shop_agent, shop_judge


def lines(console: Console) -> list[str]:
    return [re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", line) for line in console.file.getvalue().splitlines()]


def test_a_line_at_the_start_at_each_stage_change_and_at_the_end_and_none_for_details():
    console = Console(file=io.StringIO(), width=40)
    with progress(console, heartbeat_s=3600) as bars:
        assert isinstance(bars, Lines)
        bar = bars.add_task("evaluating H0", total=4)
        bars.update(bar, advance=1, description="evaluating H0 · drill/feasible ✓")
        bars.update(bar, advance=1, description="evaluating H0 · drill/infeasible ✗")  # same stage: no line
        bars.update(bar, advance=1, description="evaluating C1 · drill/feasible ✓")
    # one line each, however narrow the console
    assert lines(console) == ["start: evaluating H0 (0/4)", "evaluating C1 · drill/feasible ✓ (3/4)",
                              "end: evaluating C1 · drill/feasible ✓ (3/4)"]


def test_a_heartbeat_line_shows_the_latest_detail_when_nothing_else_was_printed():
    console = Console(file=io.StringIO())
    with progress(console, bar=False, heartbeat_s=0.2) as bars:
        bar = bars.add_task("designing proposals")
        bars.update(bar, description="designing proposals · [red]O3[/red] chosen", advance=2)
        time.sleep(0.7)
    # markup in a description is shown as written
    beats = [line for line in lines(console) if not line.startswith(("start:", "end:"))]
    assert len(beats) >= 2 and set(beats) == {"designing proposals · [red]O3[/red] chosen (2 done)"}


def test_compared_methods_beat_only_for_the_one_running():
    console = Console(file=io.StringIO())
    with progress(console, bar=False, heartbeat_s=0.2) as bars:
        on_event = method_progress(bars)
        on_event("coevolution", "bench", {})
        on_event("h0", "episode", {"episode": "drill", "side": "act", "success": True, "status": "done"})
        time.sleep(0.7)
    beats = [line for line in lines(console) if not line.startswith(("start:", "end:"))]
    assert len(beats) >= 2 and all(line.startswith("h0: scoring · episode 1: drill/act") for line in beats[1:]), beats


def test_a_sub_runs_nodes_set_the_stage_its_inner_nodes_do_not():
    console = Console(file=io.StringIO())
    with progress(console, bar=False, heartbeat_s=3600) as bars:
        on_event = method_progress(bars)
        on_event("harness-only", "episode", {"episode": "drill", "side": "act", "success": True, "status": "done"})
        on_event("harness-only", "stage", {"stage": "failure_analyst"})
        on_event("harness-only", "stage", {"stage": "analyst"})  # inside fdcr: no change
        on_event("harness-only", "stage", {"stage": "harness_optimizer"})
    # the episode, in the stage the line started with ("starting": a resumed run's is not known yet), waits for a beat
    assert lines(console)[1:-1] == ["harness-only: harness evolution: reviewing the failures", "harness-only: harness evolution: checking the candidate"]


def test_a_terminal_gets_rich_live_bars():
    assert isinstance(progress(Console(file=io.StringIO(), force_terminal=True)), Progress)


def test_an_evaluation_logged_to_a_file_says_its_run_id_and_how_to_resume_then_its_progress(capsys, tmp_path):
    scripted.register("agent", [shop_agent] * 5)
    scripted.register("judge", [shop_judge] * 2)
    argv = ["--catalog", str(FIXTURES), "--ledger", str(tmp_path / "l.db"), "eval", "--pairs", "shop-reserve-drill",
            "--model", "scripted:agent", "--judge-model", "scripted:judge"]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    run_id = re.match(r"run (\S+); to resume it: `hera (.*)`$", err[0])
    assert run_id, err[0]
    assert run_id.group(2).split() == [*argv, "--run-id", run_id.group(1)]
    assert re.match(r"\[\d\d:\d\d:\d\d\] start: H0 × scripted:agent \(0/2\)$", err[1])
    assert any(re.search(r"end: H0 × scripted:agent · shop-reserve-drill/\w+ [✓✗] \(2/2\)$", line) for line in err)
    # given again, the run id is kept and the resume command is the same
    assert main([*argv, "--run-id", run_id.group(1)]) == 0
    assert capsys.readouterr().err.splitlines()[0] == err[0]
