// Interop client: drives Countersign's /mcp with the official MCP TypeScript SDK v2
// (`@modelcontextprotocol/client`), which speaks the session-less revision 2026-07-28.
//
// Usage: node client-v2.mjs URL TOKEN SCRIPT_JSON   (or env MCP_URL, MCP_TOKEN, MCP_SCRIPT)
//
// The script and the printed JSON are those of client.mjs. The client negotiates with
// `versionNegotiation: { mode: "auto" }` (a `server/discover` probe, falling back to the
// initialize handshake): the SDK's default is still the handshake, so an agent built on it
// opts in with this one option.

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { Client, ProtocolError, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

function arg(i, env) {
  const value = process.argv[2 + i] ?? process.env[env];
  if (value === undefined) {
    console.error(`usage: client-v2.mjs URL TOKEN SCRIPT_JSON (or set ${env})`);
    process.exit(2);
  }
  return value;
}

function sdkVersion() {
  const require = createRequire(import.meta.url);
  const main = require.resolve("@modelcontextprotocol/client");
  const root = main.slice(0, main.lastIndexOf("/dist/"));
  return JSON.parse(readFileSync(`${root}/package.json`, "utf8")).version;
}

const [url, token, script] = [arg(0, "MCP_URL"), arg(1, "MCP_TOKEN"), JSON.parse(arg(2, "MCP_SCRIPT"))];
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client(
  { name: "countersign-interop", version: "0" },
  { versionNegotiation: { mode: "auto" } },
);
await client.connect(transport);

const out = {
  sdk: `typescript @modelcontextprotocol/client ${sdkVersion()}`,
  protocolVersion: client.getNegotiatedProtocolVersion(),
  era: client.getProtocolEra() === "modern" ? "modern" : "handshake",
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
      if (!(e instanceof ProtocolError)) {
        // The SDK's own checks (e.g. of structuredContent against the outputSchema).
        entry.error = { kind: "client", code: e.code ?? null, message: String(e.message ?? e) };
      } else {
        entry.error = { kind: "protocol", code: e.code, message: e.message };
      }
    }
    out.results.push(entry);
  } else {
    console.error(`unknown op ${op.op}`);
    process.exit(2);
  }
}
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
