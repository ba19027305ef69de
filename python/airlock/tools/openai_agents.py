"""The `run_code` tool as an OpenAI Agents SDK `FunctionTool` with a strict schema.

from agents import Agent
from airlock.tools.openai_agents import run_code_tool
agent = Agent(name="coder", tools=[run_code_tool(out_dir="outputs")])

The model gets the observation JSON (files listed, never their bytes). The Responses API
has no failure flag for a function's output, so the host's is the SDK's own host-only
channel: each `ToolCallOutputItem.custom_data["airlock"]` is `airlock.tools.call_status`
(`failed` true when the job did not succeed). The typed `Observation`, file bytes
included, goes to `on_observation`; released files are written under `out_dir`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

try:
    from agents import FunctionTool, FunctionToolCustomDataContext, RunContextWrapper
    from agents.strict_schema import ensure_strict_json_schema
except ImportError as e:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        "airlock.tools.openai_agents needs its extra: pip install 'airlock-sandbox[openai-agents]'"
    ) from e

from .._types import Observation
from ..client import AsyncClient
from . import HostFiles, arun_call, call_status


def run_code_tool(
    client: AsyncClient | None = None,
    *,
    return_files: bool = True,
    out_dir: str | os.PathLike[str] | None = None,
    on_observation: Callable[[Observation], None] | None = None,
) -> FunctionTool:
    """The tool, calling airlock through `client` (an `AsyncClient`: the SDK runs tools in
    its event loop). Name, description and schema are the server's; a schema that is not
    yet in the strict shape is made strict with the SDK's own converter. The model sees
    the observation JSON, for refused jobs too; the host gets `custom_data["airlock"]`,
    `on_observation` and `out_dir` (see the module)."""
    host = HostFiles(out_dir=out_dir, on_observation=on_observation)
    runner = client or AsyncClient()
    tool = runner.tool_sync()
    parameters = tool.parameters
    if not tool.strict:
        parameters = ensure_strict_json_schema(_without_unsupported(parameters))

    async def invoke(context: RunContextWrapper[Any], arguments: str) -> str:
        observation = await arun_call(runner, arguments, return_files=return_files, host=host)
        return observation.to_json()

    return FunctionTool(
        name=tool.name,
        description=tool.description,
        params_json_schema=parameters,
        on_invoke_tool=invoke,
        strict_json_schema=True,
        custom_data_extractor=_custom_data,
    )


def _custom_data(context: FunctionToolCustomDataContext) -> Mapping[str, Any] | None:
    # The model-visible output is the observation JSON `invoke` returned; the status is
    # derived from it, so what the host reads is what the model was told.
    if not isinstance(context.output, str):
        return None
    try:
        observation = Observation.from_dict(json.loads(context.output))
    except ValueError:
        return None
    return {"airlock": call_status(observation)}


def _without_unsupported(schema: dict[str, Any]) -> dict[str, Any]:
    # Keywords OpenAI's strict mode refuses and the pre-strict schema still has.
    def clean(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: clean(v)
                for k, v in node.items()
                if k not in ("$schema", "format", "title", "default")
            }
        if isinstance(node, list):
            return [clean(v) for v in node]
        return node

    cleaned: dict[str, Any] = clean(schema)
    return cleaned
