"""The official Python MCP client against the brain's own MCP server (`POST /mcp`, P2),
for brain/tests/all/mcp_server.rs. Prints one JSON object on stdout.

    python ask_client.py URL BEARER list
    python ask_client.py URL BEARER call TOOL ARGUMENTS_JSON
    python ask_client.py URL BEARER cancel TOOL ARGUMENTS_JSON

`call` asks for progress and prints the result with the progress messages seen; `cancel`
abandons the call once the first progress arrives (the SDK sends
`notifications/cancelled`) and prints the progress seen. Any failure prints
`{"error": "..."}`.
"""

import json
import sys

import anyio
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def run(url: str, bearer: str, action: str, rest: list[str]) -> dict:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {bearer}"})
    async with http, streamable_http_client(url, http_client=http) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            out: dict = {
                "protocol_version": init.protocol_version,
                "server": init.server_info.name,
            }
            if action == "list":
                tools = await session.list_tools()
                out["tools"] = [
                    {"name": t.name, "description": t.description, "input_schema": t.input_schema}
                    for t in tools.tools
                ]
                return out
            tool, arguments = rest[0], json.loads(rest[1])
            progress: list[str] = []
            first = anyio.Event()

            async def on_progress(value, total, message):
                progress.append(message or "")
                first.set()

            if action == "call":
                result = await session.call_tool(tool, arguments, progress_callback=on_progress)
                out.update(
                    is_error=result.is_error,
                    text="".join(c.text for c in result.content if c.type == "text"),
                    structured=result.structured_content,
                    progress=progress,
                )
                return out
            if action == "cancel":
                async with anyio.create_task_group() as group:

                    async def call():
                        out["result"] = (
                            await session.call_tool(tool, arguments, progress_callback=on_progress)
                        ).structured_content

                    group.start_soon(call)
                    with anyio.fail_after(30):
                        await first.wait()
                    group.cancel_scope.cancel()
                out["progress"] = progress
                # Let the courtesy notifications/cancelled leave before the session closes.
                await anyio.sleep(0.5)
                return out
            raise SystemExit(f"unknown action {action}")


def main() -> None:
    url, bearer, action, *rest = sys.argv[1:]
    try:
        out = anyio.run(run, url, bearer, action, rest)
    except BaseException as e:  # noqa: BLE001 - the test reads what failed
        out = {"error": f"{type(e).__name__}: {e}"}
        if isinstance(e, BaseExceptionGroup):
            out["error"] += " | " + " | ".join(repr(x) for x in e.exceptions)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
