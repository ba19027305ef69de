"""The `run_code` tool for agent frameworks, and for hosts that speak function calling
themselves.

Every tool here takes its name, description and parameter schema from the server (or
the local binary) for its policy, runs the call through `Client`, and hands the model the
observation JSON: exactly as bounded as the observation is (the policy's output caps),
with released /out files listed (name, size, media type, hash) but their bytes kept for
the host. A job airlock refused (bad arguments, the policy) is still an observation the
model sees, so it can correct itself; only a client that cannot reach airlock raises.

One rule for every framework (`job_failed`): a call whose job did not succeed (a non-zero
exit, a timeout, an OOM kill, an output flood, a refusal) is returned to the model as its
observation *and* marked failed with the framework's own flag: LangChain
`ToolMessage.status="error"`, Pydantic AI `ToolReturnPart.outcome="failed"`, LlamaIndex
`ToolOutput.is_error`, the Agents SDK's host-only `custom_data`, Agent Framework's host-only
result `additional_properties`; CrewAI has no such flag, its host sees `ok` in the JSON and
through `on_observation`.

The host gets the files (`HostFiles`): every tool takes `on_observation=` (called with the
typed `Observation`, file bytes included, for every call) and `out_dir=` (released files
written under `out_dir/<job id>/`, names sanitised, nothing outside it).

- `airlock.tools.langchain.RunCodeTool`: LangChain/LangGraph (`pip install
  'airlock-sandbox[langgraph]'`).
- `airlock.tools.crewai.RunCodeTool`: CrewAI (`[crewai]`).
- `airlock.tools.openai_agents.run_code_tool()`: the OpenAI Agents SDK (`[openai-agents]`).
- `airlock.tools.pydantic_ai.run_code_tool()`: Pydantic AI (`[pydantic-ai]`).
- `airlock.tools.llamaindex.run_code_tool()`: LlamaIndex (`[llamaindex]`).
- `airlock.tools.agent_framework.run_code_tool()`: Microsoft Agent Framework
  (`[agent-framework]`).
- Here: `definition()` and `handle_call()` for a custom Chat Completions or Responses loop.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .._types import Observation
from ..client import AsyncClient, Client, ToolDefinition
from ..errors import AirlockError, InvalidInput, TransportError
from ..sandbox import Execution

#: The arguments a `run_code` call may carry: the properties of the server's tool schema.
ARGUMENT_NAMES = frozenset({"language", "code", "files", "timeout_s", "return_files"})


def definition(
    client: Client | None = None, *, format: Literal["chat", "responses"] = "chat"
) -> dict[str, Any]:
    """The tool's entry for a `tools=[...]` list: the Chat Completions shape
    (`{"type": "function", "function": {...}}`) or the Responses one."""
    tool = (client or Client()).tool()
    return tool.chat() if format == "chat" else tool.responses()


def job_failed(observation: Observation) -> bool:
    """Whether a `run_code` call is a failure to the framework: true unless the program
    exited by itself with code 0 (`ok`). The one place every tool asks."""
    return not observation.ok


def execution_failed(execution: Execution) -> bool:
    """`job_failed` for a session call: also a failure when the code raised."""
    return job_failed(execution.observation) or execution.error is not None


#: What the session tools tell the model they do.
SESSION_TOOL_DESCRIPTION = (
    "Run Python code in this conversation's own sandbox (airlock). Variables, imports and "
    "files in /work persist from one call to the next in the same conversation, like "
    "notebook cells; nothing is shared with other conversations. The result is JSON: stdout, "
    "stderr, the last expression's value, the exception if one was raised, and "
    "kernel_restarted/new_session when earlier state was lost."
)


def execution_answer(execution: Execution) -> dict[str, Any]:
    """What a session tool hands the model for one call: the observation (without file
    bytes), the last expression's value, the exception raised, a kernel restart."""
    answer = execution.observation.to_dict()
    if execution.text is not None:
        answer["value"] = execution.text
    if execution.error is not None:
        answer["error_raised"] = {"name": execution.error.name, "value": execution.error.value}
    if execution.kernel_restarted is not None:
        answer["kernel_restarted"] = execution.kernel_restarted
    return answer


def call_status(observation: Observation) -> dict[str, Any]:
    """The host-side summary of a call (JSON-compatible), for frameworks whose failure
    flag is host-only data: the job id, `ok`, `outcome`, and `failed` (`job_failed`)."""
    return {
        "job_id": observation.job_id,
        "ok": observation.ok,
        "outcome": observation.outcome,
        "failed": job_failed(observation),
    }


#: Longest file or directory name `HostFiles` writes (bytes of the sanitised name).
MAX_HOST_NAME_BYTES = 200
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]")


def safe_relative_path(path: str) -> Path:
    """A released file's path (relative to /out, as the job named it) as a relative path
    that cannot leave the directory it is joined to: each component limited to
    `[A-Za-z0-9._-]`, none empty, `.` or `..`, none starting with a dot, none longer than
    `MAX_HOST_NAME_BYTES`."""
    parts: list[str] = []
    for part in re.split(r"[/\\]+", path):
        if part == "":
            continue
        cleaned = _UNSAFE_NAME_CHARS.sub("_", part)[:MAX_HOST_NAME_BYTES]
        if cleaned.startswith("."):
            cleaned = "_" + cleaned[1:]
        parts.append(cleaned)
    return Path(*parts) if parts else Path("file")


def _write_new_file(root: Path, relative: Path, content: bytes) -> Path:
    """Writes `content` to a new file at `root/relative`, creating directories below
    `root`; never follows a symlink and never replaces a file (a name taken gets `-2`,
    `-3`, ... before its suffix)."""
    directory = root
    for part in relative.parts[:-1]:
        directory = directory / part
        try:
            os.mkdir(directory, 0o755)
        except FileExistsError:
            pass
        if directory.is_symlink() or not directory.is_dir():
            raise OSError(f"{directory}: not a directory airlock created")
    name = relative.parts[-1]
    stem, dot, suffix = name.partition(".")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for attempt in range(1, 1000):
        candidate = name if attempt == 1 else f"{stem}-{attempt}{dot}{suffix}"
        target = directory / candidate
        try:
            fd = os.open(target, flags, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as file:
            file.write(content)
        return target
    raise OSError(f"{directory / name}: no free name")


@dataclass
class HostFiles:
    """Where a tool hands the host what a job made, beside what the model sees: the typed
    `Observation` (file bytes included) to `on_observation` after every call, and the
    released `/out` files to `out_dir/<job id>/<sanitised path>`. The model's JSON lists
    the files (path, size, media type, hash), never their bytes."""

    out_dir: str | os.PathLike[str] | None = None
    on_observation: Callable[[Observation], None] | None = None

    @property
    def wants_files(self) -> bool:
        """Whether the host takes file bytes at all."""
        return self.out_dir is not None or self.on_observation is not None

    def save(self, observation: Observation) -> list[Path]:
        """Writes the released files that came back with their bytes (each checked
        against its size and SHA-256) under `out_dir`; returns the paths written."""
        if self.out_dir is None:
            return []
        files = [f for f in observation.files if f.has_content]
        if not files:
            return []
        root = Path(self.out_dir)
        root.mkdir(parents=True, exist_ok=True)
        job = safe_relative_path(observation.job_id or "job").parts[-1]
        job_dir = root / job
        try:
            os.mkdir(job_dir, 0o755)
        except FileExistsError:
            pass
        if job_dir.is_symlink() or not job_dir.is_dir():
            raise OSError(f"{job_dir}: not a directory airlock created")
        return [_write_new_file(job_dir, safe_relative_path(f.path), f.read()) for f in files]

    def deliver(self, observation: Observation) -> None:
        """Saves the files, then calls `on_observation`."""
        self.save(observation)
        if self.on_observation is not None:
            self.on_observation(observation)


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
    client: Client,
    arguments: str | Mapping[str, Any] | None,
    *,
    return_files: bool = True,
    host: HostFiles | None = None,
) -> Observation:
    """Runs one `run_code` call and returns its observation; a job airlock refused is
    its error observation. /out is on when the host (`return_files`) or the model asks.
    `host` gets the observation and the files. Raises only `TransportError` (and
    `OSError` when `host` cannot write a file)."""
    try:
        kwargs = parse_arguments(arguments)
        kwargs["return_files"] = kwargs["return_files"] or return_files
        observation = client.run(kwargs.pop("source"), **kwargs)
    except TransportError:
        raise
    except AirlockError as e:
        observation = e.observation or _error_observation(e.kind, e.message)
    if host is not None:
        host.deliver(observation)
    return observation


async def arun_call(
    client: AsyncClient,
    arguments: str | Mapping[str, Any] | None,
    *,
    return_files: bool = True,
    host: HostFiles | None = None,
) -> Observation:
    """`run_call` for asyncio."""
    try:
        kwargs = parse_arguments(arguments)
        kwargs["return_files"] = kwargs["return_files"] or return_files
        observation = await client.run(kwargs.pop("source"), **kwargs)
    except TransportError:
        raise
    except AirlockError as e:
        observation = e.observation or _error_observation(e.kind, e.message)
    if host is not None:
        host.deliver(observation)
    return observation


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
    "MAX_HOST_NAME_BYTES",
    "SESSION_TOOL_DESCRIPTION",
    "HostFiles",
    "ToolDefinition",
    "arun_call",
    "call_status",
    "definition",
    "execution_answer",
    "execution_failed",
    "handle_call",
    "job_failed",
    "parse_arguments",
    "run_call",
    "safe_relative_path",
]
