#!/usr/bin/env python3
"""Checks airlock with CrewAI's MCP adapter (crewai-tools[mcp], MCPServerAdapter), without a model.

Usage:
  crewai_check.py stdio AIRLOCK_BIN     MCPServerAdapter(StdioServerParameters(AIRLOCK_BIN mcp))
  crewai_check.py http URL TOKEN        MCPServerAdapter({"url": URL, "transport": "streamable-http"})

Calls run_code the way CrewAI's ToolUsage does: the structured tool's invoke(input=...),
which validates the arguments through the adapter's pydantic model (built from the MCP
inputSchema) and so sends every optional argument the caller left out as null. The
arguments are what a model following that schema sends (model_arguments).
"""
import os
import sys

from crewai_tools import MCPServerAdapter
from mcp import StdioServerParameters

from airlock_cases import CASES, Report, expected_tools, observation_from_text


def model_arguments(schema, arguments):
    """What a model following the tool's schema sends: the case's arguments, plus null for
    every property the schema marks required that the case leaves out (a strict schema
    requires them all, optional ones nullable)."""
    sent = {name: None for name in schema.get("required", []) if name not in arguments}
    sent.update(arguments)
    return sent


def exercise(tools, report, transport):
    want = expected_tools(transport)
    report.ok([t.name for t in tools] == want, f"the adapter loads {want} ({[t.name for t in tools]})")
    tool = next(t for t in tools if t.name == "run_code")
    structured = tool.to_structured_tool()
    schema = tool.args_schema.model_json_schema()
    # A model's smallest call (code, and null for whatever else the schema requires) must
    # get through CrewAI's own validation, which then sends every other optional argument
    # as null.
    try:
        smallest = model_arguments(schema, {"code": "1"})
        dumped = tool.args_schema.model_validate(smallest).model_dump()
        report.ok(all(dumped[k] is None for k in dumped if k != "code"),
                  f"CrewAI accepts code alone (the rest null: {sorted(smallest)}) and sends the optional arguments as null ({dumped})")
    except Exception as e:
        report.ok(False, f"CrewAI's argument model refuses a call with only code: {str(e).splitlines()[:3]}")
    for name, arguments in CASES.items():
        try:
            text = structured.invoke(input=model_arguments(schema, dict(arguments)))
            report.case(name, observation_from_text(text))
        except Exception as e:
            report.case(name, e)


def main():
    mode = sys.argv[1]
    report = Report(f"crewai {mode}")
    if mode == "stdio":
        params = StdioServerParameters(command=sys.argv[2], args=["mcp"], env=dict(os.environ))
    elif mode == "http":
        params = {"url": sys.argv[2], "transport": "streamable-http",
                  "headers": {"Authorization": f"Bearer {sys.argv[3]}"}}
    else:
        raise SystemExit(f"unknown mode {mode}")
    with MCPServerAdapter(params, connect_timeout=60) as tools:
        exercise(tools, report, mode)
    report.finish()


if __name__ == "__main__":
    main()
