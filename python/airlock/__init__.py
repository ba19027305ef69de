"""airlock from Python: run model-written code in a fresh, hardened, disposable sandbox
and get a bounded JSON observation back.

- `run_in_container(source, timeout_s=5)`: the drop-in tool handler, returns a dict.
- `Client` / `AsyncClient`: `run(...) -> Observation`, `stream(...)`, `tool()`.
- `airlock.tools.*`: the `run_code` tool for LangChain/LangGraph, CrewAI, the OpenAI
  Agents SDK, and plain function-calling hosts.

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
    TransportError,
    Unauthorized,
)
from .run import RunResult, run_in_container

__all__ = [
    "AirlockError",
    "AsyncClient",
    "AsyncRunStream",
    "BackendUnavailable",
    "BinaryNotFound",
    "Chunk",
    "Client",
    "ClientTimeout",
    "ErrorInfo",
    "InternalError",
    "InvalidInput",
    "NetworkCounts",
    "Observation",
    "ObservationFormatError",
    "OutputFile",
    "PolicyDenied",
    "RejectedFile",
    "RunRequest",
    "RunResult",
    "RunStream",
    "ToolDefinition",
    "TransportError",
    "Unauthorized",
    "run_in_container",
]
