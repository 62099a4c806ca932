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

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { McpError } from "@modelcontextprotocol/sdk/types.js";

function arg(i, env) {
  const value = process.argv[2 + i] ?? process.env[env];
  if (value === undefined) {
    console.error(`usage: client.mjs URL TOKEN SCRIPT_JSON (or set ${env})`);
    process.exit(2);
  }
  return value;
}

function sdkVersion() {
  const require = createRequire(import.meta.url);
  const main = require.resolve("@modelcontextprotocol/sdk/client/index.js");
  const root = main.slice(0, main.lastIndexOf("/dist/"));
  return JSON.parse(readFileSync(`${root}/package.json`, "utf8")).version;
}

const [url, token, script] = [arg(0, "MCP_URL"), arg(1, "MCP_TOKEN"), JSON.parse(arg(2, "MCP_SCRIPT"))];
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "countersign-interop", version: "0" });
await client.connect(transport);

const out = {
  sdk: `typescript @modelcontextprotocol/sdk ${sdkVersion()}`,
  protocolVersion: transport.protocolVersion,
  era: "handshake",
  results: [],
};
for (const op of script) {
  if (op.op === "list") {
    const listed = await client.listTools();
    out.results.push({ op: "list", tools: listed.tools.map((t) => t.name) });
  } else if (op.op === "call") {
    const entry = { op: "call", name: op.name };
    try {
      const result = await client.callTool({ name: op.name, arguments: op.arguments ?? {} });
      entry.isError = result.isError ?? false;
      entry.structuredContent = result.structuredContent ?? null;
    } catch (e) {
      if (!(e instanceof McpError)) throw e;
      // The SDK raises McpError both for a JSON-RPC error from the server and for its own
      // checks of the result against the tool's outputSchema; the message tells them apart.
      const own = /structured content|output schema/i.test(e.message);
      entry.error = { kind: own ? "client" : "protocol", code: e.code, message: e.message };
    }
    out.results.push(entry);
  } else {
    console.error(`unknown op ${op.op}`);
    process.exit(2);
  }
}
await transport.terminateSession().catch(() => {});
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
