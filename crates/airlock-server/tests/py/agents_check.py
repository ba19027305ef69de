#!/usr/bin/env python3
"""Checks airlock with the OpenAI Agents SDK (openai-agents), without a model.

Usage:
  agents_check.py stdio AIRLOCK_BIN     MCPServerStdio spawning `AIRLOCK_BIN mcp`
  agents_check.py http URL TOKEN        MCPServerStreamableHttp against URL (.../mcp)

A scripted Model stands in for the LLM: its first turn calls run_code the way a
strict-mode model does (every property present, optional ones null), its second turn
reads the tool output the Runner fed back and answers. So the SDK's own path runs end to
end: tool listing, strict schema conversion, the call, and the result as the model sees it.
"""
import asyncio
import json
import logging
import os
import sys

from agents import Agent, Runner, RunConfig
from agents.items import ModelResponse
from agents.mcp import MCPServerStdio, MCPServerStreamableHttp
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from airlock_cases import CASES, CLIENT_TIMEOUT_S, Report, observation_from_text


class StrictFallbackWatch(logging.Handler):
    """Records the SDK's "Error converting MCP schema to strict mode" message."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        message = record.getMessage()
        if "strict" in message.lower():
            self.messages.append(message)


class ScriptedModel(Model):
    """Calls run_code once with `arguments`, then answers with the tool output it got."""

    def __init__(self, arguments):
        self.arguments = arguments
        self.seen_tools = []
        self.tool_output = None

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema,
                           handoffs, tracing, *, previous_response_id=None, conversation_id=None,
                           prompt=None, **_):
        self.seen_tools = list(tools)
        outputs = [i for i in (input if isinstance(input, list) else [])
                   if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if not outputs:
            run_code = next(t for t in tools if t.name == "run_code")
            # What a strict-mode model sends: every property, the ones it does not use as null.
            args = {name: None for name in run_code.params_json_schema.get("properties", {})}
            args.update(self.arguments)
            call = ResponseFunctionToolCall(type="function_call", id="fc_1", call_id="call_1",
                                            name="run_code", arguments=json.dumps(args))
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        self.tool_output = outputs[-1]["output"]
        message = ResponseOutputMessage(
            type="message", id="msg_1", role="assistant", status="completed",
            content=[ResponseOutputText(type="output_text", text="done", annotations=[])])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the check runs without streaming")


def tool_output_observation(output):
    """The observation inside the tool output the Runner handed to the model."""
    if isinstance(output, list):
        return observation_from_text(output)
    value = json.loads(output)
    if isinstance(value, dict) and value.get("type") == "text":
        return json.loads(value["text"])
    if isinstance(value, list):
        return observation_from_text(value)
    return value


async def exercise(server, report):
    watch = StrictFallbackWatch()
    sdk_logger = logging.getLogger("openai.agents")
    sdk_logger.setLevel(logging.DEBUG)
    sdk_logger.addHandler(watch)
    async with server:
        for name, arguments in CASES.items():
            model = ScriptedModel(arguments)
            agent = Agent(name="coder", instructions="Run code with run_code.", model=model,
                          mcp_servers=[server], mcp_config={"convert_schemas_to_strict": True})
            try:
                result = await Runner.run(agent, f"case {name}", max_turns=3,
                                          run_config=RunConfig(tracing_disabled=True))
            except Exception as e:  # a Runner failure is a failed case, reported with the rest
                report.case(name, e)
                continue
            if name == "hello":
                tool = next((t for t in model.seen_tools if t.name == "run_code"), None)
                report.ok(tool is not None, "the Runner offers run_code to the model")
                if tool is not None:
                    report.ok(tool.strict_json_schema is True,
                              "convert_schemas_to_strict succeeded (the tool is strict)")
                    report.ok(tool.params_json_schema.get("additionalProperties") is False,
                              "the strict schema closes the arguments object")
            report.ok(result.final_output == "done", f"{name}: the Runner loop finished")
            if model.tool_output is None:
                report.ok(False, f"{name}: no tool output reached the model")
                continue
            try:
                obs = tool_output_observation(model.tool_output)
            except (ValueError, KeyError, TypeError) as e:
                report.ok(False, f"{name}: tool output is not the observation ({e}): {model.tool_output!r:.500}")
                continue
            report.case(name, obs)
    sdk_logger.removeHandler(watch)
    report.ok(not watch.messages, f"no strict-mode fallback logged ({watch.messages[:2]})")


async def main():
    mode = sys.argv[1]
    report = Report(f"openai-agents {mode}")
    if mode == "stdio":
        server = MCPServerStdio(
            params={"command": sys.argv[2], "args": ["mcp"], "env": dict(os.environ)},
            client_session_timeout_seconds=CLIENT_TIMEOUT_S, cache_tools_list=True, name="airlock")
    elif mode == "http":
        server = MCPServerStreamableHttp(
            params={"url": sys.argv[2], "headers": {"Authorization": f"Bearer {sys.argv[3]}"},
                    "timeout": 30, "sse_read_timeout": CLIENT_TIMEOUT_S},
            client_session_timeout_seconds=CLIENT_TIMEOUT_S, cache_tools_list=True, name="airlock")
    else:
        raise SystemExit(f"unknown mode {mode}")
    await exercise(server, report)
    report.finish()


if __name__ == "__main__":
    asyncio.run(main())
