"""The `episode` graph: one harness bundle on one side of one pair.

`setup` lists the tools of the episode's session (a fresh instance of the
pair's side: its tools called in process by default, or over MCP, as
`Context.env_transport` says), loads the bundle and lets its hooks compose the
instructions; `agent` runs one model turn through
`prepare_turn` (in the bundle's action mode) and, on a turn without tool
calls, asks `finalize` whether to accept, replace, abstain or revise; `tools`
runs the requested calls through `before_tool_call`, `present_result` (what
the model is shown) and `after_tool_result`; `close` closes what a standalone
episode opened (an episode `run_episode` runs ends without it: each step of a
graph costs about what a bare turn does). Read-only calls a hook makes itself
(`view.lookup`) are recorded with the agent's, marked as the harness's. A
hook's failure ends the episode as `harness_error` (scored); a tool that
crashes ends it as `environment_error` (the environment's defect, never
scored). Every text a hook hands back is capped at `MAX_TEXT` characters.
The session and the harness object live
outside the checkpointed state, in `LIVE`, for the life of the episode;
`run_episode` opens and always closes the session. Invoked on its own (from
LangGraph Studio, say) with a request naming a pair, a side and a bundle, the
graph opens the session itself and `close` closes it. Nothing private about the pair
(acceptance rules, mutation, label) reaches the harness or the model.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import operator
import re
import uuid
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Annotated, AsyncIterator, Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import Command
from typing_extensions import NotRequired, TypedDict

from envs.catalog import Entry, entry_context, load_entry, side_env
from envs.mcp_server import DirectSession, connection, direct_session, memory_session
from graphs.inputs import checked
from harness.abi import BaseHarness, EpisodeView, ToolRequest, call_hook
from harness.bundle import Bundle, load_bundle
from harness.remote import HookError, SandboxedHarness
from state.journal import call_scope, episode_scope, run_thread
from roles.models import ChatModel, ContextLimitError, InfrastructureError, chat_model
from state.context import Context, EpisodeRequest
from state.records import EnvironmentSpec, Observation, ToolInfo, UsageRecord, capped

Termination = Literal["final_answer", "turn_limit", "context_limit", "infrastructure_error", "harness_error", "environment_error"]
TOOL_CRASH = "internal_error"  # the code `envs.runtime` gives a tool that raised or returned a value that is not JSON
OWN_SESSION_TTL_S = 4 * 3600  # a standalone episode that never reaches `close` (a crash) has its session closed after this


class EnvironmentFault(RuntimeError):
    """A tool of the environment crashed: its defect, not the harness's (not a ValueError, which `view.lookup` hands the hook)."""


@dataclass
class Live:
    """What an episode holds open between nodes: the request, the public context and the MCP session opened by
    `run_episode` (or `run_task`), and the harness, view and model made by `setup`."""

    instruction: str
    context: str
    session: ClientSession | DirectSession
    harness: BaseHarness | None = None
    view: EpisodeView | None = None
    model: ChatModel | None = None
    request: EpisodeRequest | None = None
    read_only: dict[str, bool] = field(default_factory=dict)
    harness_usage: list[UsageRecord] = field(default_factory=list)
    pending: list[Observation] = field(default_factory=list)
    bundle: Bundle | None = None  # the harness to run, when the caller has it loaded
    release: asyncio.Event | None = None  # when the episode opened its own session: `close` sets it
    holder: asyncio.Task | None = None  # the task holding that session open

    def record(self, observation: Observation) -> None:
        self.view.observations.append(observation)
        self.pending.append(observation)

    def drain(self) -> dict:
        """The node's share of the episode record: the calls made (the agent's and the hooks' own
        lookups, in order) and the usage of the hooks' model questions since the last node."""
        observations, self.pending = self.pending, []
        usage, self.harness_usage = self.harness_usage, []
        return {"observations": observations, "usage": usage}


LIVE: dict[str, Live] = {}


class EpisodeInput(TypedDict):
    request: EpisodeRequest
    episode_id: NotRequired[str]  # given by `run_episode`; a standalone episode makes its own


class EpisodeOutput(TypedDict, total=False):
    messages: list[BaseMessage]
    observations: list[Observation]
    usage: list[UsageRecord]
    answer: str
    termination: Termination
    error: str
    harness_hash: str
    turns: int


class EpisodeState(EpisodeInput, EpisodeOutput, total=False):
    messages: Annotated[list[BaseMessage], operator.add]
    observations: Annotated[list[Observation], operator.add]
    usage: Annotated[list[UsageRecord], operator.add]


async def setup(state: EpisodeState, runtime: Runtime[Context]) -> Command[Literal["agent", "close", "__end__"]]:
    """Opens the episode's environment (unless `run_episode` did) and harness; writes `messages`, `turns`,
    `harness_hash`, and `episode_id` when it was not given."""
    request, ctx = state["request"], runtime.context
    if not isinstance(request, EpisodeRequest):  # from Studio, a dict
        request = checked(EpisodeInput, state, "episode")["request"]
    episode_id = state.get("episode_id") or f"{request.pair_id}/{request.side}/{uuid.uuid4().hex[:8]}"
    live = LIVE.get(episode_id) or await _open_own(request, ctx, episode_id)
    try:
        bundle = live.bundle or await asyncio.to_thread(load_bundle, request.bundle)
    except BaseException:
        await _release(episode_id)
        raise
    listed = (await live.session.list_tools()).tools
    tools = [
        ToolInfo(name=t.name, description=t.description or "", input_schema=t.inputSchema,
                 read_only=bool(t.annotations and t.annotations.readOnlyHint))
        for t in listed
    ]
    model = chat_model(ctx.agent_model, role="agent", timeout_s=ctx.model_timeout_s)
    asker = chat_model(ctx.agent_model, role="harness", timeout_s=ctx.model_timeout_s)

    async def ask(messages, schema):
        answer, usage = await asker.structured(messages, schema)
        live.harness_usage.append(usage)
        return answer

    async def lookup(name: str, args: dict) -> Observation:
        if not live.read_only.get(name, False):
            raise ValueError(f"view.lookup: {name!r} is not a read-only tool of this environment")
        args = _typed(next(t for t in tools if t.name == name), args)
        observation = (await _call_tool(live, ToolRequest(id="lookup", name=name, args=args))).model_copy(update={"source": "harness"})
        live.record(observation)
        if observation.error_code == TOOL_CRASH:
            raise _fault(observation)
        return observation

    view = EpisodeView(instruction=live.instruction.strip(), context=live.context, tools=tools,
                       config=bundle.config, prompts=bundle.prompts, skills=bundle.skills, ask=ask, lookup=lookup)
    # Only a built-in bundle's code runs in this process; a candidate's runs in the sandbox.
    harness = bundle.harness() if bundle.trusted else SandboxedHarness(bundle)
    live.harness, live.view, live.model, live.request = harness, view, model, request
    live.read_only = {t.name: t.read_only for t in tools}
    try:
        await call_hook(harness.initialize, view)
        system = capped(await call_hook(harness.compose_instructions, view))
    except (HookError, EnvironmentFault) as exc:
        return _ended(exc, live, messages=[], turns=0, harness_hash=bundle.hash, episode_id=episode_id)
    view.instruction = capped(view.instruction)
    return Command(goto="agent", update={"messages": [SystemMessage(system), HumanMessage(view.instruction)], "turns": 0,
                                         "harness_hash": bundle.hash, "episode_id": episode_id, **live.drain()})


async def _open_own(request: EpisodeRequest, ctx: Context, episode_id: str) -> Live:
    """A standalone episode's environment: the pair's side served by a task of its own, which holds the MCP session
    open (an MCP session is closed by the task that opened it) until `close` (or OWN_SESSION_TTL_S) releases it."""
    entry = await asyncio.to_thread(load_entry, request.pair_id, ctx.catalog)
    opened: asyncio.Future[Live] = asyncio.get_running_loop().create_future()
    release = asyncio.Event()

    async def hold() -> None:
        try:
            async with environment_session(entry, request.side, ctx.catalog, ctx.env_transport) as session:
                opened.set_result(Live(entry.pair.task.instruction, entry_context(entry), session, release=release))
                with suppress(TimeoutError):
                    await asyncio.wait_for(release.wait(), OWN_SESSION_TTL_S)
        except Exception as exc:  # the session did not open: the episode's setup raises it
            if not opened.done():
                opened.set_exception(exc)
        finally:
            LIVE.pop(episode_id, None)

    holder = asyncio.get_running_loop().create_task(hold(), context=contextvars.Context())
    live = LIVE[episode_id] = await opened
    live.holder = holder
    return live


async def _release(episode_id: str) -> None:
    """Closes a standalone episode's harness and session; an episode `run_episode` runs is its to close."""
    live = LIVE.get(episode_id)
    if live is None or live.release is None:
        return
    LIVE.pop(episode_id)
    try:
        if isinstance(live.harness, SandboxedHarness):
            await live.harness.aclose()
    finally:
        live.release.set()
        await live.holder


def _end(live: Live) -> str:
    """Where an ending episode goes: `close`, when it opened its session itself, else straight to the end."""
    return "close" if live.release is not None else END


async def close(state: EpisodeState) -> dict:
    """Closes what the episode opened itself (nothing when `run_episode` opened it); writes nothing."""
    await _release(state["episode_id"])
    return {}


async def agent(state: EpisodeState, runtime: Runtime[Context]) -> Command[Literal["agent", "tools", "close", "__end__"]]:
    """One model turn; routes to `tools` on tool calls, else lets the harness finalize the answer (`_finalize`);
    writes `messages`, `observations`, `usage`, `turns`."""
    live = LIVE[state["episode_id"]]
    live.view.turn = state["turns"]
    try:
        messages = await call_hook(live.harness.prepare_turn, live.view, list(state["messages"]))
    except (HookError, EnvironmentFault) as exc:
        return _ended(exc, live)
    config = live.view.config
    try:
        done = await live.model.complete(messages, live.view.tools, max_tokens=config.max_output_tokens,
                                         temperature=config.temperature, action_mode=config.action_mode,
                                         seed=live.request.sampling_seed(state["turns"]))
    except InfrastructureError as exc:
        return Command(goto=_end(live), update={"termination": "infrastructure_error", "error": f"{exc.kind}: {exc}"})
    except ContextLimitError as exc:
        return Command(goto=_end(live), update={"termination": "context_limit", "error": str(exc), "answer": "", **live.drain()})
    turns = state["turns"] + 1
    drained = live.drain()
    update = {"messages": [done.message], "observations": drained["observations"], "usage": [*drained["usage"], done.usage],
              "turns": turns}
    if done.message.tool_calls:
        if turns >= turn_limit(live, runtime.context):
            return Command(goto=_end(live), update={**update, "termination": "turn_limit", "answer": ""})
        return Command(goto="tools", update=update)
    return await _finalize(live, runtime.context, update)


def _typed(tool: ToolInfo, args: dict) -> dict:
    """A hook's lookup arguments with each text that reads as the integer or number the tool's schema asks for passed
    as one: hooks read ids out of text ("75"), and a recorded call must replay against the schema (a built task's
    reference is checked against it)."""
    properties, typed = tool.input_schema.get("properties", {}), dict(args)
    for name, value in args.items():
        kind = properties.get(name, {}).get("type")
        if isinstance(value, str) and kind == "integer" and re.fullmatch(r"-?\d+", value.strip()):
            typed[name] = int(value)
        elif isinstance(value, str) and kind == "number" and re.fullmatch(r"-?\d+(\.\d+)?", value.strip()):
            typed[name] = float(value)
    return typed


def turn_limit(live: Live, ctx: Context) -> int:
    """The harness's turn limit, or the run's budget when that is lower."""
    return min(live.view.config.max_turns, ctx.max_turns or live.view.config.max_turns)


async def tools(state: EpisodeState, runtime: Runtime[Context]) -> Command[Literal["agent", "close", "__end__"]]:
    """Runs the last turn's tool calls through the harness; writes `messages`, `observations`."""
    live = LIVE[state["episode_id"]]
    last: AIMessage = state["messages"][-1]
    replies: list[BaseMessage] = []
    replan: str | None = None
    for call in last.tool_calls:
        request = ToolRequest(id=call["id"], name=call["name"], args=call.get("args") or {})
        if replan is not None:
            replies.append(ToolMessage("Not run.", tool_call_id=request.id))
            continue
        live.view.calls += 1
        try:
            decision = await call_hook(live.harness.before_tool_call, live.view, request)
            if decision.action != "allow":
                replies.append(ToolMessage(capped(decision.message or "Blocked by the harness."), tool_call_id=request.id))
                if decision.action == "replan":
                    replan = capped(decision.message)
                continue
            obs = await _call_tool(live, request)
            if obs.error_code == TOOL_CRASH:  # recorded as it came back; no hook sees it
                live.record(obs)
                raise _fault(obs)
            shown = capped(await call_hook(live.harness.present_result, live.view, request, obs))
            live.record(obs if shown == obs.text else obs.model_copy(update={"shown": shown}))
            guidance = capped(await call_hook(live.harness.after_tool_result, live.view, request, obs) or "")
        except (HookError, EnvironmentFault) as exc:
            return _ended(exc, live, messages=replies)
        replies.append(ToolMessage(shown + (f"\n\n{guidance}" if guidance else ""), tool_call_id=request.id))
    if replan:
        replies.append(HumanMessage(replan))
    return Command(goto="agent", update={"messages": replies, **live.drain()})


async def _call_tool(live: Live, request: ToolRequest) -> Observation:
    result = await live.session.call_tool(request.name, request.args)
    text = "".join(getattr(c, "text", "") for c in result.content)
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        payload = text
    read_only = live.read_only.get(request.name, True)
    if result.isError:
        error = payload.get("error", {}) if isinstance(payload, dict) else {}
        return Observation(tool=request.name, args=request.args, ok=False, error_code=error.get("code", "error"),
                           message=error.get("message", text), read_only=read_only)
    return Observation(tool=request.name, args=request.args, ok=True, output=payload, read_only=read_only)


async def _finalize(live: Live, ctx: Context, update: dict) -> Command:
    """Lets the harness accept, replace, abstain on or revise the answer of the turn `update` holds; adds `answer` and
    `termination` (or, on a revision, the harness's request to the model) to it."""
    answer = capped(_text(update["messages"][-1]))
    try:
        final = await call_hook(live.harness.finalize, live.view, answer)
    except (HookError, EnvironmentFault) as exc:
        return _ended(exc, live, **update)
    update = _with(update, live.drain())
    if final.action == "revise" and update["turns"] < turn_limit(live, ctx):
        return Command(goto="agent", update={**update, "messages": [*update["messages"], HumanMessage(capped(final.text))]})
    if final.action in ("replace", "abstain"):
        answer = capped(final.text)
    return Command(goto=_end(live), update={**update, "answer": answer, "termination": "final_answer"})


def _with(update: dict, drained: dict) -> dict:
    """`update` with a later `Live.drain()`'s observations and usage after its own."""
    return {**update, **{k: [*update.get(k, ()), *v] for k, v in drained.items()}}


def _fault(observation: Observation) -> EnvironmentFault:
    return EnvironmentFault(f"{observation.tool}({json.dumps(observation.args, default=str)}): {observation.message}")


def _ended(exc: HookError | EnvironmentFault, live: Live, **update) -> Command:
    """Ends the episode on a sandboxed hook's failure (the candidate's fault: scored, not re-run) or on a tool's
    crash (the environment's: never scored); the error is kept with its message."""
    termination = "environment_error" if isinstance(exc, EnvironmentFault) else "harness_error"
    return Command(goto=_end(live), update={**_with(update, live.drain()), "termination": termination, "error": capped(str(exc)),
                                           "answer": ""})


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, list):
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return str(content)


def build_episode() -> StateGraph:
    builder = StateGraph(EpisodeState, context_schema=Context, input_schema=EpisodeInput, output_schema=EpisodeOutput)
    builder.add_node(setup)
    builder.add_node(agent)
    builder.add_node(tools)
    builder.add_node(close)
    builder.add_edge(START, "setup")
    builder.add_edge("close", END)
    return builder


builder = build_episode()
graph = builder.compile(name="episode")


@asynccontextmanager
async def environment_session(entry: Entry, side: str, catalog: str, transport: str) -> AsyncIterator[ClientSession | DirectSession]:
    """A session on a fresh instance of one side of a pair: its tools called in this process (`direct`), or an
    MCP client session on a server in this process over memory streams (`memory`) or a server subprocess over
    stdio (`stdio`)."""
    if transport in ("direct", "memory"):
        async with (direct_session if transport == "direct" else memory_session)(side_env(entry, side)) as session:
            yield session
        return
    conn = connection(entry.pair.id, side, catalog)
    params = StdioServerParameters(command=conn["command"], args=conn["args"], cwd=conn["cwd"])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def _journaled_as(scope: str | None, run):
    if scope is None:
        return await run
    with call_scope(scope):
        return await run


async def run_episode(request: EpisodeRequest, context: Context, episode_id: str, entry: Entry | None = None,
                      thread: str | None = None, bundle: Bundle | None = None) -> dict:
    """Runs one episode to the end. The pair and the bundle are loaded (unless the caller has
    them) and the MCP session opened and closed here, in one task, around the graph run. `thread` names the
    checkpointed run the episode belongs to when it runs outside it (on an engine's worker)."""
    catalog = context.catalog
    entry = entry or await asyncio.to_thread(load_entry, request.pair_id, catalog)
    async with environment_session(entry, request.side, catalog, context.env_transport) as session:
        live = Live(entry.pair.task.instruction, entry_context(entry), session, bundle=bundle)
        return await _run(request, context, episode_id, live, thread)


async def run_task(bundle: str, instruction: str, public: str, env: EnvironmentSpec, context: Context, episode_id: str) -> dict:
    """One episode of `bundle` on a request that is no pair yet (a proposed task on a built environment), with the
    public context `public`, on a fresh instance of `env` in this process."""
    async with direct_session(env) as session:
        return await _run(EpisodeRequest(pair_id=episode_id, side="act", bundle=bundle), context, episode_id,
                          Live(instruction, public, session))


async def _run(request: EpisodeRequest, context: Context, episode_id: str, live: Live, thread: str | None = None) -> dict:
    LIVE[episode_id] = live
    run = graph.ainvoke({"request": request, "episode_id": episode_id}, context=context, config={"recursion_limit": 4 * 64 + 10})
    thread = thread or run_thread()
    try:
        # A fresh contextvars context: the episode is the unit of the rollout
        # cache and must not become a checkpointed subgraph of an evaluation.
        # Its model calls are journaled under the run and its id, so a resumed
        # run replays the turns an interrupted attempt already had answered,
        # and another run (another ledger) makes its own calls.
        scope = episode_scope(thread, episode_id) if thread else None
        return await asyncio.get_running_loop().create_task(_journaled_as(scope, run), context=contextvars.Context())
    finally:
        LIVE.pop(episode_id)
        if isinstance(live.harness, SandboxedHarness):
            await live.harness.aclose()
