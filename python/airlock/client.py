"""`Client` and `AsyncClient`: one job per call, local (the bundled `airlock` binary) by
default, remote (`airlock serve`) when a URL is given or AIRLOCK_URL is set."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _http, _local
from ._request import RunOptions, RunRequest, build_request

if TYPE_CHECKING:
    from typing_extensions import Unpack
from ._types import Chunk, Observation
from .errors import AirlockError, TransportError, raise_for_observation

#: Added to the job's wall time for the client's own deadline in local mode: sandbox
#: setup and teardown.
LOCAL_MARGIN_S = 30.0
#: The same for remote mode: the server's queue wait (60 s by default) and setup.
REMOTE_MARGIN_S = 90.0
#: The wall time assumed when neither the call nor the policy's tool schema says one.
UNKNOWN_WALL_S = 3600.0
#: Longest wait for the tool schema.
SCHEMA_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ToolDefinition:
    """The `run_code` tool as the server (or the binary) defines it for its policy: one
    source of truth for every framework's tool."""

    name: str
    description: str
    parameters: dict[str, Any]
    strict: bool
    """Whether `parameters` is in the strict shape (every property required, optional
    ones nullable, objects closed). Servers before the strict schema send the plain one."""

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> ToolDefinition:
        """Parses the Chat Completions shape (`{"type", "function": {...}}`) or the
        Responses shape (`{"type", "name", ...}`)."""
        inner = data.get("function")
        body: Mapping[str, Any] = inner if isinstance(inner, Mapping) else data
        name, parameters = body.get("name"), body.get("parameters")
        if not isinstance(name, str) or not isinstance(parameters, Mapping):
            raise TransportError("the tool schema has no name or parameters")
        return cls(
            name=name,
            description=str(body.get("description", "")),
            parameters=dict(parameters),
            strict=body.get("strict") is True,
        )

    def chat(self) -> dict[str, Any]:
        """The Chat Completions `tools[]` entry."""
        function: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        }
        if self.strict:
            function["strict"] = True
        return {"type": "function", "function": function}

    def responses(self) -> dict[str, Any]:
        """The Responses API `tools[]` entry."""
        tool: dict[str, Any] = {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        }
        if self.strict:
            tool["strict"] = True
        return tool

    @property
    def max_timeout_s(self) -> float | None:
        """The policy's wall time (the schema's `timeout_s` maximum), when it says one."""
        prop = (self.parameters.get("properties") or {}).get("timeout_s")
        maximum = prop.get("maximum") if isinstance(prop, Mapping) else None
        return float(maximum) if isinstance(maximum, (int, float)) else None


class RunStream:
    """A streamed run: iterate it for `Chunk`s as the job writes them; `observation` is
    there once the iteration ended. An error observation raises its typed error at the
    end, as `run` does. Closing it early (or leaving its `with` block) ends the job."""

    def __init__(self, items: Iterator[Chunk | Observation]) -> None:
        self._items = items
        self._observation: Observation | None = None

    def __iter__(self) -> RunStream:
        return self

    def __next__(self) -> Chunk:
        for item in self._items:
            if isinstance(item, Chunk):
                return item
            self._observation = item
            raise_for_observation(item)
            raise StopIteration
        if self._observation is None:
            raise TransportError("the stream ended before the observation")
        raise StopIteration

    @property
    def observation(self) -> Observation:
        """The final observation. Raises `RuntimeError` before the stream is done."""
        if self._observation is None:
            raise RuntimeError("the stream is not done: iterate it to its end first")
        return self._observation

    def close(self) -> None:
        """Stops reading; a job still running is killed."""
        close = getattr(self._items, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> RunStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncRunStream:
    """`RunStream`, for `async for`."""

    def __init__(self, items: AsyncIterator[Chunk | Observation]) -> None:
        self._items = items
        self._observation: Observation | None = None

    def __aiter__(self) -> AsyncRunStream:
        return self

    async def __anext__(self) -> Chunk:
        async for item in self._items:
            if isinstance(item, Chunk):
                return item
            self._observation = item
            raise_for_observation(item)
            raise StopAsyncIteration
        if self._observation is None:
            raise TransportError("the stream ended before the observation")
        raise StopAsyncIteration

    @property
    def observation(self) -> Observation:
        """The final observation. Raises `RuntimeError` before the stream is done."""
        if self._observation is None:
            raise RuntimeError("the stream is not done: iterate it to its end first")
        return self._observation

    async def aclose(self) -> None:
        """Stops reading; a job still running is killed."""
        aclose = getattr(self._items, "aclose", None)
        if aclose is not None:
            await aclose()

    async def __aenter__(self) -> AsyncRunStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _local_chunks(observation: Observation) -> Iterator[Chunk | Observation]:
    # `airlock run` prints the job's output once it ended, so local "streaming" hands
    # over each stream whole, then the observation.
    if observation.stdout:
        yield Chunk(stream="stdout", text=observation.stdout)
    if observation.stderr:
        yield Chunk(stream="stderr", text=observation.stderr)
    yield observation


class _Base:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        local: bool = False,
        binary: str | os.PathLike[str] | None = None,
        policy: str | os.PathLike[str] | None = None,
        backend: str | None = None,
        timeout_margin_s: float | None = None,
    ) -> None:
        chosen_url = None if local else (url or os.environ.get("AIRLOCK_URL") or None)
        self.endpoint: _http.Endpoint | None = None
        self._binary: str | None = None
        self._options: list[str] = []
        self._policy = os.fspath(policy) if policy is not None else None
        self._binary_hint = binary
        if chosen_url is not None:
            if policy is not None or backend is not None or binary is not None:
                raise ValueError("policy, backend and binary are the server's in remote mode")
            self.endpoint = _http.Endpoint.parse(
                chosen_url, token if token is not None else os.environ.get("AIRLOCK_TOKEN")
            )
        else:
            if self._policy is not None:
                self._options += ["--policy", self._policy]
            if backend is not None:
                self._options += ["--backend", backend]
        self.timeout_margin_s = (
            timeout_margin_s
            if timeout_margin_s is not None
            else (REMOTE_MARGIN_S if self.endpoint else LOCAL_MARGIN_S)
        )
        self._tool: ToolDefinition | None = None
        self._lock = threading.Lock()

    @property
    def is_remote(self) -> bool:
        """Whether jobs go to a server."""
        return self.endpoint is not None

    @property
    def binary(self) -> str:
        """The local `airlock` binary (found on first use)."""
        if self._binary is None:
            self._binary = _local.find_binary(self._binary_hint)
        return self._binary

    def tool_sync(self) -> ToolDefinition:
        """The `run_code` tool the server (or the binary, for its policy) defines, fetched
        once per client (blocking)."""
        with self._lock:
            if self._tool is None:
                if self.endpoint is not None:
                    data = _http.get_json(
                        self.endpoint, "/v1/tool-schema?format=chat", SCHEMA_TIMEOUT_S
                    )
                else:
                    data = _local.tool_schema(self.binary, self._policy, "chat", SCHEMA_TIMEOUT_S)
                if not isinstance(data, Mapping):
                    raise TransportError("the tool schema is not a JSON object")
                self._tool = ToolDefinition.from_wire(data)
            return self._tool

    def _deadline(self, request: RunRequest, tool: ToolDefinition | None) -> float:
        wall = request.timeout_s
        if wall is None and tool is not None:
            wall = tool.max_timeout_s
        return (wall if wall is not None else UNKNOWN_WALL_S) + self.timeout_margin_s


class Client(_Base):
    """Runs jobs in airlock sandboxes.

    `Client()` runs the bundled `airlock` binary (AIRLOCK_BIN overrides which) unless
    AIRLOCK_URL is set; `Client(url, token)` talks to `airlock serve` (AIRLOCK_TOKEN is
    the default token). `local=True` ignores AIRLOCK_URL. Every call waits at most the
    job's wall time (`timeout_s`, else the policy's) plus `timeout_margin_s`, so the
    client never gives up before the sandbox does. Safe to share between threads."""

    def tool(self) -> ToolDefinition:
        """The `run_code` tool the server (or the binary, for its policy) defines."""
        return self.tool_sync()

    def _timeout_for(self, request: RunRequest) -> float:
        tool = None
        if request.timeout_s is None:
            try:
                tool = self.tool()
            except AirlockError:
                tool = None
        return self._deadline(request, tool)

    def run_request(self, request: RunRequest) -> Observation:
        """Runs a prepared `RunRequest`. See `run`."""
        timeout = self._timeout_for(request)
        if self.endpoint is not None:
            observation = _http.run(self.endpoint, request.to_json(), timeout)
        else:
            observation = _local.run(self.binary, self._options, request, timeout)
        raise_for_observation(observation)
        return observation

    def run(
        self,
        source: str | bytes,
        **options: Unpack[RunOptions],
    ) -> Observation:
        """Runs `source` in a fresh sandbox and returns the observation, whatever the
        program did (a non-zero exit, a timeout and an OOM kill are observations, not
        errors). Keywords (`RunOptions`, the `RunRequest` fields): `language`
        ("python" by default; `None` for the policy's default), `files` (paths under /work
        to their content), `stdin`, `args`, `timeout_s`, `memory`, `cpus`, `pids`,
        `network`, `allow`, `env`, and `return_files`: files the job writes to /out come
        back with their bytes (`Observation.files`).

        Raises `InvalidInput`, `PolicyDenied`, `Unauthorized`, `BackendUnavailable` or
        `InternalError` when airlock could not run the job (each carries the error
        observation), and `TransportError` (`ClientTimeout`, `BinaryNotFound`) when the
        client could not reach airlock."""
        return self.run_request(build_request(source, **options))

    def stream_request(self, request: RunRequest) -> RunStream:
        """Streams a prepared `RunRequest`. See `stream`."""
        timeout = self._timeout_for(request)
        if self.endpoint is not None:
            endpoint = self.endpoint

            def remote() -> Iterator[Chunk | Observation]:
                yield from _http.stream(endpoint, request.to_json(), timeout)

            return RunStream(remote())
        binary, options = self.binary, self._options

        def local() -> Iterator[Chunk | Observation]:
            yield from _local_chunks(_local.run(binary, options, request, timeout))

        return RunStream(local())

    def stream(
        self,
        source: str | bytes,
        **options: Unpack[RunOptions],
    ) -> RunStream:
        """Runs `source` and yields its output as it arrives (`POST /v1/runs?stream=true`),
        then leaves the observation on the stream. Chunks are a live preview: the
        observation's `stdout`/`stderr` are the authoritative, bounded result. In local
        mode each stream arrives whole when the job ended."""
        return self.stream_request(build_request(source, **options))


class AsyncClient(_Base):
    """`Client` for asyncio: the same arguments and results, as coroutines. Cancelling a
    call ends its job (the CLI is terminated; the HTTP connection is closed)."""

    async def tool(self) -> ToolDefinition:
        """The `run_code` tool the server (or the binary, for its policy) defines."""
        if self._tool is None:
            if self.endpoint is not None:
                data = await _http.async_get_json(
                    self.endpoint, "/v1/tool-schema?format=chat", SCHEMA_TIMEOUT_S
                )
            else:
                data = await asyncio.to_thread(
                    _local.tool_schema, self.binary, self._policy, "chat", SCHEMA_TIMEOUT_S
                )
            if not isinstance(data, Mapping):
                raise TransportError("the tool schema is not a JSON object")
            self._tool = ToolDefinition.from_wire(data)
        return self._tool

    async def _timeout_for(self, request: RunRequest) -> float:
        tool = None
        if request.timeout_s is None:
            try:
                tool = await self.tool()
            except AirlockError:
                tool = None
        return self._deadline(request, tool)

    async def run_request(self, request: RunRequest) -> Observation:
        """Runs a prepared `RunRequest`. See `Client.run`."""
        timeout = await self._timeout_for(request)
        if self.endpoint is not None:
            observation = await _http.async_run(self.endpoint, request.to_json(), timeout)
        else:
            observation = await _local.async_run(self.binary, self._options, request, timeout)
        raise_for_observation(observation)
        return observation

    async def run(
        self,
        source: str | bytes,
        **options: Unpack[RunOptions],
    ) -> Observation:
        """See `Client.run`."""
        return await self.run_request(build_request(source, **options))

    def stream_request(self, request: RunRequest) -> AsyncRunStream:
        """Streams a prepared `RunRequest`. See `Client.stream`."""

        async def items() -> AsyncIterator[Chunk | Observation]:
            timeout = await self._timeout_for(request)
            if self.endpoint is not None:
                # aclosing: closing this stream closes the connection now, not at GC.
                async with aclosing(
                    _http.async_stream(self.endpoint, request.to_json(), timeout)
                ) as items:
                    async for item in items:
                        yield item
                return
            observation = await _local.async_run(self.binary, self._options, request, timeout)
            for item in _local_chunks(observation):
                yield item

        return AsyncRunStream(items())

    def stream(
        self,
        source: str | bytes,
        **options: Unpack[RunOptions],
    ) -> AsyncRunStream:
        """See `Client.stream`; use with `async for`."""
        return self.stream_request(build_request(source, **options))
