"""A stdio MCP server for the brain's connector tests: `wait` writes "waiting" to the file
its `marker` argument names, sleeps until cancelled and then writes "cancelled" there, so a
test can see that the call is running on the server and that the client's
`notifications/cancelled` reached it."""

from pathlib import Path

import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("cancel-probe")


@server.tool()
async def wait(marker: str, seconds: float = 60) -> str:
    """Sleeps for `seconds`; if cancelled first, writes "cancelled" to `marker`."""
    Path(marker).write_text("waiting")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        Path(marker).write_text("cancelled")
        raise
    return "done"


if __name__ == "__main__":
    anyio.run(server.run_stdio_async)
