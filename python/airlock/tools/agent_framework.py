"""The `run_code` tool for Microsoft Agent Framework (`agent-framework-core` 1.x), a
`FunctionTool` for its `Agent` (formerly `ChatAgent`) and any chat client with function
invocation.

    from agent_framework import Agent
    from airlock.tools.agent_framework import run_code_tool
    agent = Agent(client=chat_client, tools=[run_code_tool(out_dir="outputs")])

The tool's name, description and JSON schema are the server's (`input_model` as a schema
mapping). The model gets the observation JSON (files listed, never their bytes). Agent
Framework flags a failed call only when the function raises, and then hides what it said
from the model; so a job that did not succeed is returned, not raised, and flagged in the
host-only `additional_properties["airlock"]` of the result's content
(`airlock.tools.call_status`: `failed` true), whose `raw_representation` is the typed
`Observation` (file bytes included). Every call's observation also goes to
`on_observation`, and released files are written under `out_dir`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

try:
    from agent_framework import Content, FunctionTool
except ImportError as e:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        "airlock.tools.agent_framework needs its extra: "
        "pip install 'airlock-sandbox[agent-framework]'"
    ) from e

from .._types import Observation
from ..client import AsyncClient
from . import HostFiles, arun_call, call_status

#: The key of the host-only status in each result content's `additional_properties`.
STATUS_KEY = "airlock"


def _observation_content(result: Any) -> list[Content]:
    if not isinstance(result, Observation):
        return [Content.from_text(str(result))]
    return [
        Content.from_text(
            result.to_json(),
            additional_properties={STATUS_KEY: call_status(result)},
            raw_representation=result,
        )
    ]


def run_code_tool(
    client: AsyncClient | None = None,
    *,
    return_files: bool = True,
    out_dir: str | os.PathLike[str] | None = None,
    on_observation: Callable[[Observation], None] | None = None,
) -> FunctionTool:
    """The tool, calling airlock through `client` (an `AsyncClient`, local or
    `AIRLOCK_URL` by default). Raises only when airlock cannot be reached."""
    runner = client or AsyncClient()
    definition = runner.tool_sync()
    host = HostFiles(out_dir=out_dir, on_observation=on_observation)

    async def run_code(**arguments: Any) -> Observation:
        return await arun_call(runner, arguments, return_files=return_files, host=host)

    return FunctionTool(
        name=definition.name,
        description=definition.description,
        func=run_code,
        input_model=definition.parameters,
        result_parser=_observation_content,
    )


__all__ = ["STATUS_KEY", "run_code_tool"]
