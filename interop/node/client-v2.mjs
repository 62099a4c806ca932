// Interop client: drives Countersign's /mcp with the official MCP TypeScript SDK v2
// (`@modelcontextprotocol/client`), which speaks the session-less revision 2026-07-28.
//
// Usage: node client-v2.mjs URL TOKEN SCRIPT_JSON   (or env MCP_URL, MCP_TOKEN, MCP_SCRIPT)
//
// The script and the printed JSON are those of client.mjs. The client negotiates with
// `versionNegotiation: { mode: "auto" }` (a `server/discover` probe, falling back to the
// initialize handshake): the SDK's default is still the handshake, so an agent built on it
// opts in with this one option.

import { Client, ProtocolError, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import { args, play, sdkVersion } from "./script.mjs";

const [url, token, script] = args("client-v2.mjs");
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client(
  { name: "countersign-interop", version: "0" },
  { versionNegotiation: { mode: "auto" } },
);
await client.connect(transport);

const out = {
  sdk: `typescript @modelcontextprotocol/client ${sdkVersion("@modelcontextprotocol/client")}`,
  protocolVersion: client.getNegotiatedProtocolVersion(),
  era: client.getProtocolEra() === "modern" ? "modern" : "handshake",
  results: await play(client, script, (e) =>
    e instanceof ProtocolError
      ? { kind: "protocol", code: e.code, message: e.message }
      : // The SDK's own checks (e.g. of structuredContent against the outputSchema).
        { kind: "client", code: e.code ?? null, message: String(e.message ?? e) },
  ),
};
await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
