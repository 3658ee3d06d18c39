"""The sandbox: a candidate bundle that reads private data, opens sockets, forks,
loops or eats memory is contained and reported, and a sandboxed copy of H0
plays an episode exactly as the built-in H0 does."""

import asyncio
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import pytest
from langchain_core.messages import messages_to_dict
from pydantic import BaseModel, ValidationError

from graphs.episode import run_episode
from harness.abi import EpisodeView, ToolRequest, answer_schema
from harness.bundle import BUNDLES, load_bundle
from harness.check import _TOOL, check_bundle
from harness.remote import HookError, SandboxedHarness
from envs.sandbox import ROOT, isolation
from roles.models import scripted
from state.context import Context, EpisodeRequest
from state.records import Observation
from tests.conftest import FIXTURES
from tests.scripts import shop_agent

PAIR = "shop-reserve-drill"
PAIR_FILE = next((ROOT / "envs" / "catalog").rglob("pairs/*.yaml"))
needs_network_isolation = pytest.mark.skipif(isolation() == "none", reason="unshare -n does not work here")
needs_namespaces = pytest.mark.skipif(isolation() != "namespaces",
                                      reason=f"isolation here is {isolation()!r}: no mount/user namespaces to hide files or drop to an unprivileged uid")


def candidate(tmp_path: Path, body: str, name: str = "candidate") -> Path:
    bundle = tmp_path / name
    shutil.copytree(BUNDLES / "H0", bundle)
    (bundle / "hooks.py").write_text(
        "import os, socket\nfrom harness.abi import BaseHarness, Decision, Final\n\n"
        "class Harness(BaseHarness):\n" + body)
    return bundle


def view_for(bundle) -> EpisodeView:
    return EpisodeView(instruction="Look up record R-1.", context="A test environment.", tools=[_TOOL],
                       config=bundle.config, prompts=bundle.prompts, skills=bundle.skills)


async def initialize_sandboxed(path: Path, timeout_s: float = 30) -> None:
    async with SandboxedHarness(load_bundle(path), timeout_s=timeout_s) as harness:
        await harness.initialize(view_for(load_bundle(path)))


@pytest.fixture
def runs(monkeypatch):
    """A runs directory anyone could read, holding a private file: only the mount hides it."""
    path = Path(tempfile.mkdtemp(prefix="hera-runs-"))
    os.chmod(path, 0o755)
    (path / "ledger-secret.txt").write_text("label: abstain")
    monkeypatch.setenv("HERA_RUNS", str(path))
    yield path
    shutil.rmtree(path)


@needs_namespaces
def test_private_files_are_hidden_from_a_candidate(tmp_path, runs):
    private = [PAIR_FILE, runs / "ledger-secret.txt", FIXTURES / "shop" / "environment.yaml"]
    assert all(p.is_file() for p in private)
    bundle = candidate(tmp_path, (
        f"    def compose_instructions(self, view):\n"
        f"        seen = []\n"
        f"        for path in {[str(p) for p in private]!r}:\n"
        f"            try:\n"
        f"                seen.append(open(path).read()[:20])\n"
        f"            except OSError as exc:\n"
        f"                seen.append(type(exc).__name__)\n"
        f"        return ','.join(seen)\n"
        f"    def initialize(self, view):\n"
        f"        open({str(PAIR_FILE)!r}).read()\n"))

    async def compose() -> str:
        async with SandboxedHarness(load_bundle(bundle)) as harness:
            return await harness.compose_instructions(view_for(load_bundle(bundle)))

    assert asyncio.run(compose()) == "FileNotFoundError,FileNotFoundError,FileNotFoundError"
    problems = check_bundle(bundle)
    assert len(problems) == 1 and problems[0].startswith(f"{bundle.resolve() / 'hooks.py'}: Harness.initialize: raised FileNotFoundError")


@needs_network_isolation
@pytest.mark.parametrize("address", ["127.0.0.1", "192.0.2.1"])
def test_sockets_go_nowhere(tmp_path, address):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    bundle = candidate(tmp_path, f"    def initialize(self, view):\n        socket.create_connection(({address!r}, {port}), timeout=3)\n")
    start = time.monotonic()
    problems = check_bundle(bundle)
    with pytest.raises(HookError, match=r"hooks.py: Harness.initialize: raised OSError: \[Errno 101\] Network is unreachable"):
        asyncio.run(initialize_sandboxed(bundle))
    assert time.monotonic() - start < 30
    assert len(problems) == 1 and "hooks.py: Harness.initialize: raised OSError: [Errno 101] Network is unreachable" in problems[0]
    server.setblocking(False)
    with pytest.raises(BlockingIOError):
        server.accept()  # no connection ever reached this process
    server.close()


@needs_namespaces
def test_fork_bomb_is_contained(tmp_path):
    bundle = candidate(tmp_path, "    def initialize(self, view):\n        while True:\n            os.fork()\n")
    start = time.monotonic()
    problems = check_bundle(bundle, timeout_s=30)
    with pytest.raises(HookError, match="hooks.py: Harness.initialize: raised BlockingIOError"):
        asyncio.run(initialize_sandboxed(bundle))
    assert time.monotonic() - start < 60
    assert len(problems) == 1 and "hooks.py: Harness.initialize: raised BlockingIOError" in problems[0]


def test_endless_loop_is_stopped(tmp_path):
    bundle = candidate(tmp_path, "    def before_tool_call(self, view, call):\n        while True:\n            pass\n")
    start = time.monotonic()
    assert check_bundle(bundle, timeout_s=5) == [f"{bundle.resolve()}: hooks did not finish within 5s"]

    async def call() -> None:
        harness = load_bundle(bundle)
        async with SandboxedHarness(harness, timeout_s=2) as sandboxed:
            view = view_for(harness)
            await sandboxed.initialize(view)
            await sandboxed.before_tool_call(view, ToolRequest(id="1", name="lookup", args={}))

    with pytest.raises(HookError, match=r"hooks.py: Harness.before_tool_call: did not finish within 2s"):
        asyncio.run(call())
    assert time.monotonic() - start < 30


def test_ten_gigabytes_are_refused(tmp_path):
    bundle = candidate(tmp_path, "    def finalize(self, view, answer):\n        view.memory['x'] = bytearray(10 << 30)\n        return Final()\n")
    problems = check_bundle(bundle)
    assert len(problems) == 1 and "hooks.py: Harness.finalize: raised MemoryError" in problems[0]

    async def call() -> None:
        harness = load_bundle(bundle)
        async with SandboxedHarness(harness) as sandboxed:
            await sandboxed.finalize(view_for(harness), "Done.")

    with pytest.raises(HookError, match="hooks.py: Harness.finalize: raised MemoryError"):
        asyncio.run(call())


def test_candidate_code_never_runs_in_this_process(tmp_path):
    marker = tmp_path / "ran"
    bundle = candidate(tmp_path, "    pass\n")
    (bundle / "hooks.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n" + (bundle / "hooks.py").read_text())
    loaded = load_bundle(bundle)
    assert not loaded.trusted and load_bundle("H0").trusted
    assert not marker.exists()


def test_printing_is_harmless_but_garbage_and_wrong_types_are_hook_errors(tmp_path):
    bundle = candidate(tmp_path, (
        "    def compose_instructions(self, view):\n        print('hello')\n        os.write(1, b'not json\\n')\n        return 'ok'\n"
        "    def before_tool_call(self, view, call):\n        return 'allow'\n"
        "    def finalize(self, view, answer):\n"
        "        for fd in range(3, 12):\n"
        "            try:\n                os.write(fd, b'garbage\\n')\n            except OSError:\n                pass\n"
        "        return Final()\n"))
    harness = load_bundle(bundle)

    async def call(hook: str, *args):
        async with SandboxedHarness(harness) as sandboxed:
            return await getattr(sandboxed, hook)(view_for(harness), *args)

    assert asyncio.run(call("compose_instructions")) == "ok"
    where = f"{bundle.resolve() / 'hooks.py'}: Harness"
    with pytest.raises(HookError) as info:
        asyncio.run(call("before_tool_call", ToolRequest(id="1", name="lookup", args={})))
    assert str(info.value).startswith(f"{where}.before_tool_call: raised TypeError: returned str, expected Decision")
    with pytest.raises(HookError, match=f"^{where}.finalize: the sandboxed child sent garbage: b'garbage"):
        asyncio.run(call("finalize", "Done."))


def test_observations_and_view_changes_cross_the_boundary(tmp_path):
    bundle = candidate(tmp_path, (
        "    def initialize(self, view):\n        view.tools = [t for t in view.tools if t.name != 'lookup']\n"
        "        view.instruction += ' Check first.'\n"
        "    def after_tool_result(self, view, call, observation):\n"
        "        return f'{len(view.observations)} seen, last {view.observations[-1].output}'\n"))

    async def run() -> tuple:
        harness = load_bundle(bundle)
        view = view_for(harness)
        async with SandboxedHarness(harness) as sandboxed:
            await sandboxed.initialize(view)
            call = ToolRequest(id="1", name="lookup", args={"id": "R-1"})
            notes = []
            for n in (1, 2):
                view.observations.append(Observation(tool="lookup", args={"id": "R-1"}, ok=True, output={"n": n}))
                notes.append(await sandboxed.after_tool_result(view, call, view.observations[-1]))
            return view, notes

    view, notes = asyncio.run(run())
    assert view.tools == [] and view.instruction == "Look up record R-1. Check first."
    assert notes == ["1 seen, last {'n': 1}", "2 seen, last {'n': 2}"]


def test_ask_schema_stand_in_shows_the_exact_schema_and_validates():
    class Check(BaseModel):
        complete: bool
        reason: str = ""

    stand_in = answer_schema("Check", Check.model_json_schema())
    assert stand_in.__name__ == "Check" and stand_in.model_json_schema() == Check.model_json_schema()
    assert stand_in.model_validate({"complete": True}).model_dump() == {"complete": True}
    with pytest.raises(ValidationError, match="complete: 'yes' is not of type 'boolean'"):
        stand_in.model_validate({"complete": "yes"})
    with pytest.raises(ValidationError, match="'complete' is a required property"):
        stand_in.model_validate({})


@pytest.fixture
def context(tmp_path):
    scripted.clear()
    yield Context(agent_model="scripted:agent", judge_model="scripted:judge", catalog=str(FIXTURES),
                  ledger=str(tmp_path / "ledger.db"))
    scripted.clear()


def _episode(bundle: str, context: Context, side: str = "act") -> dict:
    return asyncio.run(run_episode(EpisodeRequest(pair_id=PAIR, side=side, bundle=bundle), context, f"{bundle}-{side}"))


def _trajectory(out: dict) -> dict:
    messages = messages_to_dict(out["messages"])
    for m in messages:
        m["data"].pop("id", None)
    return {"messages": messages, "observations": out["observations"], "answer": out["answer"],
            "termination": out["termination"], "turns": out["turns"], "harness_hash": out["harness_hash"],
            "usage": [(u.role, u.input_tokens, u.output_tokens) for u in out["usage"]]}


def test_sandboxed_copy_of_h0_plays_the_same_episode(tmp_path, context, monkeypatch):
    copy = tmp_path / "H0-copy"
    shutil.copytree(BUNDLES / "H0", copy)
    started: list[int] = []
    start = SandboxedHarness._start

    async def spy(self, hook):
        await start(self, hook)
        started.append(self._child.proc.pid)

    monkeypatch.setattr(SandboxedHarness, "_start", spy)
    trajectories = {}
    for side in ("act", "abstain"):
        for name in ("H0", str(copy)):
            scripted.register("agent", [shop_agent] * (3 if side == "act" else 2))
            trajectories[side, name] = _trajectory(_episode(name, context, side))
            scripted.assert_consumed()
    assert len(started) == 2
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped: no zombie
    for side in ("act", "abstain"):
        assert trajectories[side, "H0"] == trajectories[side, str(copy)]
    assert [o.tool for o in trajectories["act", "H0"]["observations"]] == ["get_item", "reserve"]


def test_a_crashing_candidate_ends_its_episode_as_a_harness_error(tmp_path, context):
    bundle = candidate(tmp_path, "    def after_tool_result(self, view, call, observation):\n        return observation.missing\n")
    scripted.register("agent", [shop_agent])
    out = _episode(str(bundle), context)
    scripted.assert_consumed()
    assert out["termination"] == "harness_error" and out["answer"] == ""
    assert out["error"].startswith(f"{bundle.resolve() / 'hooks.py'}: Harness.after_tool_result: raised AttributeError")
    assert [o.tool for o in out["observations"]] == ["get_item"]  # the call it made is kept for grading


def test_a_candidate_handing_back_text_no_record_can_hold_ends_its_episode_as_a_harness_error(tmp_path, context):
    """Half of an escaped emoji, sent as JSON's "\\ud83d", once crashed the run that recorded the episode."""
    bundle = candidate(tmp_path, "    async def finalize(self, view, answer):\n        return Final(action='replace', text='Done \\ud83d')\n")
    scripted.register("agent", [shop_agent] * 3)
    out = _episode(str(bundle), context)
    scripted.assert_consumed()
    assert out["termination"] == "harness_error"
    assert "finalize: the sandboxed child sent text that is not Unicode (a lone surrogate, in " in out["error"]
    assert '"text": "Done \\ud83d"' in out["error"]


def test_a_sandboxed_hook_looks_records_up_through_the_episode_and_never_writes(tmp_path, context):
    bundle = candidate(tmp_path, (
        "    async def initialize(self, view):\n"
        "        found = await view.lookup('get_item', {'sku': 'DR-220'})\n"
        "        view.instruction += f' (price on file: {found.output[\"price\"]})'\n"
        "        try:\n"
        "            await view.lookup('reserve', {'sku': 'DR-220', 'qty': 1})\n"
        "        except ValueError as exc:\n"
        "            view.instruction += f' [{exc}]'\n"
        "    def before_tool_call(self, view, call):\n"
        "        return Decision(action='block', message=f'{len(view.observations)} seen')\n"))
    scripted.register("agent", [{"tool_calls": [{"name": "get_item", "args": {"sku": "DR-220"}}]}, "It costs 89."])
    out = _episode(str(bundle), context)
    scripted.assert_consumed()
    assert [(o.tool, o.source) for o in out["observations"]] == [("get_item", "harness")]  # recorded, and the write refused
    human = out["messages"][1].content
    assert "(price on file: 89.0)" in human and "'reserve' is not a read-only tool" in human
    assert out["messages"][3].content == "1 seen"  # the child's view holds the lookup too


def test_a_revision_goes_back_to_the_model_with_the_finalizing_hooks_lookups_kept(tmp_path, context):
    bundle = candidate(tmp_path, (
        "    asked = False\n"
        "    async def finalize(self, view, answer):\n"
        "        found = await view.lookup('get_item', {'sku': 'DR-220'})\n"
        "        if not self.asked:\n"
        "            self.asked = True\n"
        "            return Final(action='revise', text=f'The file says {found.output[\"price\"]}. Check it.')\n"
        "        return Final(action='abstain', text='Not sure: ' + answer)\n"))
    scripted.register("agent", ["It costs 5.", "It costs 89."])
    out = _episode(str(bundle), context)
    scripted.assert_consumed()
    assert [type(m).__name__ for m in out["messages"]] == ["SystemMessage", "HumanMessage", "AIMessage", "HumanMessage", "AIMessage"]
    assert out["messages"][3].content == "The file says 89.0. Check it."
    assert [(o.tool, o.source) for o in out["observations"]] == [("get_item", "harness")] * 2  # one lookup per finalize
    assert (out["answer"], out["termination"], out["turns"]) == ("Not sure: It costs 89.", "final_answer", 2)
