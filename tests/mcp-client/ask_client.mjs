// The official TypeScript MCP client against the brain's own MCP server (`POST /mcp`,
// P2), for brain/tests/all/mcp_server.rs. Prints one JSON object on stdout.
//
//   node ask_client.mjs URL BEARER list
//   node ask_client.mjs URL BEARER call TOOL ARGUMENTS_JSON
//
// `call` asks for progress and prints the result with the progress messages seen. Any
// failure prints {"error": "..."}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, bearer, action, tool, args] = process.argv.slice(2);

async function run() {
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${bearer}` } },
  });
  const client = new Client({ name: "agent-runtime-test", version: "1.0.0" });
  await client.connect(transport);
  const out = {
    protocol_version: transport.protocolVersion,
    server: client.getServerVersion()?.name,
    session: transport.sessionId !== undefined,
  };
  try {
    if (action === "list") {
      const { tools } = await client.listTools();
      out.tools = tools.map((t) => ({ name: t.name, input_schema: t.inputSchema }));
    } else if (action === "call") {
      const progress = [];
      const result = await client.callTool(
        { name: tool, arguments: JSON.parse(args) },
        undefined,
        { onprogress: (p) => progress.push(p.message ?? "") },
      );
      out.is_error = result.isError ?? false;
      out.text = result.content.filter((c) => c.type === "text").map((c) => c.text).join("");
      out.structured = result.structuredContent;
      out.progress = progress;
    } else {
      throw new Error(`unknown action ${action}`);
    }
  } finally {
    // DELETE /mcp: the session ends on the server too.
    await transport.terminateSession();
    out.terminated = transport.sessionId === undefined;
    await client.close();
  }
  return out;
}

run().then(
  (out) => console.log(JSON.stringify(out)),
  (e) => console.log(JSON.stringify({ error: `${e?.name}: ${e?.message}` })),
);
