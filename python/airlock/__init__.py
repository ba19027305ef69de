"""airlock from Python: run model-written code in a fresh, hardened, disposable sandbox
and get a bounded JSON observation back.

- `run_in_container(source, timeout_s=5)`: the drop-in tool handler, returns a dict.
- `Client` / `AsyncClient`: `run(...) -> Observation`, `stream(...)`, `tool()`.
- `airlock.tools.*`: the `run_code` tool for LangChain/LangGraph, CrewAI, the OpenAI
  Agents SDK, Pydantic AI, LlamaIndex, Microsoft Agent Framework, and plain
  function-calling hosts.

Local by default (the `airlock` binary this wheel installs; AIRLOCK_BIN overrides it);
remote when AIRLOCK_URL (and AIRLOCK_TOKEN) are set or passed."""

from ._request import RunRequest
from ._types import (
    Chunk,
    ErrorInfo,
    NetworkCounts,
    Observation,
    ObservationFormatError,
    OutputFile,
    RejectedFile,
)
from .client import AsyncClient, AsyncRunStream, Client, RunStream, ToolDefinition
from .errors import (
    AirlockError,
    BackendUnavailable,
    BinaryNotFound,
    ClientTimeout,
    InternalError,
    InvalidInput,
    PolicyDenied,
    SessionNotFound,
    TransportError,
    Unauthorized,
)
from .run import RunResult, run_in_container
from .sandbox import AsyncSandbox, Execution, ExecutionError, Logs, Result, Sandbox

__all__ = [
    "AirlockError",
    "AsyncClient",
    "AsyncRunStream",
    "AsyncSandbox",
    "BackendUnavailable",
    "BinaryNotFound",
    "Chunk",
    "Client",
    "ClientTimeout",
    "ErrorInfo",
    "Execution",
    "ExecutionError",
    "InternalError",
    "InvalidInput",
    "Logs",
    "NetworkCounts",
    "Observation",
    "ObservationFormatError",
    "OutputFile",
    "PolicyDenied",
    "RejectedFile",
    "Result",
    "RunRequest",
    "RunResult",
    "RunStream",
    "Sandbox",
    "SessionNotFound",
    "ToolDefinition",
    "TransportError",
    "Unauthorized",
    "run_in_container",
]
