#!/usr/bin/env python3
"""Checks airlock with LangGraph through langchain-mcp-adapters, without a model.

Usage:
  langgraph_check.py stdio AIRLOCK_BIN     tools from `AIRLOCK_BIN mcp` (stdio transport)
  langgraph_check.py http URL TOKEN        tools from URL (.../mcp, streamable_http transport)

Loads run_code with MultiServerMCPClient (each server block in the adapter's own format,
with its `transport` key), runs every case through a LangGraph ToolNode, checks that a
failed run still hands its observation to the ToolMessage (status "error"), and runs one
create_react_agent loop whose fake chat model emits the tool call.
"""
import asyncio
import os
import sys
import warnings

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from airlock_cases import CASES, Report, expected_tools, observation_from_text


class ScriptedChatModel(GenericFakeChatModel):
    """A fake chat model that accepts tools, as create_react_agent needs."""

    def bind_tools(self, tools, **kwargs):
        return self


def tool_call_message(arguments, call_id):
    return AIMessage(content="", tool_calls=[{"name": "run_code", "args": arguments, "id": call_id, "type": "tool_call"}])


async def exercise(connection, report, transport):
    client = MultiServerMCPClient({"airlock": connection})
    tools = await client.get_tools()
    want = expected_tools(transport)
    report.ok([t.name for t in tools] == want, f"the adapter loads {want} ({[t.name for t in tools]})")
    run_code = next(t for t in tools if t.name == "run_code")
    # A ToolNode runs inside a graph (it reads its runtime from the graph's config).
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode([run_code]))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    node = graph.compile()

    async def call(arguments, call_id):
        out = await node.ainvoke({"messages": [tool_call_message(arguments, call_id)]})
        messages = [m for m in out["messages"] if isinstance(m, ToolMessage)]
        if len(messages) != 1:
            raise AssertionError(f"expected one ToolMessage, got {out!r:.500}")
        return messages[0]

    for i, (name, arguments) in enumerate(CASES.items()):
        try:
            message = await call(arguments, f"call_{i}")
            report.case(name, observation_from_text(message.content))
        except Exception as e:
            report.case(name, e)

    try:
        message = await call({"code": "import sys\nprint('partial')\nsys.exit(3)"}, "call_failed")
        report.ok(message.status == "error", f"a failed run's ToolMessage has status error ({message.status})")
        obs = observation_from_text(message.content)
        report.ok(obs.get("outcome") == "exited" and obs.get("exit_code") == 3 and obs.get("stdout") == "partial\n",
                  "a failed run's observation (exit code 3, its stdout) reaches the ToolMessage")
    except Exception as e:
        report.ok(False, f"failed run: {type(e).__name__}: {e}")

    # The whole ReAct loop: model -> tools -> model, with a fake model emitting the call.
    from langgraph.prebuilt import create_react_agent
    model = ScriptedChatModel(messages=iter([tool_call_message(CASES["hello"], "call_agent"), AIMessage(content="done")]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notice in LangGraph 1.x (still supported)
        agent = create_react_agent(model, [run_code])
    try:
        state = await agent.ainvoke({"messages": [HumanMessage(content="say hello")]})
        tool_messages = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        report.ok(len(tool_messages) == 1 and state["messages"][-1].content == "done",
                  "create_react_agent runs the tool and finishes")
        if tool_messages:
            report.case("hello (create_react_agent)", observation_from_text(tool_messages[0].content))
    except Exception as e:
        report.ok(False, f"create_react_agent: {type(e).__name__}: {e}")


async def main():
    mode = sys.argv[1]
    report = Report(f"langgraph {mode}")
    if mode == "stdio":
        connection = {"transport": "stdio", "command": sys.argv[2], "args": ["mcp"], "env": dict(os.environ)}
    elif mode == "http":
        connection = {"transport": "streamable_http", "url": sys.argv[2],
                      "headers": {"Authorization": f"Bearer {sys.argv[3]}"}}
    else:
        raise SystemExit(f"unknown mode {mode}")
    await exercise(connection, report, mode)
    report.finish()


if __name__ == "__main__":
    asyncio.run(main())
