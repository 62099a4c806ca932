// What both TypeScript interop clients share (client.mjs: SDK 1.x; client-v2.mjs: SDK 2.x):
// their arguments, the SDK's version, and playing a script of operations on a connected
// client. The SDK-specific parts — connecting, and telling a protocol error from the SDK's
// own — stay in each client.

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";

/// The command line (or environment) arguments: URL, TOKEN and the parsed SCRIPT_JSON.
export function args(name) {
  const arg = (i, env) => {
    const value = process.argv[2 + i] ?? process.env[env];
    if (value === undefined) {
      console.error(`usage: ${name} URL TOKEN SCRIPT_JSON (or set ${env})`);
      process.exit(2);
    }
    return value;
  };
  return [arg(0, "MCP_URL"), arg(1, "MCP_TOKEN"), JSON.parse(arg(2, "MCP_SCRIPT"))];
}

/// The version of the package whose entry point `entry` resolves to.
export function sdkVersion(entry) {
  const require = createRequire(import.meta.url);
  const main = require.resolve(entry);
  const root = main.slice(0, main.lastIndexOf("/dist/"));
  return JSON.parse(readFileSync(`${root}/package.json`, "utf8")).version;
}

/// Plays `script` on `client`; what the SDK handed back, one entry per operation. `failed(e)`
/// turns an error a call raised into `{kind, code, message}` (or rethrows it).
export async function play(client, script, failed) {
  const results = [];
  for (const op of script) {
    if (op.op === "list") {
      const listed = await client.listTools();
      results.push({ op: "list", tools: listed.tools.map((t) => t.name) });
    } else if (op.op === "call") {
      const entry = { op: "call", name: op.name };
      try {
        const result = await client.callTool({ name: op.name, arguments: op.arguments ?? {} });
        entry.isError = result.isError ?? false;
        entry.structuredContent = result.structuredContent ?? null;
      } catch (e) {
        entry.error = failed(e);
      }
      results.push(entry);
    } else {
      console.error(`unknown op ${op.op}`);
      process.exit(2);
    }
  }
  return results;
}
