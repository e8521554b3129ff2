"""Drives Baton's own MCP server with the official `mcp` Python SDK client.

Usage: mcp_client.py URL API_KEY FLOW. Lists the tools and flows, runs FLOW, reads the run
back and tries to cancel it (finished by then). Prints one JSON object with what it saw.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


async def main(url: str, key: str, flow: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    async with streamablehttp_client(url, headers=headers) as (read, write, _):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            tools = await session.list_tools()
            flows = await session.call_tool("list_flows", {})
            run = await session.call_tool(
                "run_flow", {"flowId": flow, "parameters": {"name": "Py"}}
            )
            run_id = run.structuredContent["id"]
            record = None
            for _ in range(100):
                got = await session.call_tool("get_run", {"runId": run_id})
                if not got.isError and got.structuredContent.get("completedAt"):
                    record = got.structuredContent
                    break
                await asyncio.sleep(0.05)
            cancel = await session.call_tool("cancel_run", {"runId": run_id})
            print(
                json.dumps(
                    {
                        "server": init.serverInfo.name,
                        "tools": sorted(t.name for t in tools.tools),
                        "flows": flows.structuredContent,
                        "run": run.structuredContent,
                        "runIsError": run.isError,
                        "record": record,
                        "cancelIsError": cancel.isError,
                        "cancel": cancel.structuredContent,
                    }
                )
            )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
