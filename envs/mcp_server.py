"""Serve one environment instance over MCP (stdio).

The server exposes the environment's public tools and nothing else: no
resources, no prompts, no server instructions, a neutral server name. The
pair's acceptance rules, mutation, label and certification stay inside this
process; each process is one episode with its own fresh state.

    python -m envs.mcp_server PAIR --side act|abstain [--catalog DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from pathlib import Path
from typing import Any

import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from envs.catalog import CATALOG, load_entry, side_env
from envs.runtime import EnvInstance
from state.records import EnvironmentSpec, Side

SERVER_NAME = "environment"


def side_environment(pair_id: str, side: Side, catalog: Path | str = CATALOG) -> EnvironmentSpec:
    """The feasible (`act`) or mutated (`abstain`) environment of a pair."""
    return side_env(load_entry(pair_id, catalog), side)


def build_server(env: EnvironmentSpec) -> Server:
    instance = EnvInstance(env)
    lock = threading.Lock()
    server: Server = Server(SERVER_NAME)

    @server.list_tools()
    async def list_tools() -> list[types.Tool]:
        return [
            types.Tool(
                name=t.name,
                description=t.description,
                inputSchema=t.input_schema,
                annotations=types.ToolAnnotations(readOnlyHint=t.read_only),
            )
            for t in instance.public_tools
        ]

    def run(name: str, arguments: dict[str, Any]):
        with lock:
            return instance.call(name, arguments)

    @server.call_tool(validate_input=False)
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        obs = await asyncio.to_thread(run, name, arguments or {})
        return types.CallToolResult(content=[types.TextContent(type="text", text=obs.text)], isError=not obs.ok)

    return server


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
