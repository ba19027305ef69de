#!/usr/bin/env python3
"""Checks airlock's MCP tool server with the official `mcp` client package (PyPI).

Usage:
  mcp_check.py stdio AIRLOCK_BIN        spawns `AIRLOCK_BIN mcp` and talks over stdio
  mcp_check.py http URL TOKEN           talks streamable HTTP to URL (e.g. .../mcp)

Lists the tools, checks run_code's schema and description, calls it with a program that
succeeds, one that fails, and one that is refused; exits non-zero on any mismatch.
"""
import asyncio
import json
import os
import sys

from mcp import ClientSession

TIMEOUT = 60.0


def field(obj, snake, camel):
    """A field of an mcp type, whichever naming this version of the package uses."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


def check(condition, what):
    if not condition:
        raise SystemExit(f"FAIL: {what}")
    print(f"ok: {what}")


def observation(result):
    text = "".join(c.text for c in result.content if getattr(c, "type", "") == "text")
    obs = json.loads(text)
    structured = field(result, "structured_content", "structuredContent")
    if structured is not None:
        check(structured == obs, "structuredContent equals the text content")
    return obs


async def exercise(session: ClientSession, transport: str):
    await session.initialize()
    tools = (await session.list_tools()).tools
    check([t.name for t in tools] == ["run_code"], f"{transport}: one tool, run_code")
    tool = tools[0]
    schema = field(tool, "input_schema", "inputSchema")
    check(schema["required"] == ["code"], f"{transport}: only code required")
    check("python" in schema["properties"]["language"]["enum"], f"{transport}: python is a language")
    check("network is off" in tool.description, f"{transport}: description says the network is off")
    check("wall time" in tool.description, f"{transport}: description gives the limits")

    ok = await session.call_tool(
        "run_code",
        {"language": "python", "code": "import sys\nprint(sum(range(10)))\nprint(open('in.txt').read(), file=sys.stderr)",
         "files": [{"path": "in.txt", "content": "from a file"}], "timeout_s": 3},
        read_timeout_seconds=TIMEOUT,
    )
    obs = observation(ok)
    check(field(ok, "is_error", "isError") is False, f"{transport}: a job that exits 0 is not an error")
    check(obs["ok"] is True and obs["stdout"] == "45\n", f"{transport}: stdout is the program's ({obs['stdout']!r})")
    check(obs["stderr"] == "from a file\n", f"{transport}: input files reach the program")
    check(obs["backend"] == "native" and obs["job_id"], f"{transport}: observation fields")

    failed = await session.call_tool("run_code", {"language": "python", "code": "raise SystemExit(3)"},
                                     read_timeout_seconds=TIMEOUT)
    obs = observation(failed)
    check(field(failed, "is_error", "isError") is True, f"{transport}: a job that exits 3 is an error")
    check(obs["outcome"] == "exited" and obs["exit_code"] == 3, f"{transport}: exit code 3")

    refused = await session.call_tool("run_code", {"language": "cobol", "code": "x"},
                                      read_timeout_seconds=TIMEOUT)
    obs = observation(refused)
    check(field(refused, "is_error", "isError") is True, f"{transport}: an unknown language is an error")
    check(obs["outcome"] == "error" and obs["error"]["kind"] == "invalid_input", f"{transport}: invalid_input")

    extra = await session.call_tool("run_code", {"language": "python", "code": "1", "network": "on"},
                                    read_timeout_seconds=TIMEOUT)
    check(field(extra, "is_error", "isError") is True, f"{transport}: unknown arguments are refused")


async def main():
    mode = sys.argv[1]
    if mode == "stdio":
        from mcp.client.stdio import StdioServerParameters, stdio_client
        # The client's default environment is a minimal one; pass ours on (AIRLOCK_STATE_DIR).
        params = StdioServerParameters(command=sys.argv[2], args=["mcp"], env=dict(os.environ))
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await exercise(session, "stdio")
    elif mode == "http":
        import mcp.client.streamable_http as http
        url, token = sys.argv[2], sys.argv[3]
        headers = {"Authorization": f"Bearer {token}"}
        if hasattr(http, "streamable_http_client"):
            transport = http.streamable_http_client(url, http_client=http.create_mcp_http_client(headers=headers))
        else:
            transport = http.streamablehttp_client(url, headers=headers)
        async with transport as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await exercise(session, "http")
        # A wrong token is refused before MCP starts.
        import urllib.error
        import urllib.request
        request = urllib.request.Request(url, data=b"{}", method="POST",
                                         headers={"Authorization": "Bearer alk_wrong", "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=10)
            check(False, "http: a wrong token is refused")
        except urllib.error.HTTPError as e:
            check(e.code == 401, f"http: a wrong token is refused ({e.code})")
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"PASS: MCP over {mode}")


if __name__ == "__main__":
    asyncio.run(main())
