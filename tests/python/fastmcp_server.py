"""A small MCP server built with the official `mcp` Python SDK (FastMCP), for Baton's tests.

Usage: fastmcp_server.py RECORD_PATH
Binds 127.0.0.1 on a free port, prints the port on the first line of stdout once it listens,
then serves Streamable HTTP at /mcp; every tool call appends its arguments to RECORD_PATH as
one JSON line. Binding here (not in the caller) leaves no window for another process to take
the port.
"""

import json
import socket
import sys

import uvicorn
from mcp.server.fastmcp import FastMCP

record_path = sys.argv[1]

server = FastMCP("orders", host="127.0.0.1", stateless_http=True)


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


listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.bind(("127.0.0.1", 0))
listener.listen(128)
print(listener.getsockname()[1], flush=True)
uvicorn.Server(uvicorn.Config(server.streamable_http_app(), log_level="warning")).run(
    sockets=[listener]
)
