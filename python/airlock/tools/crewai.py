"""The `run_code` tool as a CrewAI `BaseTool`.

CrewAI wants a pydantic model for the arguments; it is built from the server's JSON
schema (so the languages and limits are the policy's), not written down twice.

    from airlock.tools.crewai import RunCodeTool
    Agent(role=..., goal=..., backstory=..., tools=[RunCodeTool(out_dir="outputs")])

CrewAI has no failure flag for a tool's result: the model reads `ok`/`outcome` in the
JSON, and the host gets the typed `Observation` (file bytes included) through
`on_observation` and the released files under `out_dir`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

try:
    from crewai.tools import BaseTool
except ImportError as e:  # pragma: no cover - depends on the extras installed
    raise ImportError(
        "airlock.tools.crewai needs its extra: pip install 'airlock-sandbox[crewai]'"
    ) from e
from pydantic import BaseModel, ConfigDict, Field, create_model

from .._types import Observation
from ..client import Client
from . import HostFiles, run_call


def _python_type(schema: Mapping[str, Any], name: str) -> Any:
    """The Python type of a JSON-schema node (the subset the tool schema uses)."""
    types = schema.get("type", "string")
    type_list = list(types) if isinstance(types, list) else [types]
    nullable = "null" in type_list
    main = next((t for t in type_list if t != "null"), "string")
    python: Any
    if "enum" in schema:
        python = Literal[tuple(schema["enum"])]
    elif main == "string":
        python = str
    elif main == "number":
        python = float
    elif main == "integer":
        python = int
    elif main == "boolean":
        python = bool
    elif main == "array":
        python = list[_python_type(schema.get("items") or {}, name + "Item")]  # type: ignore[misc]
    elif main == "object" and "properties" in schema:
        python = model_from_schema(schema, name)
    else:
        python = dict[str, Any]
    return python | None if nullable else python


def model_from_schema(schema: Mapping[str, Any], name: str) -> type[BaseModel]:
    """A pydantic model of a JSON-schema object (references to `$defs` resolved)."""
    schema = _resolve(schema, schema.get("$defs") or {})
    required = set(schema.get("required") or [])
    fields: dict[str, Any] = {}
    for prop, sub in (schema.get("properties") or {}).items():
        python = _python_type(sub, name + prop.title().replace("_", ""))
        # Bounds (timeout_s's maximum) stay in the description, not the model: airlock
        # judges them, so the agent gets the policy's own refusal, as with every framework.
        description = sub.get("description")
        types = sub.get("type")
        nullable = isinstance(types, list) and "null" in types
        # A strict schema requires every property, the optional ones as nullable; a
        # ReAct-style model leaves them out, which means null.
        if prop in required and not nullable:
            fields[prop] = (python, Field(..., description=description))
        else:
            fields[prop] = (python | None, Field(None, description=description))
    model: type[BaseModel] = create_model(name, __config__=ConfigDict(extra="forbid"), **fields)
    return model


def _resolve(node: Any, definitions: Mapping[str, Any]) -> Any:
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _resolve(definitions.get(ref.removeprefix("#/$defs/"), {}), definitions)
        return {k: _resolve(v, definitions) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_resolve(v, definitions) for v in node]
    return node


class RunCodeTool(BaseTool):
    """airlock's `run_code`, returning the observation JSON to the agent."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: Client = Field(exclude=True)
    return_files: bool = True
    host: HostFiles = Field(default_factory=HostFiles, exclude=True)
    """Where the host gets each observation and its files (`out_dir`, `on_observation`)."""

    def __init__(
        self,
        client: Client | None = None,
        *,
        return_files: bool = True,
        out_dir: str | os.PathLike[str] | None = None,
        on_observation: Callable[[Observation], None] | None = None,
        **kwargs: Any,
    ):
        client = client or Client()
        tool = client.tool()
        kwargs.setdefault("name", tool.name)
        kwargs.setdefault("description", tool.description)
        kwargs.setdefault("args_schema", model_from_schema(tool.parameters, "RunCodeArguments"))
        kwargs.update(
            client=client,
            return_files=return_files,
            host=HostFiles(out_dir=out_dir, on_observation=on_observation),
        )
        super().__init__(**kwargs)

    def _run(self, **arguments: Any) -> str:
        # CrewAI validated the arguments against args_schema and passes every field,
        # unused ones as None, which the tool takes as absent.
        observation = run_call(
            self.client, arguments, return_files=self.return_files, host=self.host
        )
        return observation.to_json()
