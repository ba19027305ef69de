"""Each framework's tool, run by the framework itself in a whole agent loop with a
scripted model (no model service, no network): the model asks for `run_code`, the
framework runs our tool, and the test reads what the model is handed next."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import airlock
from airlock.tools import definition, handle_call

from .conftest import Server

# Agent frameworks phone home unless told not to; CI has no network.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")

SECRET_TAIL = "JIGA9HK2gOCZPeJMQW9cy78kyEk2FINMdB8F"
PAYLOAD = bytes(range(256)) * 3


@dataclass(frozen=True)
class Scenario:
    """A `run_code` call and what the model must see back."""

    name: str
    arguments: dict[str, Any]
    check: Callable[[dict[str, Any]], None]
    out_file: bool = False


def _hello(seen: dict[str, Any]) -> None:
    assert seen["ok"] is True and seen["stdout"] == "45\n"


def _timeout(seen: dict[str, Any]) -> None:
    assert seen["ok"] is False and seen["outcome"] == "timeout"


def _flood(seen: dict[str, Any]) -> None:
    assert seen["stdout_truncated"] is True and seen["stdout_bytes"] == 2_000_001
    assert len(seen["stdout"].encode()) <= 8000


def _secret(seen: dict[str, Any]) -> None:
    assert SECRET_TAIL not in json.dumps(seen)
    assert "[REDACTED:github-pat]" in seen["stdout"] and seen["redactions"] == 1


def _refused(seen: dict[str, Any]) -> None:
    assert seen["ok"] is False and seen["outcome"] == "error"
    assert seen["error"]["kind"] == "policy_denied"


def _out_file(seen: dict[str, Any]) -> None:
    assert seen["ok"] is True, seen
    (listed,) = seen["files"]
    assert listed["path"] == "blob.bin" and listed["bytes"] == len(PAYLOAD)
    assert listed["sha256"] == hashlib.sha256(PAYLOAD).hexdigest()
    # The bytes are the host's (the artifact), not the model's context.
    assert "content_base64" not in listed


SCENARIOS = [
    Scenario("hello", {"language": "python", "code": "print(sum(range(10)))"}, _hello),
    Scenario(
        "timeout",
        {"language": "python", "code": "while True: pass", "timeout_s": 0.5, "files": None},
        _timeout,
    ),
    Scenario("flood", {"language": "python", "code": "print('x' * 2_000_000)"}, _flood),
    Scenario("secret", {"language": "python", "code": f"print('gh' + 'p_{SECRET_TAIL}')"}, _secret),
    Scenario("refused", {"language": "python", "code": "print(1)", "timeout_s": 60}, _refused),
    Scenario(
        "out_file",
        {
            "language": "python",
            "code": "import base64\nopen('/out/blob.bin', 'wb').write("
            "base64.b64decode(open('in.b64').read()))",
            "files": [{"path": "in.b64", "content": base64.b64encode(PAYLOAD).decode()}],
        },
        _out_file,
        out_file=True,
    ),
]
IDS = [s.name for s in SCENARIOS]


def _check_artifact_bytes(obs: Any) -> None:
    assert isinstance(obs, airlock.Observation)
    assert obs.file("blob.bin").read() == PAYLOAD


@pytest.fixture
def remote_or_local(mode: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    if mode == "local":
        return {}
    srv: Server = request.getfixturevalue("server")
    return {"url": srv.url, "token": srv.token}


# ---- LangChain / LangGraph ----


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_langgraph_react_agent(scenario: Scenario, remote_or_local: dict[str, Any]) -> None:
    pytest.importorskip("langgraph", reason="the langgraph extra is not installed")
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.prebuilt import create_react_agent

    from airlock.langchain import RunCodeTool

    class ScriptedChatModel(GenericFakeChatModel):
        """Asks for one run_code call, then answers."""

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    client = airlock.Client(**remote_or_local)
    tool = RunCodeTool(client=client)
    call = {"name": "run_code", "args": scenario.arguments, "id": "call-1"}
    model = ScriptedChatModel(
        messages=iter([AIMessage(content="", tool_calls=[call]), AIMessage(content="done")])
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent is deprecated in favour of langchain's
        agent = create_react_agent(model, [tool])
    state = agent.invoke({"messages": [HumanMessage("compute")]})
    (message,) = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert message.tool_call_id == "call-1"
    scenario.check(json.loads(str(message.content)))
    # The artifact is the typed observation, for failed runs too.
    assert isinstance(message.artifact, airlock.Observation)
    assert message.artifact.to_json() == message.content
    if scenario.out_file:
        _check_artifact_bytes(message.artifact)


def test_langchain_tool_takes_the_servers_definition() -> None:
    pytest.importorskip("langchain_core", reason="the langchain extra is not installed")
    from airlock.tools.langchain import RunCodeTool

    tool = RunCodeTool()
    definition_ = airlock.Client().tool()
    assert (tool.name, tool.description) == (definition_.name, definition_.description)
    assert tool.args_schema == definition_.parameters
    from langchain_core.utils.function_calling import convert_to_openai_tool

    bound = convert_to_openai_tool(tool)["function"]
    assert bound["name"] == "run_code"
    assert set(bound["parameters"]["properties"]) == set(definition_.parameters["properties"])


def test_langchain_tool_async(remote_or_local: dict[str, Any]) -> None:
    pytest.importorskip("langchain_core", reason="the langchain extra is not installed")
    from langchain_core.messages import ToolMessage

    from airlock.tools.langchain import RunCodeTool

    tool = RunCodeTool(
        client=airlock.Client(**remote_or_local),
        async_client=airlock.AsyncClient(**remote_or_local),
    )
    call = {"name": "run_code", "args": SCENARIOS[0].arguments, "id": "c", "type": "tool_call"}
    message = asyncio.run(tool.ainvoke(call))
    assert isinstance(message, ToolMessage)
    _hello(json.loads(str(message.content)))


# ---- OpenAI Agents SDK ----


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_openai_agents_runner(scenario: Scenario, remote_or_local: dict[str, Any]) -> None:
    pytest.importorskip("agents", reason="the openai-agents extra is not installed")
    from agents import Agent, ModelResponse, RunConfig, Runner, Usage
    from agents.models.interface import Model
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    from airlock.tools.openai_agents import run_code_tool

    class ScriptedModel(Model):
        """Calls run_code once, then answers; keeps what it was handed."""

        def __init__(self) -> None:
            self.turn = 0
            self.tool_outputs: list[Any] = []
            self.tools: list[Any] = []

        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> Any:
            self.turn += 1
            self.tools = args[2] if len(args) > 2 else kwargs.get("tools", [])
            if self.turn == 1:
                output: list[Any] = [
                    ResponseFunctionToolCall(
                        type="function_call",
                        id="fc-1",
                        call_id="call-1",
                        name="run_code",
                        arguments=json.dumps(scenario.arguments),
                        status="completed",
                    )
                ]
            else:
                self.tool_outputs = [
                    item
                    for item in input
                    if isinstance(item, dict) and item.get("type") == "function_call_output"
                ]
                output = [
                    ResponseOutputMessage(
                        id="msg-1",
                        type="message",
                        role="assistant",
                        status="completed",
                        content=[
                            ResponseOutputText(type="output_text", text="done", annotations=[])
                        ],
                    )
                ]
            return ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    model = ScriptedModel()
    async_client = airlock.AsyncClient(**remote_or_local)
    tool = run_code_tool(async_client)
    assert tool.strict_json_schema is True
    agent = Agent(name="coder", instructions="Run code.", tools=[tool], model=model)
    result = asyncio.run(
        Runner.run(agent, "compute", run_config=RunConfig(tracing_disabled=True), max_turns=3)
    )
    assert result.final_output == "done"
    (item,) = model.tool_outputs
    assert item["call_id"] == "call-1"
    scenario.check(json.loads(item["output"]))


def test_openai_agents_schema_is_strict() -> None:
    pytest.importorskip("agents", reason="the openai-agents extra is not installed")
    from airlock.tools.openai_agents import run_code_tool

    schema = run_code_tool().params_json_schema
    assert schema["additionalProperties"] is False
    assert sorted(schema["required"]) == sorted(schema["properties"])


# ---- CrewAI ----


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_crewai_crew(scenario: Scenario, remote_or_local: dict[str, Any]) -> None:
    pytest.importorskip("crewai", reason="the crewai extra is not installed")
    from crewai import Agent, Crew, Task
    from crewai.llms.base_llm import BaseLLM

    from airlock.tools.crewai import RunCodeTool

    seen: list[str] = []

    class ScriptedLLM(BaseLLM):
        """A ReAct-text model: one run_code action, then the final answer."""

        def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
            if not seen:
                seen.append("asked")
                return (
                    "Thought: I will run the program.\n"
                    "Action: run_code\n"
                    f"Action Input: {json.dumps(scenario.arguments)}"
                )
            if isinstance(messages, str):
                seen.append(messages)
            else:
                seen.append("\n".join(str(m.get("content", "")) for m in messages))
            return "Thought: I have the result.\nFinal Answer: done"

    client = airlock.Client(**remote_or_local)
    tool = RunCodeTool(client=client)
    agent = Agent(
        role="coder",
        goal="run code",
        backstory="runs code",
        tools=[tool],
        llm=ScriptedLLM(model="scripted"),
        allow_delegation=False,
        max_iter=3,
    )
    task = Task(description="compute", expected_output="the result", agent=agent)
    output = Crew(agents=[agent], tasks=[task]).kickoff()
    assert str(output) == "done"
    assert len(seen) == 2, seen
    # The tool's JSON is in the transcript CrewAI hands the model next.
    start = seen[1].rfind('{"job_id"')
    assert start >= 0, seen[1][-2000:]
    observed, _ = json.JSONDecoder().raw_decode(seen[1][start:])
    scenario.check(observed)


# ---- custom hosts ----


def test_plain_definition_and_dispatcher(remote_or_local: dict[str, Any]) -> None:
    client = airlock.Client(**remote_or_local)
    chat = definition(client, format="chat")
    responses = definition(client, format="responses")
    assert chat["type"] == "function" and chat["function"]["name"] == "run_code"
    assert responses["name"] == "run_code"
    assert responses["parameters"] == chat["function"]["parameters"]
    arguments = json.dumps({"language": "python", "code": "print(sum(range(10)))"})
    _hello(json.loads(handle_call(arguments, client)))
    # Bad arguments from a model are an observation it can learn from, not a crash.
    bad = json.loads(handle_call('{"code": 1}', client))
    assert bad["ok"] is False and bad["error"]["kind"] == "invalid_input"
    extra = json.loads(handle_call('{"code": "", "network": "on"}', client))
    assert extra["error"]["kind"] == "invalid_input" and "network" in extra["error"]["message"]
    nulls = {"language": None, "code": "print(45)", "files": None, "timeout_s": None}
    assert json.loads(handle_call(nulls, client))["stdout"] == "45\n"
    nulls["return_files"] = None
    assert json.loads(handle_call(nulls, client))["stdout"] == "45\n"
    # A file whose content was lost on the way is refused, never made empty.
    lost = {"code": "", "files": [{"path": "a.txt", "content": None, "content_base64": None}]}
    refused = json.loads(handle_call(lost, client))
    assert refused["error"]["kind"] == "invalid_input" and "files[0]" in refused["error"]["message"]
