"""The observation (DESIGN §2) as typed Python objects, and the other values the client
hands back. Field names follow the wire names, except `OutputFile.size` (wire: `bytes`,
which would shadow the builtin type)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Outcome = Literal["exited", "timeout", "oom", "killed", "output_limit", "error"]
ErrorKindName = Literal[
    "invalid_input", "policy_denied", "unauthorized", "backend_unavailable", "internal"
]
StreamName = Literal["stdout", "stderr"]


#: Attribute names that differ from the wire's, per class (`OutputFile.size` would
#: otherwise shadow `bytes`; `content` holds the decoded `content_base64`), and the
#: attributes that are not on the wire at all. tests/test_openapi.py holds every other
#: attribute to the server's OpenAPI schema of the same name.
WIRE_NAMES: dict[str, dict[str, str]] = {
    "OutputFile": {"size": "bytes", "content": "content_base64"}
}
NOT_ON_WIRE: dict[str, frozenset[str]] = {"Observation": frozenset({"raw"})}


class ObservationFormatError(ValueError):
    """A response that is not an observation (a proxy's error page, a different server)."""


def _str(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str):
        raise ObservationFormatError(f"observation field {key!r}: expected a string")
    return value


def _int(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ObservationFormatError(f"observation field {key!r}: expected an integer")
    return value


def _opt_int(data: Mapping[str, Any], key: str) -> int | None:
    return None if data.get(key) is None else _int(data, key)


def _opt_str(data: Mapping[str, Any], key: str) -> str | None:
    return None if data.get(key) is None else _str(data, key)


def _bool(data: Mapping[str, Any], key: str) -> bool:
    value = data.get(key)
    if not isinstance(value, bool):
        raise ObservationFormatError(f"observation field {key!r}: expected true or false")
    return value


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ObservationFormatError(f"observation field {key!r}: expected a list")
    return value


@dataclass(frozen=True)
class ErrorInfo:
    """An executor-side failure: the job did not run (or could not finish)."""

    kind: str
    """One of `invalid_input`, `policy_denied`, `unauthorized`, `backend_unavailable`,
    `internal` (a newer server may add kinds)."""
    message: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ErrorInfo:
        """Parses the wire `error` object."""
        return cls(kind=_str(data, "kind"), message=_str(data, "message"))


@dataclass(frozen=True)
class RejectedFile:
    """A file of /out that was not released, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class NetworkCounts:
    """What went through the egress proxy (proxy mode only)."""

    connections: int
    denied: int
    bytes_up: int
    bytes_down: int
    limit_hit: str | None
    secrets_substituted: int = 0
    """Placeholders of secrets the proxy replaced by their real values (a count only)."""
    secrets_scrubbed: int = 0
    """Real values of secrets the proxy replaced by placeholders in answers."""


@dataclass
class OutputFile:
    """A file the job released from /out. Its bytes are there when the run asked for
    files (`return_files=True`) and the file fit the policy's inline cap."""

    path: str
    size: int
    """Size in bytes (wire name `bytes`)."""
    sha256: str
    media_type: str
    redactions: int
    content: bytes | None = field(default=None, repr=False)

    @property
    def has_content(self) -> bool:
        """Whether the file's bytes came back with the observation."""
        return self.content is not None

    def read(self) -> bytes:
        """The released bytes, checked against the observation's size and SHA-256.

        Raises `LookupError` when they did not come back (the run did not ask for files,
        or the file was over the inline cap) and `ValueError` when they do not match."""
        if self.content is None:
            raise LookupError(
                f"{self.path}: the content was not returned "
                "(run with return_files=True; files over the policy's inline cap are listed only)"
            )
        if (
            len(self.content) != self.size
            or hashlib.sha256(self.content).hexdigest() != self.sha256
        ):
            raise ValueError(f"{self.path}: the content does not match its size and sha256")
        return self.content

    def text(self, encoding: str = "utf-8") -> str:
        """The released bytes decoded as text."""
        return self.read().decode(encoding)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Writes the bytes to `path`; a directory gets the file's own name inside it.
        Returns the path written."""
        target = Path(path)
        if target.is_dir():
            target = target / Path(self.path).name
        target.write_bytes(self.read())
        return target

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OutputFile:
        """Parses one entry of the wire `files` list, decoding `content_base64`."""
        content: bytes | None = None
        encoded = data.get("content_base64")
        if isinstance(encoded, str):
            content = base64.b64decode(encoded, validate=True)
        return cls(
            path=_str(data, "path"),
            size=_int(data, "bytes"),
            sha256=_str(data, "sha256"),
            media_type=_str(data, "media_type"),
            redactions=_int(data, "redactions"),
            content=content,
        )


@dataclass
class Observation:
    """The bounded result of one job, exactly as airlock sent it (`raw`), with typed
    attributes. `ok` is true only when the program exited with code 0."""

    job_id: str
    ok: bool
    outcome: str
    """`exited`, `timeout`, `oom`, `killed`, `output_limit` or `error`."""
    exit_code: int | None
    signal: str | None
    stdout: str
    stderr: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    redactions: int
    duration_ms: int
    cpu_ms: int | None
    peak_memory_bytes: int | None
    files: list[OutputFile]
    backend: str
    image_digest: str | None
    policy_version: str
    error: ErrorInfo | None = None
    network: NetworkCounts | None = None
    rejected_files: list[RejectedFile] = field(default_factory=list)
    degraded: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    """The observation's JSON object as received (file contents included)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Observation:
        """Parses an observation object. Raises `ObservationFormatError` when it is not one."""
        if not isinstance(data, Mapping):
            raise ObservationFormatError("an observation is a JSON object")
        error = data.get("error")
        network = data.get("network")
        return cls(
            # An error refused before the engine saw it has no job id.
            job_id=_opt_str(data, "job_id") or "",
            ok=_bool(data, "ok"),
            outcome=_str(data, "outcome"),
            exit_code=_opt_int(data, "exit_code"),
            signal=_opt_str(data, "signal"),
            stdout=str(data.get("stdout", "")),
            stderr=str(data.get("stderr", "")),
            stdout_bytes=int(data.get("stdout_bytes", 0)),
            stderr_bytes=int(data.get("stderr_bytes", 0)),
            stdout_truncated=bool(data.get("stdout_truncated", False)),
            stderr_truncated=bool(data.get("stderr_truncated", False)),
            redactions=int(data.get("redactions", 0)),
            duration_ms=int(data.get("duration_ms", 0)),
            cpu_ms=_opt_int(data, "cpu_ms"),
            peak_memory_bytes=_opt_int(data, "peak_memory_bytes"),
            files=[OutputFile.from_dict(f) for f in _list(data, "files")],
            backend=str(data.get("backend", "")),
            image_digest=_opt_str(data, "image_digest"),
            policy_version=str(data.get("policy_version", "")),
            error=ErrorInfo.from_dict(error) if isinstance(error, Mapping) else None,
            network=(
                NetworkCounts(
                    connections=_int(network, "connections"),
                    denied=_int(network, "denied"),
                    bytes_up=_int(network, "bytes_up"),
                    bytes_down=_int(network, "bytes_down"),
                    limit_hit=_opt_str(network, "limit_hit"),
                    secrets_substituted=_opt_int(network, "secrets_substituted") or 0,
                    secrets_scrubbed=_opt_int(network, "secrets_scrubbed") or 0,
                )
                if isinstance(network, Mapping)
                else None
            ),
            rejected_files=[
                RejectedFile(path=_str(r, "path"), reason=_str(r, "reason"))
                for r in _list(data, "rejected_files")
            ],
            degraded=[str(d) for d in _list(data, "degraded")],
            raw=dict(data),
        )

    def file(self, path: str) -> OutputFile:
        """The released file at `path` (relative to /out). Raises `KeyError`."""
        for f in self.files:
            if f.path == path:
                return f
        raise KeyError(path)

    def to_dict(self, *, include_content: bool = False) -> dict[str, Any]:
        """The observation's JSON object. File contents (`content_base64`) are left out
        unless asked for: they are for the host, not for a model's context."""
        data = json.loads(json.dumps(self.raw))
        if not include_content:
            for f in data.get("files") or []:
                if isinstance(f, dict):
                    f.pop("content_base64", None)
        assert isinstance(data, dict)
        return data

    def to_json(self, *, include_content: bool = False) -> str:
        """The observation as compact JSON: what a tool hands the model. It is as bounded
        as the observation (the policy's output caps); contents are left out by default."""
        return json.dumps(self.to_dict(include_content=include_content), ensure_ascii=False)


@dataclass(frozen=True)
class Chunk:
    """A piece of the job's output as it arrived (escaped like the observation's)."""

    stream: StreamName
    text: str
