"""An MCP server for the brain's connector credential tests, on the Python SDK.

`python credential_probe.py stdio`: `env_sha256(name)` answers the SHA-256 of an
environment variable (or "unset"), so a test sees that a secret reached the child without
the value passing through the tool's output.

`python credential_probe.py http PORT`: streamable HTTP on 127.0.0.1:PORT at /mcp, refusing
every request whose Authorization header is not exactly $EXPECTED_AUTHORIZATION with 401 (as
a server guarding its tools with a static token does); `whoami` answers the X-Team header,
and `echo_request` quotes the request's Authorization and X-Team headers back (as a server
that echoes requests, or quotes them in an error, does).
"""

import hashlib
import os
import sys

import uvicorn
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("credential-probe")


@server.tool()
def env_sha256(name: str) -> str:
    """The SHA-256 of environment variable `name`, or "unset"."""
    value = os.environ.get(name)
    return "unset" if value is None else hashlib.sha256(value.encode()).hexdigest()


@server.tool()
async def whoami(ctx: Context) -> str:
    """The X-Team header of the request."""
    headers = ctx.headers or {}
    return f"team={headers.get('x-team', '')}"


@server.tool()
async def echo_request(ctx: Context) -> str:
    """The Authorization and X-Team headers of the request, quoted."""
    headers = ctx.headers or {}
    return (
        f"authorization={headers.get('authorization', '')} "
        f"team={headers.get('x-team', '')}"
    )


class RequireAuthorization:
    """ASGI middleware: only requests carrying the expected Authorization header pass."""

    def __init__(self, app, expected: str):
        self.app = app
        self.expected = expected.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization")
            if given != self.expected:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [(b"www-authenticate", b'Bearer realm="probe"')],
                    }
                )
                await send({"type": "http.response.body", "body": b""})
                return
        await self.app(scope, receive, send)


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        app = RequireAuthorization(
            server.streamable_http_app(), os.environ["EXPECTED_AUTHORIZATION"]
        )
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
