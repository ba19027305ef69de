"""The `run_code` tool as a LlamaIndex `FunctionTool`, sync and async, for
`FunctionAgent`, `ReActAgent` and anything else that calls LlamaIndex tools.

    from llama_index.core.agent.workflow import FunctionAgent
    from airlock.tools.llamaindex import run_code_tool
    agent = FunctionAgent(tools=[run_code_tool(out_dir="outputs")], llm=llm)

The tool's name, description and parameter schema are the server's. Each call's
`ToolOutput` has the observation JSON as its content (what the model reads, files listed,
never their bytes), the typed `Observation` as `raw_output` (file bytes included), and
`is_error` set when the job did not succeed (`airlock.tools.job_failed`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

try:
    from llama_index.core.tools import FunctionTool, ToolMetadata, ToolOutput
except ImportError as e:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        "airlock.tools.llamaindex needs its extra: pip install 'airlock-sandbox[llamaindex]'"
    ) from e
from pydantic import BaseModel, ConfigDict

from .._types import Observation
from ..client import AsyncClient, Client, ToolDefinition
from . import HostFiles, arun_call, job_failed, run_call


def _arguments_model(definition: ToolDefinition) -> type[BaseModel]:
    """A model whose JSON schema is the server's parameters, as they are: LlamaIndex reads
    a tool's schema from its `fn_schema` model, and airlock checks the arguments itself."""
    parameters = dict(definition.parameters)

    def server_schema(schema: dict[str, Any]) -> None:
        schema.clear()
        schema.update(parameters)

    return type(
        "RunCodeArguments",
        (BaseModel,),
        {"model_config": ConfigDict(extra="allow", json_schema_extra=server_schema)},
    )


class RunCodeTool(FunctionTool):
    """A `FunctionTool` whose output is the observation: content for the model,
    `raw_output` the typed `Observation`, `is_error` when the job did not succeed."""

    def call(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """Runs the call (sync)."""
        return self._observation_output(super().call(*args, **kwargs))

    async def acall(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """Runs the call (async)."""
        return self._observation_output(await super().acall(*args, **kwargs))

    def _observation_output(self, output: ToolOutput) -> ToolOutput:
        observation = output.raw_output
        if not isinstance(observation, Observation):
            return output
        return ToolOutput(
            content=observation.to_json(),
            tool_name=output.tool_name,
            raw_input=output.raw_input,
            raw_output=observation,
            is_error=job_failed(observation),
        )


def run_code_tool(
    client: Client | None = None,
    *,
    async_client: AsyncClient | None = None,
    return_files: bool = True,
    out_dir: str | os.PathLike[str] | None = None,
    on_observation: Callable[[Observation], None] | None = None,
) -> RunCodeTool:
    """The tool: `call` runs through `client`; `acall` (what the workflow agents use)
    through `async_client` when given, else `client` in a worker thread. Raises only when
    airlock cannot be reached."""
    client = client or Client()
    definition = client.tool()
    host = HostFiles(out_dir=out_dir, on_observation=on_observation)

    def run_code(**arguments: Any) -> Observation:
        return run_call(client, arguments, return_files=return_files, host=host)

    async def arun_code(**arguments: Any) -> Observation:
        if async_client is None:
            return await asyncio.to_thread(run_code, **arguments)
        return await arun_call(async_client, arguments, return_files=return_files, host=host)

    metadata = ToolMetadata(
        name=definition.name,
        description=definition.description,
        fn_schema=_arguments_model(definition),
    )
    return RunCodeTool(fn=run_code, async_fn=arun_code, metadata=metadata)


__all__ = ["RunCodeTool", "run_code_tool"]
