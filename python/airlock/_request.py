"""One job request, and how it goes on the wire: the JSON body of `POST /v1/runs`
(crates/airlock-server/src/api.rs, `RunRequest`) and the argv of `airlock run --json`
(crates/airlock-cli/src/run.rs)."""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

if TYPE_CHECKING:
    # typing.Unpack is 3.11+; the package supports 3.10 and has no runtime dependencies.
    from typing_extensions import Unpack

from .errors import InvalidInput

NetworkMode = Literal["none", "proxy"]

#: File name of the source per language in local mode (the CLI also guesses the language
#: from it, but `-l` is always given).
_SOURCE_NAMES = {"python": "main.py", "node": "main.js", "bash": "main.bash", "sh": "main.sh"}


@dataclass
class RunRequest:
    """A job: the program, its inputs and the limits it asks for (each at most the policy's)."""

    source: str | bytes
    language: str | None = "python"
    files: Mapping[str, str | bytes] = field(default_factory=dict)
    stdin: str | bytes | None = None
    args: Sequence[str] = ()
    timeout_s: float | None = None
    memory: str | None = None
    cpus: float | None = None
    pids: int | None = None
    network: NetworkMode | None = None
    allow: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    return_files: bool = False

    def __post_init__(self) -> None:
        if self.timeout_s is not None and (
            not math.isfinite(self.timeout_s) or self.timeout_s <= 0
        ):
            raise InvalidInput(f"timeout_s: {self.timeout_s} is not a positive number of seconds")
        if isinstance(self.args, str):
            raise InvalidInput("args: give a list of strings, not one string")

    def to_json(self) -> dict[str, Any]:
        """The body of `POST /v1/runs`. Only what is set is sent, so the request stays
        valid for servers that predate a field."""
        body: dict[str, Any] = {}
        if self.language is not None:
            body["language"] = self.language
        if isinstance(self.source, bytes):
            try:
                body["code"] = self.source.decode("utf-8")
            except UnicodeDecodeError:
                body["code_base64"] = base64.b64encode(self.source).decode("ascii")
        else:
            body["code"] = self.source
        if self.files:
            body["files"] = [_file_json(path, content) for path, content in self.files.items()]
        if self.stdin is not None:
            if isinstance(self.stdin, bytes):
                try:
                    body["stdin"] = self.stdin.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise InvalidInput("stdin: the HTTP API takes UTF-8 text only") from e
            else:
                body["stdin"] = self.stdin
        if self.args:
            body["args"] = list(self.args)
        if self.timeout_s is not None:
            body["timeout_s"] = self.timeout_s
        if self.memory is not None:
            body["memory"] = self.memory
        if self.cpus is not None:
            body["cpus"] = self.cpus
        if self.pids is not None:
            body["pids"] = self.pids
        if self.network is not None:
            body["network"] = self.network
        if self.allow:
            body["allow"] = list(self.allow)
        if self.env:
            body["env"] = dict(self.env)
        if self.return_files:
            body["return_files"] = True
        return body

    def to_argv(self, scratch: Path, out_dir: Path | None) -> list[str]:
        """The arguments after `airlock run` for this job; the source, the input files and
        stdin are written into `scratch` (argv cannot carry NUL bytes or a large source)."""
        # No language: no -l and a file name without extension, so the CLI picks its default.
        name = _SOURCE_NAMES.get(self.language, "source") if self.language else "source"
        source_path = scratch / name
        source = self.source.encode("utf-8") if isinstance(self.source, str) else self.source
        source_path.write_bytes(source)
        argv = ["--json"]
        if self.language is not None:
            argv += ["-l", self.language]
        inputs = scratch / "inputs"
        for i, (name, content) in enumerate(self.files.items()):
            if "=" in name:
                raise InvalidInput(f"files: {name!r}: local mode cannot pass a name with '='")
            path = inputs / str(i)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
            argv += ["--file", f"{name}={path}"]
        if self.stdin is not None:
            stdin_path = scratch / "stdin"
            data = self.stdin.encode("utf-8") if isinstance(self.stdin, str) else self.stdin
            stdin_path.write_bytes(data)
            argv += ["--stdin", str(stdin_path)]
        for name, value in self.env.items():
            argv += ["--env", f"{name}={value}"]
        if self.timeout_s is not None:
            argv += ["--timeout", f"{self.timeout_s * 1000:.3f}ms"]
        if self.memory is not None:
            argv += ["--memory", self.memory]
        if self.cpus is not None:
            argv += ["--cpus", repr(float(self.cpus))]
        if self.pids is not None:
            argv += ["--pids", str(self.pids)]
        if self.network is not None:
            argv += ["--net", self.network]
        for host in self.allow:
            argv += ["--allow", host]
        if out_dir is not None:
            argv += ["--out", str(out_dir)]
        argv.append(str(source_path))
        if self.args:
            argv += ["--", *self.args]
        return argv


class RunOptions(TypedDict, total=False):
    """The keywords of `Client.run`/`stream` and their async twins: every `RunRequest`
    field but `source`, declared once (a test holds the two to each other)."""

    language: str | None
    files: Mapping[str, str | bytes] | None
    stdin: str | bytes | None
    args: Sequence[str]
    timeout_s: float | None
    memory: str | None
    cpus: float | None
    pids: int | None
    network: NetworkMode | None
    allow: Sequence[str]
    env: Mapping[str, str] | None
    return_files: bool


def build_request(source: str | bytes, **options: Unpack[RunOptions]) -> RunRequest:
    """The one place a call's keywords become a `RunRequest`: unset keywords take the
    `RunRequest` defaults, `None` for `files`/`env` means none, sequences are copied.
    Raises `TypeError` for a keyword that is not one (as a plain signature would)."""
    unknown = sorted(set(options) - set(RunOptions.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    return RunRequest(
        source=source,
        language=options.get("language", RunRequest.language),
        files=dict(options.get("files") or {}),
        stdin=options.get("stdin"),
        args=tuple(options.get("args", ())),
        timeout_s=options.get("timeout_s"),
        memory=options.get("memory"),
        cpus=options.get("cpus"),
        pids=options.get("pids"),
        network=options.get("network"),
        allow=tuple(options.get("allow", ())),
        env=dict(options.get("env") or {}),
        return_files=options.get("return_files", RunRequest.return_files),
    )


def _file_json(path: str, content: str | bytes) -> dict[str, Any]:
    if isinstance(content, str):
        return {"path": path, "content": content}
    return {"path": path, "content_base64": base64.b64encode(content).decode("ascii")}


def read_out_dir(observation: dict[str, Any], out_dir: Path) -> None:
    """Local mode: puts the content of each released file (copied by `airlock run --out`)
    into the observation as `content_base64`, as the server does for `return_files`."""
    root = out_dir.resolve()
    for entry in observation.get("files") or []:
        if not isinstance(entry, dict) or "content_base64" in entry:
            continue
        rel = entry.get("path")
        if not isinstance(rel, str):
            continue
        path = (root / rel).resolve()
        # The CLI checked the paths; a path outside the directory is still never read.
        if root not in path.parents or not path.is_file() or path.is_symlink():
            continue
        entry["content_base64"] = base64.b64encode(path.read_bytes()).decode("ascii")
