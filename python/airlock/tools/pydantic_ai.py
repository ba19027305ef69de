"""The `run_code` tool for Pydantic AI.

    from pydantic_ai import Agent
    from airlock.tools.pydantic_ai import run_code_tool
    agent = Agent(model, tools=[run_code_tool(out_dir="outputs")])

The tool's name, description and JSON schema are the server's (`Tool.from_schema`). The
model gets the observation JSON; a job that did not succeed (`airlock.tools.job_failed`)
is reported with Pydantic AI's `ToolFailed`, so its `ToolReturnPart` has
`outcome="failed"` (the provider's native error channel) and still carries the
observation. A successful call's `ToolReturn.metadata` is the typed `Observation` (file
bytes included; Pydantic AI never sends metadata to the model); every call's observation
goes to `on_observation`, and released files are written under `out_dir`.

`session_run_code_tool()` runs the code in the airlock session the agent run's
dependency holds (`deps=sandbox`, an `AsyncSandbox`, or deps with a `sandbox` attribute),
so variables and files persist across the calls of every run that shares it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

try:
    from pydantic_ai import RunContext, Tool, ToolReturn
    from pydantic_ai.exceptions import ToolFailed
except ImportError as e:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        "airlock.tools.pydantic_ai needs its extra: pip install 'airlock-sandbox[pydantic-ai]'"
    ) from e

from .._types import Observation
from ..client import AsyncClient
from ..sandbox import AsyncSandbox
from . import (
    SESSION_TOOL_DESCRIPTION,
    HostFiles,
    arun_call,
    execution_answer,
    execution_failed,
    job_failed,
)


def run_code_tool(
    client: AsyncClient | None = None,
    *,
    return_files: bool = True,
    out_dir: str | os.PathLike[str] | None = None,
    on_observation: Callable[[Observation], None] | None = None,
) -> Tool[Any]:
    """The `run_code` tool, calling airlock through `client` (an `AsyncClient`, local or
    `AIRLOCK_URL` by default). Raises only when airlock cannot be reached."""
    runner = client or AsyncClient()
    definition = runner.tool_sync()
    host = HostFiles(out_dir=out_dir, on_observation=on_observation)

    async def run_code(**arguments: Any) -> ToolReturn:
        observation = await arun_call(runner, arguments, return_files=return_files, host=host)
        if job_failed(observation):
            raise ToolFailed(observation.to_json())
        return ToolReturn(return_value=observation.to_json(), metadata=observation)

    return Tool.from_schema(
        run_code,
        name=definition.name,
        description=definition.description,
        json_schema=definition.parameters,
    )


#: The session tool's parameters.
SESSION_TOOL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {
            "type": "string",
            "description": "Python code to run; the last expression's value is returned",
        },
        "timeout_s": {
            "type": ["number", "null"],
            "description": "This call's wall time in seconds (the policy's by default)",
        },
    },
    "required": ["code"],
    "additionalProperties": False,
}


def _sandbox_of(deps: Any) -> AsyncSandbox:
    if isinstance(deps, AsyncSandbox):
        return deps
    sandbox = getattr(deps, "sandbox", None)
    if isinstance(sandbox, AsyncSandbox):
        return sandbox
    raise TypeError(
        "session_run_code_tool needs the run's deps to be an airlock.AsyncSandbox "
        "or to have one as `.sandbox`"
    )


def session_run_code_tool(*, name: str = "run_code") -> Tool[Any]:
    """`run_code` with state: each call runs in the airlock session of the run's deps (a
    kernel session of `airlock serve` with `[sessions]` enabled, docs/sessions.md). The
    model gets the answer JSON (stdout, stderr, the last expression's value, the
    exception raised); a call whose job did not succeed or raised is `outcome="failed"`."""

    async def run_code(ctx: RunContext[Any], code: str, timeout_s: float | None = None) -> Any:
        sandbox = _sandbox_of(ctx.deps)
        execution = await sandbox.run_code(code, timeout_s=timeout_s)
        answer = execution_answer(execution)
        answer["session"] = {"id": sandbox.id}
        content = json.dumps(answer, ensure_ascii=False)
        if execution_failed(execution):
            raise ToolFailed(content)
        return ToolReturn(return_value=content, metadata=execution)

    return Tool.from_schema(
        run_code,
        name=name,
        description=SESSION_TOOL_DESCRIPTION,
        json_schema=SESSION_TOOL_SCHEMA,
        takes_ctx=True,
    )


__all__ = ["SESSION_TOOL_SCHEMA", "run_code_tool", "session_run_code_tool"]
