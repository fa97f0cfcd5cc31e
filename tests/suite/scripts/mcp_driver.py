"""Drives codecage's MCP server with the official MCP Python SDK client, for the tests.

Usage: mcp_driver.py PLAN.json

The plan: {"transport": {"stdio": [argv...]} or {"http": URL, "token": TOKEN or null},
"steps": [...]}. Each step is one of
  {"list_tools": true}
  {"tool": NAME, "args": {...}, "progress": bool, "cancel_after": SECONDS}
  {"read_resource": URI}
  {"timed": {"tool": NAME, "args": {...}}, "times": N}   (round trips, in ms)
  {"repeat": {"tool": NAME, "args": {...}}, "until": TEXT, "every": SECONDS, "max": N}
      (the call again every SECONDS until its text holds TEXT, at most N times:
      {"results": [...]})
Prints one JSON object per step on stdout, in order. A step that raises prints
{"exception": "..."} and the plan goes on.
"""

import asyncio
import json
import sys
import time

import anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def dump(value):
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return value


async def run_steps(session, steps):
    await session.initialize()
    for step in steps:
        try:
            if step.get("list_tools"):
                tools = await session.list_tools()
                print(json.dumps(dump(tools)), flush=True)
            elif "read_resource" in step:
                result = await session.read_resource(step["read_resource"])
                print(json.dumps(dump(result)), flush=True)
            elif "repeat" in step:
                call = step["repeat"]
                results = []
                for _ in range(step.get("max", 50)):
                    await anyio.sleep(step.get("every", 1.0))
                    result = dump(await session.call_tool(call["tool"], call.get("args", {})))
                    results.append(result)
                    text = "".join(b.get("text", "") for b in result.get("content", []))
                    if step["until"] in text:
                        break
                print(json.dumps({"results": results}), flush=True)
            elif "timed" in step:
                call = step["timed"]
                times = []
                for _ in range(step.get("times", 50)):
                    start = time.perf_counter()
                    result = await session.call_tool(call["tool"], call.get("args", {}))
                    times.append((time.perf_counter() - start) * 1000)
                    if getattr(result, "is_error", False):
                        raise RuntimeError(f"a timed call failed: {dump(result)}")
                print(json.dumps({"times_ms": times}), flush=True)
            else:
                progress = []

                async def on_progress(value, total, message):
                    progress.append({"progress": value, "message": message})

                kwargs = {}
                if step.get("progress"):
                    kwargs["progress_callback"] = on_progress
                cancel_after = step.get("cancel_after")
                if cancel_after is not None:
                    result = None
                    with anyio.move_on_after(cancel_after):
                        result = await session.call_tool(step["tool"], step.get("args", {}), **kwargs)
                    out = {"cancelled": result is None}
                    if result is not None:
                        out.update(dump(result))
                else:
                    result = await session.call_tool(step["tool"], step.get("args", {}), **kwargs)
                    out = dump(result)
                out["progress"] = progress
                print(json.dumps(out), flush=True)
        except Exception as e:  # noqa: BLE001 - the test reads it
            print(json.dumps({"exception": f"{type(e).__name__}: {e}"}), flush=True)


async def main():
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    transport = plan["transport"]
    if "stdio" in transport:
        argv = transport["stdio"]
        params = StdioServerParameters(command=argv[0], args=argv[1:], env=transport.get("env"))
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await run_steps(session, plan["steps"])
    else:
        headers = {}
        if transport.get("token"):
            headers["Authorization"] = f"Bearer {transport['token']}"
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(transport["http"], http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    await run_steps(session, plan["steps"])


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except BaseException as e:  # noqa: BLE001 - a refused connection is a result too
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        print(json.dumps({"exception": f"{type(e).__name__}: {e}"}), flush=True)
