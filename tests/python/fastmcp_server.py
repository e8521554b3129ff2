"""A small MCP server built with the official `mcp` Python SDK (FastMCP), for Baton's tests.

Usage: fastmcp_server.py PORT RECORD_PATH
Serves Streamable HTTP on 127.0.0.1:PORT/mcp; every tool call appends its arguments to
RECORD_PATH as one JSON line.
"""

import json
import sys

from mcp.server.fastmcp import FastMCP

port = int(sys.argv[1])
record_path = sys.argv[2]

server = FastMCP("orders", host="127.0.0.1", port=port, stateless_http=True)


def record(name: str, arguments: dict) -> None:
    with open(record_path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"tool": name, "arguments": arguments}) + "\n")


@server.tool()
def lookup_order(order_id: str, quantity: int) -> str:
    """Looks up an order and says whether it shipped."""
    record("lookup_order", {"order_id": order_id, "quantity": quantity})
    return f"order {order_id} x{quantity}: shipped"


@server.tool()
def list_regions() -> list[str]:
    """The regions orders ship to."""
    record("list_regions", {})
    return ["eu", "us"]


server.run(transport="streamable-http")
