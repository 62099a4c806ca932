// Interop client: drives Countersign's /mcp with the official MCP TypeScript SDK.
//
// Usage: node client.mjs URL TOKEN SCRIPT_JSON   (or env MCP_URL, MCP_TOKEN, MCP_SCRIPT)
//
// SCRIPT_JSON is a list of operations:
//   {"op": "list"}                                  -> tools/list
//   {"op": "call", "name": "...", "arguments": {}}  -> tools/call
//
// Prints one JSON document on stdout:
//   {"sdk", "protocolVersion", "era": "handshake",
//    "results": [{"op": "list", "tools": [...]}
//                | {"op": "call", "name", "isError", "structuredContent"}
//                | {"op": "call", "name", "error": {"kind", "code", "message"}}]}
// The connection uses the SDK's defaults (initialize at its newest revision), as an
// unmodified agent would.

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";
import { args, play, sdkVersion } from "./script.mjs";

const [url, token, script] = args("client.mjs");
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "countersign-interop", version: "0" });
await client.connect(transport);

const out = {
  sdk: `typescript @modelcontextprotocol/sdk ${sdkVersion("@modelcontextprotocol/sdk/client/index.js")}`,
  protocolVersion: transport.protocolVersion,
  era: "handshake",
  results: await play(client, script, (e) => {
    if (!(e instanceof McpError)) throw e;
    // The SDK raises McpError both for a JSON-RPC error from the server and for its own
    // checks of the result against the tool's outputSchema; the message tells them apart.
    const own = /structured content|output schema/i.test(e.message);
    return { kind: own ? "client" : "protocol", code: e.code, message: e.message };
  }),
};
await transport.terminateSession().catch(() => {});
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
