"""`_types.py` held to the server's OpenAPI snapshot
(crates/airlock-server/src/snapshots/openapi.json): every wire field of the observation
and its parts is an attribute of the same type, the enums are the same, and an
observation with every field set parses to exactly its values. Pure: no binary."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from airlock import _types
from airlock._types import (
    NOT_ON_WIRE,
    WIRE_NAMES,
    ErrorInfo,
    NetworkCounts,
    Observation,
    OutputFile,
    RejectedFile,
)

pytestmark = pytest.mark.pure

#: The schema of each class the client parses, by the server's name for it.
CLASSES: dict[str, type[Any]] = {
    "Observation": Observation,
    "OutputFile": OutputFile,
    "ErrorInfo": ErrorInfo,
    "NetworkCounts": NetworkCounts,
    "RejectedFile": RejectedFile,
}
SNAPSHOT_IN_REPO = Path(__file__).resolve().parents[2] / (
    "crates/airlock-server/src/snapshots/openapi.json"
)


@pytest.fixture(scope="module")
def schemas() -> dict[str, Any]:
    # python/ci.sh runs the tests from a copy, so it names the snapshot in the checkout.
    path = Path(os.environ.get("AIRLOCK_OPENAPI_SNAPSHOT") or SNAPSHOT_IN_REPO)
    if not path.is_file():
        if os.environ.get("AIRLOCK_CI_WHEEL") == "1":
            pytest.fail(f"the OpenAPI snapshot is missing in CI: {path}")
        pytest.skip(f"no OpenAPI snapshot at {path} (not a checkout of the repository)")
    document = json.loads(path.read_text())
    found: dict[str, Any] = document["components"]["schemas"]
    return found


def _wire_fields(cls: type[Any]) -> dict[str, str]:
    """wire name -> attribute name, for every attribute that is on the wire."""
    renames = WIRE_NAMES.get(cls.__name__, {})
    skipped = NOT_ON_WIRE.get(cls.__name__, frozenset())
    return {
        renames.get(f.name, f.name): f.name
        for f in dataclasses.fields(cls)
        if f.name not in skipped
    }


def _shape_of_type(tp: Any) -> Any:
    """A comparable shape of a Python annotation."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return frozenset(_shape_of_type(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return frozenset({("list", _shape_of_type(item))})
    if tp is type(None):
        return frozenset({"null"})
    return frozenset({tp.__name__})


def _flat(shape: frozenset[Any]) -> frozenset[Any]:
    out: set[Any] = set()
    for s in shape:
        out |= _flat(s) if isinstance(s, frozenset) else {s}
    return frozenset(out)


def _shape_of_schema(node: dict[str, Any], schemas: dict[str, Any], wire_name: str) -> Any:
    """The Python shape a schema node must have in `_types.py`."""
    if wire_name == "content_base64":  # decoded: the bytes, or none
        return frozenset({"bytes", "null"})
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/components/schemas/")
        if name in CLASSES:
            return frozenset({name})
        return _shape_of_schema(schemas[name], schemas, wire_name)
    if "anyOf" in node:
        return _flat(frozenset(_shape_of_schema(n, schemas, wire_name) for n in node["anyOf"]))
    kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
    shape: set[Any] = set()
    for kind in kinds:
        if kind == "array":
            shape.add(("list", _shape_of_schema(node["items"], schemas, wire_name)))
        else:
            shape.add({"integer": "int", "string": "str", "boolean": "bool", "null": "null"}[kind])
    return frozenset(shape)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_wire_field_is_an_attribute_of_its_type(name: str, schemas: dict[str, Any]) -> None:
    cls = CLASSES[name]
    schema = schemas[name]
    fields = _wire_fields(cls)
    assert set(fields) == set(schema["properties"]), f"{name} and the OpenAPI schema differ"
    hints = typing.get_type_hints(cls, vars(_types))
    for wire_name, attribute in fields.items():
        expected = _shape_of_schema(schema["properties"][wire_name], schemas, wire_name)
        assert _flat(_shape_of_type(hints[attribute])) == expected, f"{name}.{attribute}"
        if wire_name in schema.get("required", []) and "null" not in expected:
            # A required, non-nullable wire field is never optional here either.
            assert "null" not in _flat(_shape_of_type(hints[attribute])), f"{name}.{attribute}"


def test_the_enums_are_the_servers(schemas: dict[str, Any]) -> None:
    assert set(typing.get_args(_types.Outcome)) == set(schemas["Outcome"]["enum"])
    assert set(typing.get_args(_types.ErrorKindName)) == set(schemas["ErrorKind"]["enum"])


def _example(node: dict[str, Any], schemas: dict[str, Any], name: str) -> Any:
    """A value for every property a schema node has (non-null where it may be)."""
    if "$ref" in node:
        return _example(schemas[node["$ref"].removeprefix("#/components/schemas/")], schemas, name)
    if "anyOf" in node:
        return _example(next(n for n in node["anyOf"] if n.get("type") != "null"), schemas, name)
    if "enum" in node:
        return node["enum"][-1]
    kinds = node["type"] if isinstance(node["type"], list) else [node["type"]]
    kind = next(k for k in kinds if k != "null")
    if kind == "object":
        return {k: _example(v, schemas, k) for k, v in node["properties"].items()}
    if kind == "array":
        return [_example(node["items"], schemas, name)]
    if kind == "integer":
        return 7
    if kind == "boolean":
        return True
    if name == "content_base64":
        return base64.b64encode(b"bytes").decode()
    return f"a {name}"


def test_an_observation_with_every_field_parses_to_its_values(schemas: dict[str, Any]) -> None:
    wire = _example(schemas["Observation"], schemas, "observation")
    observation = Observation.from_dict(wire)
    assert observation.raw == wire

    def check(obj: Any, data: dict[str, Any]) -> None:
        for wire_name, attribute in _wire_fields(type(obj)).items():
            value, sent = getattr(obj, attribute), data[wire_name]
            if dataclasses.is_dataclass(value):
                check(value, sent)
            elif isinstance(value, list) and value and dataclasses.is_dataclass(value[0]):
                for v, s in zip(value, sent, strict=True):
                    check(v, s)
            elif wire_name == "content_base64":
                assert value == base64.b64decode(sent)
            else:
                assert value == sent, f"{type(obj).__name__}.{attribute}"

    check(observation, wire)
    # An error body (ErrorBody: a request refused before the engine saw it) parses too.
    body = _example(schemas["ErrorBody"], schemas, "error")
    body.pop("job_id")
    refused = Observation.from_dict(body)
    assert refused.error is not None and refused.error.kind == body["error"]["kind"]
