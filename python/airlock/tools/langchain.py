"""The `run_code` tool as a LangChain `BaseTool`, for LangGraph's `ToolNode` and
`create_react_agent` and anything else that runs LangChain tools.

The `ToolMessage` content is the observation JSON the model sees; its `artifact` is the
typed `Observation` (with /out file bytes), for failed runs too.

    from airlock.tools.langchain import RunCodeTool
    tool = RunCodeTool()                       # local; RunCodeTool(client=Client(url, token))
    ToolNode([tool])
"""

from __future__ import annotations

from typing import Any, Literal

try:
    from langchain_core.tools import BaseTool, ToolException
except ImportError as e:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        "airlock.tools.langchain needs its extra: pip install 'airlock-sandbox[langchain]'"
    ) from e
from pydantic import ConfigDict, Field

from .._types import Observation
from ..client import AsyncClient, Client
from ..errors import TransportError
from . import arun_call, run_call


class RunCodeTool(BaseTool):
    """airlock's `run_code`: name, description and JSON schema from the server."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"
    client: Client = Field(exclude=True)
    async_client: AsyncClient | None = Field(default=None, exclude=True)
    return_files: bool = True
    """Whether files the job writes to /out come back (their bytes in the artifact)."""

    def __init__(
        self,
        client: Client | None = None,
        *,
        async_client: AsyncClient | None = None,
        return_files: bool = True,
        **kwargs: Any,
    ) -> None:
        client = client or Client()
        tool = client.tool()
        kwargs.setdefault("name", tool.name)
        kwargs.setdefault("description", tool.description)
        kwargs.setdefault("args_schema", tool.parameters)
        super().__init__(
            client=client, async_client=async_client, return_files=return_files, **kwargs
        )

    def _run(self, **arguments: Any) -> tuple[str, Observation]:
        # LangChain passes its run manager as a keyword when _run declares it; this one
        # does not, so `arguments` are the model's alone.
        try:
            observation = run_call(self.client, arguments, return_files=self.return_files)
        except TransportError as e:
            raise ToolException(f"airlock is unreachable: {e}") from e
        return observation.to_json(), observation

    async def _arun(self, **arguments: Any) -> tuple[str, Observation]:
        if self.async_client is None:
            return await super()._arun(**arguments)  # type: ignore[no-any-return]
        try:
            observation = await arun_call(
                self.async_client, arguments, return_files=self.return_files
            )
        except TransportError as e:
            raise ToolException(f"airlock is unreachable: {e}") from e
        return observation.to_json(), observation
