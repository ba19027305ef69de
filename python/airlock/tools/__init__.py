"""The `run_code` tool for agent frameworks, and for hosts that speak function calling
themselves.

Every tool here takes its name, description and parameter schema from the server (or
the local binary) for its policy, runs the call through `Client`, and hands the model the
observation JSON: exactly as bounded as the observation is (the policy's output caps),
with released /out files listed but their bytes kept for the host. A job airlock refused
(bad arguments, the policy) is still an observation the model sees, so it can correct
itself; only a client that cannot reach airlock raises.

- `airlock.tools.langchain.RunCodeTool`: LangChain/LangGraph (`pip install
  'airlock-sandbox[langgraph]'`).
- `airlock.tools.crewai.RunCodeTool`: CrewAI (`[crewai]`).
- `airlock.tools.openai_agents.run_code_tool()`: the OpenAI Agents SDK (`[openai-agents]`).
- Here: `definition()` and `handle_call()` for a custom Chat Completions or Responses loop.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Mapping
from typing import Any, Literal

from .._types import Observation
from ..client import AsyncClient, Client, ToolDefinition
from ..errors import AirlockError, InvalidInput, TransportError

#: The arguments a `run_code` call may carry (RunCodeParams in crates/airlock-mcp).
ARGUMENT_NAMES = frozenset({"language", "code", "files", "timeout_s", "return_files"})


def definition(
    client: Client | None = None, *, format: Literal["chat", "responses"] = "chat"
) -> dict[str, Any]:
    """The tool's entry for a `tools=[...]` list: the Chat Completions shape
    (`{"type": "function", "function": {...}}`) or the Responses one."""
    tool = (client or Client()).tool()
    return tool.chat() if format == "chat" else tool.responses()


def _error_observation(kind: str, message: str) -> Observation:
    return Observation.from_dict(
        {"ok": False, "outcome": "error", "error": {"kind": kind, "message": message}}
    )


def parse_arguments(arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """A call's arguments as `Client.run` keywords. `null` means absent (strict-mode models
    and CrewAI send every property). Raises `InvalidInput`."""
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError as e:
            raise InvalidInput(f"the arguments are not JSON: {e}") from e
    if not isinstance(arguments, Mapping):
        raise InvalidInput("the arguments must be a JSON object")
    unknown = sorted(set(arguments) - ARGUMENT_NAMES)
    if unknown:
        raise InvalidInput(f"unknown argument(s): {', '.join(unknown)}")
    code = arguments.get("code")
    if not isinstance(code, str):
        raise InvalidInput("code: missing (the program's source as a string)")
    language = arguments.get("language")
    if language is not None and not isinstance(language, str):
        raise InvalidInput("language: expected a string")
    timeout_s = arguments.get("timeout_s")
    if timeout_s is not None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
            raise InvalidInput("timeout_s: expected a number of seconds")
        if not math.isfinite(timeout_s) or timeout_s <= 0:
            raise InvalidInput(f"timeout_s: {timeout_s} is not a positive number of seconds")
    files: dict[str, str | bytes] = {}
    for i, entry in enumerate(arguments.get("files") or []):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), str):
            raise InvalidInput(f"files[{i}]: expected an object with a path")
        extra = sorted(set(entry) - {"path", "content", "content_base64"})
        if extra:
            raise InvalidInput(f"files[{i}]: unknown field(s): {', '.join(extra)}")
        content, encoded = entry.get("content"), entry.get("content_base64")
        if content is not None and encoded is not None:
            raise InvalidInput(f"files[{i}]: give content or content_base64, not both")
        if content is None and encoded is None:
            # Never an empty file in place of content lost on the way (nulls for both).
            raise InvalidInput(
                f'files[{i}]: give content or content_base64 ("content": "" for an empty file)'
            )
        if encoded is not None:
            try:
                files[entry["path"]] = base64.b64decode(str(encoded), validate=True)
            except (binascii.Error, ValueError) as e:
                raise InvalidInput(f"files[{i}].content_base64: not base64: {e}") from e
        else:
            files[entry["path"]] = str(content)
    return_files = arguments.get("return_files")
    if return_files is not None and not isinstance(return_files, bool):
        raise InvalidInput("return_files: expected true or false")
    return {
        # Absent: the policy's default language.
        "language": language,
        "source": code,
        "files": files,
        "timeout_s": float(timeout_s) if timeout_s is not None else None,
        "return_files": bool(return_files),
    }


def run_call(
    client: Client, arguments: str | Mapping[str, Any] | None, *, return_files: bool = True
) -> Observation:
    """Runs one `run_code` call and returns its observation; a job airlock refused is
    its error observation. /out is on when the host (`return_files`) or the model asks.
    Raises only `TransportError`."""
    try:
        kwargs = parse_arguments(arguments)
        kwargs["return_files"] = kwargs["return_files"] or return_files
        return client.run(kwargs.pop("source"), **kwargs)
    except TransportError:
        raise
    except AirlockError as e:
        return e.observation or _error_observation(e.kind, e.message)


async def arun_call(
    client: AsyncClient,
    arguments: str | Mapping[str, Any] | None,
    *,
    return_files: bool = True,
) -> Observation:
    """`run_call` for asyncio."""
    try:
        kwargs = parse_arguments(arguments)
        kwargs["return_files"] = kwargs["return_files"] or return_files
        return await client.run(kwargs.pop("source"), **kwargs)
    except TransportError:
        raise
    except AirlockError as e:
        return e.observation or _error_observation(e.kind, e.message)


def handle_call(
    arguments: str | Mapping[str, Any] | None,
    client: Client | None = None,
    *,
    return_files: bool = False,
) -> str:
    """A custom host's dispatcher: the model's `run_code` arguments (the JSON string of a
    Chat Completions `tool_calls[].function.arguments` or a Responses `function_call`)
    in, the tool message content (the observation JSON) out."""
    return run_call(client or Client(), arguments, return_files=return_files).to_json()


__all__ = [
    "ARGUMENT_NAMES",
    "ToolDefinition",
    "arun_call",
    "definition",
    "handle_call",
    "parse_arguments",
    "run_call",
]
