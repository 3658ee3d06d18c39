"""Serve an environment's tools over MCP: stdio, or memory streams in process.

The server exposes the environment's public tools and nothing else: no
resources, no prompts, no server instructions, a neutral server name. The
pair's acceptance rules, mutation, label and certification stay inside this
process. Every connection gets its own fresh instance of the environment
(the server's lifespan), so one server per environment hash serves any
number of episodes, over stdio (one process per episode) or, in process,
over memory streams. `direct_session` gives an episode in this process the
same tool list and the same results without the protocol (no JSON-RPC
messages, no streams, no server task): the lean default of evaluation.

    python -m envs.mcp_server PAIR --side act|abstain [--catalog DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import ClientSession, types
from mcp.server.lowlevel import Server
from mcp.server.models import InitializationOptions
from mcp.server.stdio import stdio_server
from mcp.shared.memory import create_client_server_memory_streams

from envs.catalog import CATALOG, load_entry, side_env
from envs.runtime import EnvInstance
from envs.spec import tool_infos
from state.records import EnvironmentSpec, Side

SERVER_NAME = "environment"
MAX_SERVERS = 256


def side_environment(pair_id: str, side: Side, catalog: Path | str = CATALOG) -> EnvironmentSpec:
    """The feasible (`act`) or mutated (`abstain`) environment of a pair."""
    return side_env(load_entry(pair_id, catalog), side)


@dataclass
class _Connection:
    """One client's environment instance, made by its first call (in that call's thread: an episode pays no trip
    off its event loop for it, and one that calls no tool never copies the environment); its calls run one at a
    time."""

    env: EnvironmentSpec
    instance: EnvInstance | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def call(self, name: str, arguments: dict[str, Any]):
        with self.lock:
            if self.instance is None:
                self.instance = EnvInstance(self.env)
            return self.instance.call(name, arguments)


def listed_tools(env: EnvironmentSpec) -> list[types.Tool]:
    """What `tools/list` answers: the public tools, read-only ones marked."""
    return [
        types.Tool(
            name=t.name,
            description=t.description,
            inputSchema=t.input_schema,
            annotations=types.ToolAnnotations(readOnlyHint=t.read_only),
        )
        for t in tool_infos(env).values()
    ]


async def _call(conn: _Connection, name: str, arguments: dict[str, Any] | None) -> types.CallToolResult:
    """What `tools/call` answers: the observation's text, an error flagged as one."""
    obs = await asyncio.to_thread(conn.call, name, arguments or {})
    return types.CallToolResult(content=[types.TextContent(type="text", text=obs.text)], isError=not obs.ok)


def build_server(env: EnvironmentSpec) -> Server:
    """A server for one environment; each connection (`Server.run`) gets a fresh instance."""
    listed = listed_tools(env)

    @asynccontextmanager
    async def connection_state(_: Server) -> AsyncIterator[_Connection]:
        # Made here, not by the first call: the server would answer a failure to
        # build it as a tool error. Not closed here: a call still running in its
        # thread holds the instance, which is freed when the last reference goes.
        yield _Connection(env, await asyncio.to_thread(EnvInstance, env))

    server: Server = Server(SERVER_NAME, lifespan=connection_state)

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return listed

    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        return await _call(server.request_context.lifespan_context, name, arguments)

    return server


_servers: OrderedDict[str, tuple[Server, InitializationOptions]] = OrderedDict()


def shared_server(env: EnvironmentSpec) -> tuple[Server, InitializationOptions]:
    """The server of an environment hash and its initialization options, built
    once: both are pure functions of the environment, and state lives per connection."""
    if env.hash in _servers:
        _servers.move_to_end(env.hash)
        return _servers[env.hash]
    server = build_server(env)
    _servers[env.hash] = server, server.create_initialization_options()
    if len(_servers) > MAX_SERVERS:
        _servers.popitem(last=False)
    return _servers[env.hash]


@asynccontextmanager
async def memory_session(env: EnvironmentSpec) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session on a fresh instance of `env`, served in
    this process over memory streams."""
    server, options = shared_server(env)
    async with create_client_server_memory_streams() as (client, served), anyio.create_task_group() as tg:
        tg.start_soon(server.run, *served, options)
        try:
            async with ClientSession(*client) as session:
                await session.initialize()
                yield session
        finally:
            tg.cancel_scope.cancel()


class DirectSession:
    """The two requests an episode makes of its MCP session, answered in process by what the server's handlers
    run (`listed_tools`, `_call`) on a fresh instance of the environment."""

    def __init__(self, env: EnvironmentSpec):
        self._listed, self._conn = _listed(env), _Connection(env)

    async def list_tools(self) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self._listed)

    async def call_tool(self, name: str, arguments: dict[str, Any] | None = None) -> types.CallToolResult:
        return await _call(self._conn, name, arguments)


_lists: OrderedDict[str, list[types.Tool]] = OrderedDict()


def _listed(env: EnvironmentSpec) -> list[types.Tool]:
    """`listed_tools`, made once per environment hash."""
    if env.hash not in _lists:
        _lists[env.hash] = listed_tools(env)
        if len(_lists) > MAX_SERVERS:
            _lists.popitem(last=False)
    return _lists[env.hash]


@asynccontextmanager
async def direct_session(env: EnvironmentSpec) -> AsyncIterator[DirectSession]:
    """A session on a fresh instance of `env` in this process, without the protocol: what `memory_session` would
    answer, at the cost of a function call. The instance is not closed here, as the server's is not."""
    yield DirectSession(env)


async def serve_stdio(env: EnvironmentSpec) -> None:
    server = build_server(env)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


def connection(pair_id: str, side: Side, catalog: Path | str = CATALOG) -> dict[str, Any]:
    """A langchain-mcp-adapters stdio connection that serves one episode."""
    return {
        "transport": "stdio",
        "command": sys.executable,
        "args": ["-m", "envs.mcp_server", pair_id, "--side", side, "--catalog", str(catalog)],
        "cwd": str(Path(__file__).resolve().parent.parent),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m envs.mcp_server")
    parser.add_argument("pair")
    parser.add_argument("--side", choices=["act", "abstain"], required=True)
    parser.add_argument("--catalog", default=str(CATALOG))
    args = parser.parse_args(argv)
    asyncio.run(serve_stdio(side_environment(args.pair, args.side, args.catalog)))


if __name__ == "__main__":
    main()
