"""The `run_code` tool as an OpenAI Agents SDK `FunctionTool` with a strict schema.

from agents import Agent
from airlock.tools.openai_agents import run_code_tool
agent = Agent(name="coder", tools=[run_code_tool()])
"""

from __future__ import annotations

from typing import Any

try:
    from agents import FunctionTool, RunContextWrapper
    from agents.strict_schema import ensure_strict_json_schema
except ImportError as e:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        "airlock.tools.openai_agents needs its extra: pip install 'airlock-sandbox[openai-agents]'"
    ) from e

from ..client import AsyncClient
from . import arun_call


def run_code_tool(
    client: AsyncClient | None = None,
    *,
    return_files: bool = True,
) -> FunctionTool:
    """The tool, calling airlock through `client` (an `AsyncClient`: the SDK runs tools in
    its event loop). Name, description and schema are the server's; a schema that is not
    yet in the strict shape is made strict with the SDK's own converter. The model sees
    the observation JSON, for refused jobs too."""
    runner = client or AsyncClient()
    tool = runner.tool_sync()
    parameters = tool.parameters
    if not tool.strict:
        parameters = ensure_strict_json_schema(_without_unsupported(parameters))

    async def invoke(context: RunContextWrapper[Any], arguments: str) -> str:
        observation = await arun_call(runner, arguments, return_files=return_files)
        return observation.to_json()

    return FunctionTool(
        name=tool.name,
        description=tool.description,
        params_json_schema=parameters,
        on_invoke_tool=invoke,
        strict_json_schema=True,
    )


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
