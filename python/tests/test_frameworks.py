"""The Pydantic AI, LlamaIndex and Agent Framework tools, each run by its framework's own
agent loop with a scripted model (no model service, no network): the model asks for
`run_code`, the framework runs the tool, and the test reads what the model is handed
next, the framework's failure flag, and what the host got (`on_observation`, `out_dir`).
The scenarios are test_tools.py's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import airlock

from .scripted import (
    Script,
    agent_framework_client,
    llamaindex_function_llm,
    llamaindex_react_llm,
    observation_in,
    pydantic_ai_model,
)
from .test_tools import IDS, SCENARIOS, HostSide, Scenario, _hello


@pytest.fixture
def host(tmp_path: Path) -> HostSide:
    return HostSide(tmp_path / "out")


# ---- Pydantic AI ----


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_pydantic_ai_agent(
    scenario: Scenario, remote_or_local: dict[str, Any], host: HostSide
) -> None:
    pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
    from pydantic_ai import Agent

    from airlock.tools.pydantic_ai import run_code_tool

    script = Script(scenario.arguments)
    client = airlock.AsyncClient(**remote_or_local)
    tool = run_code_tool(client, out_dir=host.out_dir, on_observation=host.on_observation)
    agent = Agent(pydantic_ai_model(script), tools=[tool])
    result = agent.run_sync("compute")
    assert result.output == "done"
    assert script.tools == [client.tool_sync().parameters]
    (part,) = script.handed
    assert part.tool_call_id == "call-1"
    seen = json.loads(str(part.content))
    scenario.check(seen)
    # Pydantic AI's own flag: a failed outcome travels the provider's error channel.
    assert part.outcome == ("failed" if scenario.failed else "success")
    if scenario.failed:
        assert json.loads(part.model_response_str())["error"] == part.content
    else:
        assert isinstance(part.metadata, airlock.Observation)
    host.check(scenario, seen)


def test_pydantic_ai_session_tool_keeps_state_in_the_deps_sandbox(session_server: str) -> None:
    pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from airlock.tools.pydantic_ai import session_run_code_tool

    handed: list[ToolReturnPart] = []
    codes = iter(["x = 40", "x + 2", "1 / 0"])

    def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) > 1:
            handed.extend(p for p in messages[-1].parts if isinstance(p, ToolReturnPart))
            return ModelResponse(parts=[TextPart("done")])
        code = next(codes)
        return ModelResponse(parts=[ToolCallPart("run_code", {"code": code}, "call-1")])

    async def main() -> None:
        agent = Agent(FunctionModel(scripted), tools=[session_run_code_tool()])
        async with await airlock.AsyncSandbox.create(session_server) as sandbox:
            # Three runs, one dependency: the variable lives on in its session.
            for _ in range(3):
                await agent.run("compute", deps=sandbox)

    asyncio.run(main())
    first, second, third = (json.loads(str(p.content)) for p in handed)
    assert first["session"]["id"] == second["session"]["id"] == third["session"]["id"]
    assert second["value"] == "42" and handed[1].outcome == "success"
    assert third["error_raised"]["name"] == "ZeroDivisionError"
    assert handed[2].outcome == "failed"


@pytest.fixture(scope="module")
def session_server(airlock_bin: str) -> Any:
    from .test_sandbox import _serve

    policy = 'version = "sbx-1"\n[sessions]\nenabled = true\nmode = "kernel"\n'
    with _serve(airlock_bin, policy) as url:
        yield url


# ---- LlamaIndex ----


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_llamaindex_function_agent(
    scenario: Scenario, remote_or_local: dict[str, Any], host: HostSide
) -> None:
    pytest.importorskip("llama_index.core", reason="the llamaindex extra is not installed")
    from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult

    from airlock.tools.llamaindex import run_code_tool

    script = Script(scenario.arguments)
    client = airlock.Client(**remote_or_local)
    tool = run_code_tool(
        client,
        async_client=airlock.AsyncClient(**remote_or_local),
        out_dir=host.out_dir,
        on_observation=host.on_observation,
    )
    assert (
        tool.metadata.get_parameters_dict()["properties"] == client.tool().parameters["properties"]
    )
    agent = FunctionAgent(tools=[tool], llm=llamaindex_function_llm(script))

    async def main() -> tuple[str, list[ToolCallResult]]:
        handler = agent.run(user_msg="compute")
        results = [e async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
        return str(await handler), results

    answer, results = asyncio.run(main())
    assert answer == "done"
    (message,) = script.handed
    assert message.additional_kwargs["tool_call_id"] == "call-1"
    seen = json.loads(str(message.content))
    scenario.check(seen)
    (result,) = results
    # LlamaIndex's own flag, and the typed observation for the host.
    assert result.tool_output.is_error is scenario.failed
    assert isinstance(result.tool_output.raw_output, airlock.Observation)
    host.check(scenario, seen)


def test_llamaindex_openai_tool_takes_the_description_unmodified(
    remote_or_local: dict[str, Any],
) -> None:
    """LlamaIndex's `to_openai_tool()` (what its OpenAI-shaped LLM integrations and token
    counting call) refuses descriptions over 1,024 characters: the server's fits."""
    pytest.importorskip("llama_index.core", reason="the llamaindex extra is not installed")
    from airlock.tools.llamaindex import run_code_tool

    client = airlock.Client(**remote_or_local)
    tool = run_code_tool(client)
    spec = tool.metadata.to_openai_tool()
    assert spec["function"]["description"] == client.tool().description
    assert "wall time" in spec["function"]["description"]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_llamaindex_react_agent(
    scenario: Scenario, remote_or_local: dict[str, Any], host: HostSide
) -> None:
    pytest.importorskip("llama_index.core", reason="the llamaindex extra is not installed")
    from llama_index.core.agent.workflow import ReActAgent, ToolCallResult

    from airlock.tools.llamaindex import run_code_tool

    script = Script(scenario.arguments)
    tool = run_code_tool(
        airlock.Client(**remote_or_local),
        out_dir=host.out_dir,
        on_observation=host.on_observation,
    )
    agent = ReActAgent(tools=[tool], llm=llamaindex_react_llm(script))

    async def main() -> tuple[str, list[ToolCallResult]]:
        handler = agent.run(user_msg="compute")
        results = [e async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
        return str(await handler), results

    answer, results = asyncio.run(main())
    assert answer == "done"
    # The observation is the last "Observation:" line of the next prompt.
    (prompt,) = script.handed
    seen = observation_in(prompt.rpartition("Observation: ")[2])
    scenario.check(seen)
    (result,) = results
    assert result.tool_output.is_error is scenario.failed
    host.check(scenario, seen)


def test_llamaindex_tool_sync_call(remote_or_local: dict[str, Any]) -> None:
    pytest.importorskip("llama_index.core", reason="the llamaindex extra is not installed")
    from airlock.tools.llamaindex import run_code_tool

    tool = run_code_tool(airlock.Client(**remote_or_local))
    output = tool.call(**SCENARIOS[0].arguments)
    _hello(json.loads(str(output.content)))
    assert output.is_error is False
    # Without an AsyncClient, acall runs the sync client in a worker thread.
    failed = asyncio.run(tool.acall(code="import sys; sys.exit(3)"))
    assert failed.is_error is True and json.loads(str(failed.content))["exit_code"] == 3


# ---- Microsoft Agent Framework ----


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_agent_framework_agent(
    scenario: Scenario, remote_or_local: dict[str, Any], host: HostSide
) -> None:
    pytest.importorskip("agent_framework", reason="the agent-framework extra is not installed")
    from agent_framework import Agent

    from airlock.tools.agent_framework import STATUS_KEY, run_code_tool

    script = Script(scenario.arguments)
    client = airlock.AsyncClient(**remote_or_local)
    tool = run_code_tool(client, out_dir=host.out_dir, on_observation=host.on_observation)
    agent = Agent(client=agent_framework_client(script), tools=[tool])

    async def main() -> Any:
        return await agent.run("compute")

    response = asyncio.run(main())
    assert response.text == "done"
    (result,) = script.handed
    assert result.call_id == "call-1" and result.exception is None
    seen = json.loads(str(result.result))
    scenario.check(seen)
    # The host-only flag on the result's content; the model reads only the text.
    (item,) = result.items or []
    assert item.additional_properties[STATUS_KEY]["failed"] is scenario.failed
    assert isinstance(item.raw_representation, airlock.Observation)
    host.check(scenario, seen)
