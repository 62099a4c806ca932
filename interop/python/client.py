"""Interop client: drives Countersign's /mcp with the official MCP Python SDK.

Usage: client.py URL TOKEN SCRIPT_JSON   (or env MCP_URL, MCP_TOKEN, MCP_SCRIPT)
       MCP_MODE=legacy forces the initialize handshake (default: the SDK's own, "auto").
       MCP_OAUTH_ISSUER, MCP_OAUTH_CLIENT, MCP_OAUTH_SECRET: authenticate with OAuth client
       credentials instead of TOKEN (the SDK discovers the protected resource metadata and
       the authorization server, and obtains the access token itself); TOKEN is then ignored.

SCRIPT_JSON is a list of operations:
  {"op": "list"}                                  -> tools/list
  {"op": "call", "name": "...", "arguments": {}}  -> tools/call

Prints one JSON document on stdout:
  {"sdk": ..., "protocolVersion": ..., "era": "handshake"|"modern",
   "results": [{"op": "list", "tools": [...]}
               | {"op": "call", "name", "isError", "structuredContent"}
               | {"op": "call", "name", "error": {"kind", "code", "message"}}]}
The connection uses the SDK's default negotiation (mode="auto": a server/discover probe at the
SDK's newest revision, falling back to the initialize handshake), as an unmodified agent would.
"""

import asyncio
import json
import os
import sys
from importlib.metadata import version

from mcp import Client
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError


def arg(i: int, env: str) -> str:
    if len(sys.argv) > i:
        return sys.argv[i]
    value = os.environ.get(env)
    if value is None:
        sys.exit(f"usage: client.py URL TOKEN SCRIPT_JSON (or set {env})")
    return value


def error(kind: str, exc: BaseException, code=None) -> dict:
    return {"kind": kind, "code": code, "message": str(getattr(exc, "message", None) or exc)}


class MemoryStorage:
    """Token storage for one run (the SDK's storage protocol)."""

    def __init__(self):
        self.tokens = None
        self.client_info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info):
        self.client_info = client_info


async def main() -> None:
    url, token, script = arg(1, "MCP_URL"), arg(2, "MCP_TOKEN"), json.loads(arg(3, "MCP_SCRIPT"))
    issuer = os.environ.get("MCP_OAUTH_ISSUER")
    if issuer:
        auth = ClientCredentialsOAuthProvider(
            server_url=url,
            storage=MemoryStorage(),
            client_id=os.environ["MCP_OAUTH_CLIENT"],
            client_secret=os.environ["MCP_OAUTH_SECRET"],
            issuer=issuer,
        )
        http = create_mcp_http_client(auth=auth)
    else:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    out: dict = {"sdk": f"python mcp {version('mcp')}", "results": []}
    mode = os.environ.get("MCP_MODE", "auto")
    client = Client(streamable_http_client(url, http_client=http), mode=mode, raise_exceptions=True)
    async with http, client:
        session = client.session
        out["protocolVersion"] = client.protocol_version
        out["era"] = "modern" if session.discover_result is not None else "handshake"
        for op in script:
            if op["op"] == "list":
                listed = await client.list_tools()
                out["results"].append({"op": "list", "tools": [t.name for t in listed.tools]})
            elif op["op"] == "call":
                entry: dict = {"op": "call", "name": op["name"]}
                try:
                    result = await client.call_tool(op["name"], op.get("arguments", {}))
                    entry["isError"] = result.is_error
                    entry["structuredContent"] = result.structured_content
                except MCPError as e:
                    entry["error"] = error("protocol", e, e.code)
                except RuntimeError as e:  # the SDK's own checks, e.g. outputSchema validation
                    entry["error"] = error("client", e)
                out["results"].append(entry)
            else:
                sys.exit(f"unknown op {op['op']!r}")
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    asyncio.run(main())
