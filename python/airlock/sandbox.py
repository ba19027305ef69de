"""Sessions as E2B-style sandboxes: `Sandbox.create()`, `run_code()` returning an
`Execution` (`logs`, `results`, `error`), `files.write/read/list`, `kill()`, and a context
manager that always ends the session. Remote only: sessions live in `airlock serve`
(docs/sessions.md), which must enable them in its policy."""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from . import _http
from ._types import Observation
from .errors import SessionNotFound, TransportError, error_for

#: Time allowed beyond a call's wall time (sandbox setup, a kernel restart).
CALL_MARGIN_S = 40.0


@dataclass(frozen=True)
class Logs:
    """A call's output, as E2B shows it: lists of text pieces."""

    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Result:
    """One result of a call, as E2B shows it: the cell's value (`text`, the repr of its last
    expression, and `html` when the call asked for it and the value has one, a pandas
    DataFrame's table), or a matplotlib figure left open at the end of the call (`png`,
    base64, as E2B gives it; `png_bytes` decoded)."""

    text: str | None = None
    html: str | None = None
    png: str | None = field(default=None, repr=False)
    is_main_result: bool = True

    @property
    def png_bytes(self) -> bytes | None:
        """The figure's PNG bytes."""
        return base64.b64decode(self.png) if self.png is not None else None

    def formats(self) -> list[str]:
        """The formats this result has: `text`, `html`, `png`."""
        return [name for name in ("text", "html", "png") if getattr(self, name) is not None]


@dataclass(frozen=True)
class ExecutionError:
    """The exception a call raised; the traceback is the call's stderr."""

    name: str
    value: str
    traceback: str


@dataclass(frozen=True)
class Execution:
    """One call's result."""

    logs: Logs
    results: list[Result]
    error: ExecutionError | None
    observation: Observation
    kernel_restarted: str | None

    @property
    def text(self) -> str | None:
        """The main result's text, when there is one."""
        main = [r for r in self.results if r.is_main_result]
        return main[0].text if main else None


@dataclass(frozen=True)
class EntryInfo:
    """A file of the sandbox's /work."""

    path: str
    bytes: int


def _endpoint(url: str | None, token: str | None) -> _http.Endpoint:
    chosen = url or os.environ.get("AIRLOCK_URL")
    if not chosen:
        raise TransportError("a Sandbox needs airlock serve: pass url or set AIRLOCK_URL")
    return _http.Endpoint.parse(chosen, token or os.environ.get("AIRLOCK_TOKEN"))


def _decode(status: int, body: bytes, what: str) -> Any:
    if status in (200, 201):
        return json.loads(body) if body else None
    if status == 204:
        return None
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        error = {}
    message = str(error.get("message") or f"{what}: HTTP {status}")
    if status == 404:
        raise SessionNotFound(message, status=status)
    raise error_for(str(error.get("kind")), message, status=status)


#: The names a kernel call's files have (crates/airlock-engine/src/kernel_driver.py).
_FIGURE = re.compile(r"figure-(\d+)\.png")
_VALUE_HTML = "value.html"


def _results(observation: Observation, value: object) -> list[Result]:
    """The figures in the order they were made, then the cell's value (E2B's order)."""
    figures: list[tuple[int, Result]] = []
    html: str | None = None
    for f in observation.files:
        match = _FIGURE.fullmatch(f.path)
        if match and f.media_type == "image/png" and f.content is not None:
            png = base64.b64encode(f.read()).decode()
            figures.append((int(match.group(1)), Result(png=png, is_main_result=False)))
        elif f.path == _VALUE_HTML and f.content is not None:
            html = f.text()
    results = [r for _, r in sorted(figures, key=lambda item: item[0])]
    if isinstance(value, str) or html is not None:
        results.append(Result(text=value if isinstance(value, str) else None, html=html))
    return results


def _execution(data: dict[str, Any]) -> Execution:
    observation = Observation.from_dict(data["observation"])
    value = data.get("value")
    err = data.get("error")
    return Execution(
        logs=Logs(
            stdout=[observation.stdout] if observation.stdout else [],
            stderr=[observation.stderr] if observation.stderr else [],
        ),
        results=_results(observation, value),
        error=ExecutionError(str(err["name"]), str(err["value"]), observation.stderr)
        if isinstance(err, dict)
        else None,
        observation=observation,
        kernel_restarted=data.get("kernel_restarted"),
    )


def _quote(path: str) -> str:
    return urllib.parse.quote(path, safe="/")


def _run_body(code: str, language: str | None, timeout_s: float | None, html: bool) -> bytes:
    body: dict[str, Any] = {"code": code}
    if language is not None:
        body["language"] = language
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if html:
        body["html"] = True
    return json.dumps(body).encode()


class _SyncCaller:
    def __init__(self, endpoint: _http.Endpoint, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        raw: bool = False,
        timeout_s: float | None = None,
    ) -> Any:
        wait = timeout_s or self.timeout_s
        conn, response = _http.request(
            self.endpoint,
            method,
            path,
            body,
            timeout_s=wait,
            content_type="application/octet-stream" if raw else "application/json",
        )
        try:
            data = _http._read_bounded(response, wait)
        finally:
            conn.close()
        if raw and method == "GET" and response.status == 200:
            return data
        return _decode(response.status, data, f"{method} {path}")


class Files:
    """The sandbox's /work."""

    def __init__(self, caller: _SyncCaller, session: str) -> None:
        self._caller = caller
        self._base = f"/v1/sessions/{session}/files"

    def write(self, path: str, data: str | bytes) -> None:
        content = data.encode() if isinstance(data, str) else data
        self._caller.call("PUT", f"{self._base}/{_quote(path)}", content, raw=True)

    def read(self, path: str) -> bytes:
        data: bytes = self._caller.call("GET", f"{self._base}/{_quote(path)}", raw=True)
        return data

    def list(self) -> list[EntryInfo]:
        data = self._caller.call("GET", self._base)
        return [EntryInfo(str(f["path"]), int(f["bytes"])) for f in data["files"]]


class Sandbox:
    """A session of `airlock serve`. Use `Sandbox.create()`, ideally as a context manager
    (`with Sandbox.create() as sbx:`), which ends the session whatever happens."""

    def __init__(self, caller: _SyncCaller, info: dict[str, Any]) -> None:
        self._caller = caller
        self.id: str = str(info["id"])
        self.mode: str = str(info["mode"])
        self.files = Files(caller, self.id)

    @classmethod
    def create(
        cls, url: str | None = None, token: str | None = None, *, timeout_s: float = 60.0
    ) -> Sandbox:
        caller = _SyncCaller(_endpoint(url, token), timeout_s)
        return cls(caller, caller.call("POST", "/v1/sessions", b"{}"))

    def run_code(
        self,
        code: str,
        *,
        language: str | None = None,
        timeout_s: float | None = None,
        html: bool = False,
    ) -> Execution:
        """Runs `code` in the sandbox. In a kernel session, figures left open come back as
        PNG results and the last expression's value as the main result; `html=True` adds
        the value's HTML when it has one (a DataFrame's table)."""
        wait = (timeout_s or 0.0) + CALL_MARGIN_S + self._caller.timeout_s
        data = self._caller.call(
            "POST",
            f"/v1/sessions/{self.id}/runs",
            _run_body(code, language, timeout_s, html),
            timeout_s=wait,
        )
        return _execution(data)

    def kill(self) -> None:
        """Ends the session (its sandbox and files are destroyed); already gone is fine."""
        try:
            self._caller.call("DELETE", f"/v1/sessions/{self.id}")
        except SessionNotFound:
            pass

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *_: object) -> None:
        self.kill()


class AsyncFiles:
    """The sandbox's /work (async)."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox
        self._base = f"/v1/sessions/{sandbox.id}/files"

    async def write(self, path: str, data: str | bytes) -> None:
        content = data.encode() if isinstance(data, str) else data
        await self._sandbox._call("PUT", f"{self._base}/{_quote(path)}", content, raw=True)

    async def read(self, path: str) -> bytes:
        data: bytes = await self._sandbox._call("GET", f"{self._base}/{_quote(path)}", raw=True)
        return data

    async def list(self) -> list[EntryInfo]:
        data = await self._sandbox._call("GET", self._base)
        return [EntryInfo(str(f["path"]), int(f["bytes"])) for f in data["files"]]


class AsyncSandbox:
    """The async twin of `Sandbox`: `await AsyncSandbox.create()`, `async with`."""

    def __init__(self, endpoint: _http.Endpoint, timeout_s: float, info: dict[str, Any]) -> None:
        self._endpoint = endpoint
        self._timeout_s = timeout_s
        self.id: str = str(info["id"])
        self.mode: str = str(info["mode"])
        self.files = AsyncFiles(self)

    async def _call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        raw: bool = False,
        timeout_s: float | None = None,
    ) -> Any:
        return await _async_call(
            self._endpoint, method, path, body, raw=raw, timeout_s=timeout_s or self._timeout_s
        )

    @classmethod
    async def create(
        cls, url: str | None = None, token: str | None = None, *, timeout_s: float = 60.0
    ) -> AsyncSandbox:
        endpoint = _endpoint(url, token)
        info = await _async_call(endpoint, "POST", "/v1/sessions", b"{}", timeout_s=timeout_s)
        return cls(endpoint, timeout_s, info)

    async def run_code(
        self,
        code: str,
        *,
        language: str | None = None,
        timeout_s: float | None = None,
        html: bool = False,
    ) -> Execution:
        """Like `Sandbox.run_code`."""
        wait = (timeout_s or 0.0) + CALL_MARGIN_S + self._timeout_s
        data = await self._call(
            "POST",
            f"/v1/sessions/{self.id}/runs",
            _run_body(code, language, timeout_s, html),
            timeout_s=wait,
        )
        return _execution(data)

    async def kill(self) -> None:
        """Ends the session; already gone is fine."""
        try:
            await self._call("DELETE", f"/v1/sessions/{self.id}")
        except SessionNotFound:
            pass

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.kill()


async def _async_call(
    endpoint: _http.Endpoint,
    method: str,
    path: str,
    body: bytes | None,
    *,
    raw: bool = False,
    timeout_s: float,
) -> Any:
    response = await _http.async_request(
        endpoint,
        method,
        path,
        body,
        timeout_s=timeout_s,
        content_type="application/octet-stream" if raw else "application/json",
    )
    try:
        data = await response.read()
    finally:
        await response.close()
    if raw and method == "GET" and response.status == 200:
        return data
    return _decode(response.status, data, f"{method} {path}")
