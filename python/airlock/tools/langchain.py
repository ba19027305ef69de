"""The `run_code` tool as a LangChain `BaseTool`, for LangGraph's `ToolNode` and
`create_react_agent` and anything else that runs LangChain tools.

The `ToolMessage` content is the observation JSON the model sees; its `artifact` is the
typed `Observation` (with /out file bytes), for failed runs too, and its `status` is
`"error"` when the job did not succeed (`airlock.tools.job_failed`: a non-zero exit, a
timeout, a refusal).

    from airlock.tools.langchain import RunCodeTool
    tool = RunCodeTool()                       # local; RunCodeTool(client=Client(url, token))
    ToolNode([tool])

`SessionRunCodeTool` keeps state across a conversation's turns: one airlock session per
LangGraph thread (`airlock serve` with `[sessions]` enabled).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Any, Literal

try:
    from langchain_core.messages import ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, ToolException
except ImportError as e:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        "airlock.tools.langchain needs its extra: pip install 'airlock-sandbox[langchain]'"
    ) from e
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from .._types import Observation
from ..client import AsyncClient, Client
from ..errors import SessionNotFound, TransportError
from ..sandbox import Execution, Sandbox
from . import (
    SESSION_TOOL_DESCRIPTION,
    HostFiles,
    arun_call,
    execution_answer,
    execution_failed,
    job_failed,
    run_call,
)


def _flag_failure(output: Any) -> Any:
    # BaseTool builds the ToolMessage with status "success" unless the tool raised; a job
    # that did not succeed is still the observation (content and artifact), flagged error.
    if isinstance(output, ToolMessage) and (
        (isinstance(output.artifact, Observation) and job_failed(output.artifact))
        or (isinstance(output.artifact, Execution) and execution_failed(output.artifact))
    ):
        output.status = "error"
    return output


class RunCodeTool(BaseTool):
    """airlock's `run_code`: name, description and JSON schema from the server."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    client: Client = Field(exclude=True)
    async_client: AsyncClient | None = Field(default=None, exclude=True)
    return_files: bool = True
    """Whether files the job writes to /out come back (their bytes in the artifact)."""
    host: HostFiles = Field(default_factory=HostFiles, exclude=True)
    """Where else the host gets each observation and its files (`out_dir`, `on_observation`)."""

    def __init__(
        self,
        client: Client | None = None,
        *,
        async_client: AsyncClient | None = None,
        return_files: bool = True,
        out_dir: str | os.PathLike[str] | None = None,
        on_observation: Callable[[Observation], None] | None = None,
        **kwargs: Any,
    ) -> None:
        client = client or Client()
        tool = client.tool()
        kwargs.setdefault("name", tool.name)
        kwargs.setdefault("description", tool.description)
        kwargs.setdefault("args_schema", tool.parameters)
        super().__init__(
            client=client,
            async_client=async_client,
            return_files=return_files,
            host=HostFiles(out_dir=out_dir, on_observation=on_observation),
            **kwargs,
        )

    def run(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        """`BaseTool.run`, with the `ToolMessage` flagged `status="error"` when the job did
        not succeed."""
        return _flag_failure(super().run(tool_input, *args, **kwargs))

    async def arun(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        """`BaseTool.arun`, flagged as `run` is."""
        return _flag_failure(await super().arun(tool_input, *args, **kwargs))

    def _run(self, **arguments: Any) -> tuple[str, Observation]:
        # LangChain passes its run manager as a keyword when _run declares it; this one
        # does not, so `arguments` are the model's alone.
        try:
            observation = run_call(
                self.client, arguments, return_files=self.return_files, host=self.host
            )
        except TransportError as e:
            raise ToolException(f"airlock is unreachable: {e}") from e
        return observation.to_json(), observation

    async def _arun(self, **arguments: Any) -> tuple[str, Observation]:
        if self.async_client is None:
            return await super()._arun(**arguments)  # type: ignore[no-any-return]
        try:
            observation = await arun_call(
                self.async_client, arguments, return_files=self.return_files, host=self.host
            )
        except TransportError as e:
            raise ToolException(f"airlock is unreachable: {e}") from e
        return observation.to_json(), observation


class SessionCodeInput(BaseModel):
    """The arguments of the session tool."""

    code: str = Field(description="Python code to run; the last expression's value is returned")
    timeout_s: float | None = Field(
        default=None, description="This call's wall time in seconds (the policy's by default)"
    )


class SessionRunCodeTool(BaseTool):
    """`run_code` with state across an agent's turns: one airlock session (a kernel
    session of `airlock serve`, docs/sessions.md) per LangGraph conversation thread,
    keyed on the `thread_id` of the run's config (`{"configurable": {"thread_id": ...}}`,
    what a checkpointer uses). A run without a thread id uses one shared `default` session.

    The `ToolMessage` content is JSON for the model; the artifact is the `Execution`
    (figures as PNG results). A session that ended (idle, ttl) is replaced by a new one,
    and the answer says so (`new_session`): state is never lost silently. `close()` (or
    `with SessionRunCodeTool(...) as tool:`) ends every session the tool opened.

        tool = SessionRunCodeTool(url="http://127.0.0.1:8080", token=...)
        agent = create_react_agent(model, [tool], checkpointer=MemorySaver())
        agent.invoke(inputs, {"configurable": {"thread_id": "user-42"}})
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = "run_code"
    description: str = SESSION_TOOL_DESCRIPTION
    args_schema: type[BaseModel] = SessionCodeInput
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    url: str | None = Field(default=None, exclude=True)
    token: str | None = Field(default=None, exclude=True, repr=False)
    timeout_s: float = 60.0
    """Time allowed for a request to the server, beyond a call's own wall time."""

    _sessions: dict[str, Sandbox] = PrivateAttr(default_factory=dict)
    _lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def session_for(self, thread_id: str) -> tuple[Sandbox, bool]:
        """The thread's sandbox, and whether it was just created."""
        with self._lock:
            sandbox = self._sessions.get(thread_id)
            if sandbox is not None:
                return sandbox, False
            sandbox = Sandbox.create(self.url, self.token, timeout_s=self.timeout_s)
            self._sessions[thread_id] = sandbox
            return sandbox, True

    def close_thread(self, thread_id: str) -> None:
        """Ends one thread's session (its variables and files are destroyed)."""
        with self._lock:
            sandbox = self._sessions.pop(thread_id, None)
        if sandbox is not None:
            sandbox.kill()

    def close(self) -> None:
        """Ends every session this tool opened."""
        with self._lock:
            sandboxes, self._sessions = list(self._sessions.values()), {}
        for sandbox in sandboxes:
            sandbox.kill()

    def run(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        """`BaseTool.run`, with the `ToolMessage` flagged `status="error"` when the job did
        not succeed or the code raised."""
        return _flag_failure(super().run(tool_input, *args, **kwargs))

    async def arun(self, tool_input: Any, *args: Any, **kwargs: Any) -> Any:
        """`BaseTool.arun`, flagged as `run` is."""
        return _flag_failure(await super().arun(tool_input, *args, **kwargs))

    def __enter__(self) -> SessionRunCodeTool:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _run(
        self, code: str, config: RunnableConfig, timeout_s: float | None = None
    ) -> tuple[str, Execution]:
        thread_id = str((config.get("configurable") or {}).get("thread_id") or "default")
        try:
            sandbox, new = self.session_for(thread_id)
            replaced = False
            try:
                execution = sandbox.run_code(code, timeout_s=timeout_s)
            except SessionNotFound:
                # Ended by its idle time or ttl: a fresh one, and the model is told.
                with self._lock:
                    if self._sessions.get(thread_id) is sandbox:
                        del self._sessions[thread_id]
                sandbox, new = self.session_for(thread_id)
                replaced = True
                execution = sandbox.run_code(code, timeout_s=timeout_s)
        except TransportError as e:
            raise ToolException(f"airlock is unreachable: {e}") from e
        answer = execution_answer(execution)
        answer["session"] = {"thread_id": thread_id, "id": sandbox.id}
        if replaced:
            answer["new_session"] = (
                "this conversation's previous session had ended (idle or ttl): variables "
                "and files from earlier calls are gone"
            )
        elif new:
            answer["new_session"] = "the first call of this conversation"
        return json.dumps(answer), execution
