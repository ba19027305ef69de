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
from pathlib import Path
from typing import Any

import pytest

import airlock
from airlock.tools import ARGUMENT_NAMES, definition, handle_call

from .scripted import (
    Script,
    crewai_llm,
    langchain_model,
    observation_in,
    openai_agents_model,
)

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
    failed: bool = False
    """Whether the framework's own failure flag must be set (`airlock.tools.job_failed`)."""


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


def _nonzero(seen: dict[str, Any]) -> None:
    assert seen["ok"] is False and seen["outcome"] == "exited" and seen["exit_code"] == 3
    assert seen["stdout"] == "partial\n"


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
        failed=True,
    ),
    Scenario("flood", {"language": "python", "code": "print('x' * 2_000_000)"}, _flood),
    Scenario("secret", {"language": "python", "code": f"print('gh' + 'p_{SECRET_TAIL}')"}, _secret),
    Scenario(
        "nonzero",
        {"language": "python", "code": "import sys\nprint('partial')\nsys.exit(3)"},
        _nonzero,
        failed=True,
    ),
    Scenario(
        "refused",
        {"language": "python", "code": "print(1)", "timeout_s": 60},
        _refused,
        failed=True,
    ),
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


class HostSide:
    """What a tool handed the host (`on_observation`, `out_dir`) during one agent run."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.observations: list[airlock.Observation] = []

    def on_observation(self, observation: airlock.Observation) -> None:
        self.observations.append(observation)

    def check(self, scenario: Scenario, seen: dict[str, Any]) -> None:
        """One observation reached the host, the one the model saw; an /out file's bytes
        are in it and in `out_dir/<job id>/`, and no base64 reached the model."""
        (observation,) = self.observations
        assert observation.to_dict() == seen
        assert "content_base64" not in json.dumps(seen)
        written = sorted(p for p in self.out_dir.rglob("*") if p.is_file())
        if scenario.out_file:
            _check_artifact_bytes(observation)
            assert written == [self.out_dir / observation.job_id / "blob.bin"]
            assert written[0].read_bytes() == PAYLOAD
            assert base64.b64encode(PAYLOAD).decode()[:64] not in json.dumps(seen)
        else:
            assert written == []


@pytest.fixture
def host(tmp_path: Path) -> HostSide:
    return HostSide(tmp_path / "out")


# ---- LangChain / LangGraph ----


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_langgraph_react_agent(
    scenario: Scenario, remote_or_local: dict[str, Any], host: HostSide
) -> None:
    pytest.importorskip("langgraph", reason="the langgraph extra is not installed")
    from langchain_core.messages import HumanMessage, ToolMessage
    from langgraph.prebuilt import create_react_agent

    from airlock.langchain import RunCodeTool

    client = airlock.Client(**remote_or_local)
    tool = RunCodeTool(client=client, out_dir=host.out_dir, on_observation=host.on_observation)
    script = Script(scenario.arguments)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # create_react_agent is deprecated in favour of langchain's
        agent = create_react_agent(langchain_model(script), [tool])
    state = agent.invoke({"messages": [HumanMessage("compute")]})
    assert state["messages"][-1].content == "done"
    (message,) = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert script.handed == [message]
    assert message.tool_call_id == "call-1"
    seen = json.loads(str(message.content))
    scenario.check(seen)
    # A job that did not succeed is still the observation, flagged with LangChain's flag.
    assert message.status == ("error" if scenario.failed else "success")
    # The artifact is the typed observation, for failed runs too.
    assert isinstance(message.artifact, airlock.Observation)
    assert message.artifact.to_json() == message.content
    if scenario.out_file:
        _check_artifact_bytes(message.artifact)
    host.check(scenario, seen)


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
def test_openai_agents_runner(
    scenario: Scenario, remote_or_local: dict[str, Any], host: HostSide
) -> None:
    pytest.importorskip("agents", reason="the openai-agents extra is not installed")
    from agents import Agent, RunConfig, Runner, ToolCallOutputItem

    from airlock.tools.openai_agents import run_code_tool

    script = Script(scenario.arguments)
    model = openai_agents_model(script)
    async_client = airlock.AsyncClient(**remote_or_local)
    tool = run_code_tool(async_client, out_dir=host.out_dir, on_observation=host.on_observation)
    assert tool.strict_json_schema is True
    agent = Agent(name="coder", instructions="Run code.", tools=[tool], model=model)
    result = asyncio.run(
        Runner.run(agent, "compute", run_config=RunConfig(tracing_disabled=True), max_turns=3)
    )
    assert result.final_output == "done"
    (item,) = script.handed
    assert item["call_id"] == "call-1"
    seen = json.loads(item["output"])
    scenario.check(seen)
    # The SDK's host-only channel carries the failure flag, never the model's input.
    (output_item,) = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert output_item.custom_data is not None
    status = output_item.custom_data["airlock"]
    assert status["failed"] is scenario.failed and status["outcome"] == seen["outcome"]
    assert "custom_data" not in item and "failed" not in seen
    host.check(scenario, seen)


def test_openai_agents_schema_is_strict() -> None:
    pytest.importorskip("agents", reason="the openai-agents extra is not installed")
    from airlock.tools.openai_agents import run_code_tool

    schema = run_code_tool().params_json_schema
    assert schema["additionalProperties"] is False
    assert sorted(schema["required"]) == sorted(schema["properties"])


# ---- CrewAI ----


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_crewai_crew(scenario: Scenario, remote_or_local: dict[str, Any], host: HostSide) -> None:
    pytest.importorskip("crewai", reason="the crewai extra is not installed")
    from crewai import Agent, Crew, Task

    from airlock.tools.crewai import RunCodeTool

    script = Script(scenario.arguments)
    client = airlock.Client(**remote_or_local)
    tool = RunCodeTool(client=client, out_dir=host.out_dir, on_observation=host.on_observation)
    agent = Agent(
        role="coder",
        goal="run code",
        backstory="runs code",
        tools=[tool],
        llm=crewai_llm(script),
        allow_delegation=False,
        max_iter=3,
    )
    task = Task(description="compute", expected_output="the result", agent=agent)
    output = Crew(agents=[agent], tasks=[task]).kickoff()
    assert str(output) == "done"
    # The tool's JSON is in the transcript CrewAI hands the model next.
    (transcript,) = script.handed
    observed = observation_in(transcript)
    scenario.check(observed)
    # CrewAI has no failure flag: the model reads `ok`, the host gets the observation.
    assert observed["ok"] is not scenario.failed
    host.check(scenario, observed)


# ---- custom hosts ----


def test_plain_definition_and_dispatcher(remote_or_local: dict[str, Any]) -> None:
    client = airlock.Client(**remote_or_local)
    chat = definition(client, format="chat")
    responses = definition(client, format="responses")
    assert chat["type"] == "function" and chat["function"]["name"] == "run_code"
    assert responses["name"] == "run_code"
    assert responses["parameters"] == chat["function"]["parameters"]
    # The arguments the dispatcher accepts are the schema's.
    assert set(chat["function"]["parameters"]["properties"]) == ARGUMENT_NAMES
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
