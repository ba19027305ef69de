"""Remote mode: `airlock serve`'s HTTP API (crates/airlock-server/src/http.rs) with the
standard library only. The sync side is `http.client`; the async side speaks HTTP/1.1 over
`asyncio` streams, so cancelling a call closes its connection, which the server takes as
"client gone" and kills the job. Every request is one connection (`Connection: close`):
a run is seconds long, so reuse would save little and cost a connection pool's state."""

from __future__ import annotations

import asyncio
import http.client
import importlib
import json
import ssl
import urllib.parse
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from ._types import Chunk, Observation, ObservationFormatError
from .errors import ClientTimeout, TransportError, error_for

#: Largest response body read (an observation is bounded by the policy; inline /out files
#: by its inline cap). A larger one is not airlock's and is refused.
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
#: Longest SSE line (one event's data: a chunk, or the final observation).
MAX_SSE_LINE_BYTES = MAX_RESPONSE_BYTES
#: Time to establish a connection.
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Endpoint:
    """A server base URL, split once."""

    scheme: str
    host: str
    port: int
    prefix: str
    token: str | None

    @classmethod
    def parse(cls, url: str, token: str | None) -> Endpoint:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TransportError(f"AIRLOCK_URL {url!r}: expected http://HOST[:PORT] or https://…")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"), token or None)

    def headers(
        self, body: bytes | None, accept: str, content_type: str = "application/json"
    ) -> dict[str, str]:
        headers = {"Accept": accept, "Connection": "close", "User-Agent": "airlock-python"}
        if body is not None:
            headers["Content-Type"] = content_type
            headers["Content-Length"] = str(len(body))
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        headers.update(trace_context_headers())
        return headers

    @property
    def netloc(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def trace_context_headers() -> dict[str, str]:
    """The caller's current OpenTelemetry context as W3C headers (`traceparent`,
    `tracestate`, `baggage`), so the job's span joins the caller's trace
    (docs/telemetry.md); empty when `opentelemetry` is not installed or no span is active.
    Imported by name: OpenTelemetry is the caller's choice, never this package's
    dependency."""
    try:
        propagate: Any = importlib.import_module("opentelemetry.propagate")
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {k: v for k, v in carrier.items() if isinstance(k, str) and isinstance(v, str)}


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def decode_run_response(status: int, body: bytes, retry_after: str | None) -> Observation:
    """The observation of a `POST /v1/runs` answer; a typed error for an error status."""
    try:
        data = json.loads(body)
        observation = Observation.from_dict(data)
    except (ValueError, ObservationFormatError) as e:
        raise TransportError(
            f"HTTP {status}: the answer is not an airlock observation: {body[:200]!r}",
            status=status,
        ) from e
    if status == 200 and observation.outcome != "error":
        return observation
    kind = observation.error.kind if observation.error else "internal"
    message = observation.error.message if observation.error else f"HTTP {status}"
    raise error_for(
        kind,
        message,
        observation=observation,
        status=status,
        retry_after_s=_retry_after(retry_after),
    )


def decode_json_response(status: int, body: bytes, what: str) -> Any:
    """A JSON answer of another endpoint; its error body becomes the typed error."""
    try:
        data = json.loads(body)
    except ValueError as e:
        raise TransportError(f"{what}: HTTP {status}: not JSON", status=status) from e
    if status != 200:
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            raise error_for(str(error.get("kind")), str(error.get("message")), status=status)
        raise TransportError(f"{what}: HTTP {status}", status=status)
    return data


class SseParser:
    """Server-sent events, line by line: `event:` and `data:` fields, comments ignored,
    dispatched on a blank line."""

    def __init__(self) -> None:
        self._event = "message"
        self._data: list[str] = []

    def feed(self, line: str) -> tuple[str, str] | None:
        """One line without its end; returns `(event, data)` when one completes."""
        if line == "":
            if not self._data:
                self._event = "message"
                return None
            done = (self._event, "\n".join(self._data))
            self._event, self._data = "message", []
            return done
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None


def decode_event(event: str, data: str) -> Chunk | Observation | None:
    """A streamed run's event: an output chunk, or the final observation."""
    if event in ("stdout", "stderr"):
        try:
            text = json.loads(data)["text"]
        except (ValueError, KeyError, TypeError) as e:
            raise TransportError(f"a malformed {event} event: {data[:200]!r}") from e
        return Chunk(stream="stdout" if event == "stdout" else "stderr", text=str(text))
    if event == "observation":
        try:
            return Observation.from_dict(json.loads(data))
        except (ValueError, ObservationFormatError) as e:
            raise TransportError(f"a malformed observation event: {data[:200]!r}") from e
    return None


# ---- sync ----


def _connection(endpoint: Endpoint, timeout_s: float | None) -> http.client.HTTPConnection:
    if endpoint.scheme == "https":
        return http.client.HTTPSConnection(
            endpoint.host, endpoint.port, timeout=timeout_s, context=ssl.create_default_context()
        )
    return http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout_s)


def request(
    endpoint: Endpoint,
    method: str,
    path: str,
    body: bytes | None,
    *,
    timeout_s: float | None,
    accept: str = "application/json",
    content_type: str = "application/json",
) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """Sends one request; the caller reads the response and closes the connection.
    `timeout_s` bounds every wait on the socket."""
    conn = _connection(endpoint, timeout_s)
    try:
        conn.request(
            method,
            endpoint.prefix + path,
            body=body,
            headers=endpoint.headers(body, accept, content_type),
        )
        return conn, conn.getresponse()
    except TimeoutError as e:
        conn.close()
        raise ClientTimeout(f"{method} {path}: no answer within {timeout_s} s") from e
    except OSError as e:
        conn.close()
        raise TransportError(f"{method} {endpoint.netloc}{path}: {e}") from e
    except http.client.HTTPException as e:
        conn.close()
        raise TransportError(f"{method} {endpoint.netloc}{path}: {e}") from e


def _read_bounded(response: http.client.HTTPResponse, timeout_s: float | None) -> bytes:
    try:
        body = response.read(MAX_RESPONSE_BYTES + 1)
    except TimeoutError as e:
        raise ClientTimeout(f"the answer did not arrive within {timeout_s} s") from e
    except (OSError, http.client.HTTPException) as e:
        raise TransportError(f"read the answer: {e}") from e
    if len(body) > MAX_RESPONSE_BYTES:
        raise TransportError(f"the answer is larger than {MAX_RESPONSE_BYTES} bytes")
    return body


def run(endpoint: Endpoint, body: dict[str, Any], timeout_s: float | None) -> Observation:
    """`POST /v1/runs`."""
    conn, response = request(
        endpoint, "POST", "/v1/runs", json.dumps(body).encode(), timeout_s=timeout_s
    )
    try:
        data = _read_bounded(response, timeout_s)
        return decode_run_response(response.status, data, response.getheader("Retry-After"))
    finally:
        conn.close()


def get_json(endpoint: Endpoint, path: str, timeout_s: float | None) -> Any:
    """`GET path` answered with JSON."""
    conn, response = request(endpoint, "GET", path, None, timeout_s=timeout_s)
    try:
        return decode_json_response(response.status, _read_bounded(response, timeout_s), path)
    finally:
        conn.close()


def stream(
    endpoint: Endpoint, body: dict[str, Any], timeout_s: float | None
) -> Iterator[Chunk | Observation]:
    """`POST /v1/runs?stream=true`: chunks as they arrive, then the observation. Closing
    the iterator early closes the connection, which kills the job."""
    conn, response = request(
        endpoint,
        "POST",
        "/v1/runs?stream=true",
        json.dumps(body).encode(),
        timeout_s=timeout_s,
        accept="text/event-stream",
    )
    try:
        if not (response.getheader("Content-Type") or "").startswith("text/event-stream"):
            # Refused before the job started: an ordinary JSON answer.
            data = _read_bounded(response, timeout_s)
            yield decode_run_response(response.status, data, response.getheader("Retry-After"))
            return
        parser = SseParser()
        while True:
            try:
                raw = response.readline(MAX_SSE_LINE_BYTES)
            except TimeoutError as e:
                raise ClientTimeout(f"the stream was silent for {timeout_s} s") from e
            except (OSError, http.client.HTTPException) as e:
                raise TransportError(f"read the stream: {e}") from e
            if not raw:
                raise TransportError("the stream ended before the observation")
            done = parser.feed(raw.decode("utf-8", "replace").rstrip("\r\n"))
            if done is None:
                continue
            item = decode_event(*done)
            if item is not None:
                yield item
                if isinstance(item, Observation):
                    return
    finally:
        conn.close()


# ---- async ----


class _AsyncResponse:
    """An HTTP/1.1 response read from asyncio streams (chunked or sized body)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        status: int,
        headers: dict[str, str],
        timeout_s: float | None,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.status, self.headers, self.timeout_s = status, headers, timeout_s

    async def _wait(self, awaitable: Any) -> Any:
        try:
            return await asyncio.wait_for(awaitable, self.timeout_s)
        except asyncio.TimeoutError as e:
            raise ClientTimeout(f"the answer stalled for {self.timeout_s} s") from e
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            raise TransportError(f"read the answer: {e}") from e

    async def pieces(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await self._wait(self.reader.readline())
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError as e:
                    raise TransportError("a malformed chunked body") from e
                if size == 0:
                    return
                if size > MAX_RESPONSE_BYTES:
                    raise TransportError("a chunk larger than the response limit")
                data = await self._wait(self.reader.readexactly(size))
                await self._wait(self.reader.readexactly(2))
                yield data
        elif "content-length" in self.headers:
            remaining = int(self.headers["content-length"])
            if remaining > MAX_RESPONSE_BYTES:
                raise TransportError(f"the answer is larger than {MAX_RESPONSE_BYTES} bytes")
            while remaining > 0:
                data = await self._wait(self.reader.read(min(remaining, 1 << 16)))
                if not data:
                    raise TransportError("the answer ended early")
                remaining -= len(data)
                yield data
        else:
            while True:
                data = await self._wait(self.reader.read(1 << 16))
                if not data:
                    return
                yield data

    async def read(self) -> bytes:
        out = bytearray()
        async for piece in self.pieces():
            out += piece
            if len(out) > MAX_RESPONSE_BYTES:
                raise TransportError(f"the answer is larger than {MAX_RESPONSE_BYTES} bytes")
        return bytes(out)

    async def lines(self) -> AsyncIterator[str]:
        buffer = bytearray()
        async for piece in self.pieces():
            buffer += piece
            while (end := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                yield line.decode("utf-8", "replace").rstrip("\r")
            if len(buffer) > MAX_SSE_LINE_BYTES:
                raise TransportError("an event line larger than the limit")
        if buffer:
            yield buffer.decode("utf-8", "replace").rstrip("\r")

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (OSError, ssl.SSLError):
            pass


async def async_request(
    endpoint: Endpoint,
    method: str,
    path: str,
    body: bytes | None,
    *,
    timeout_s: float | None,
    accept: str = "application/json",
    content_type: str = "application/json",
) -> _AsyncResponse:
    """Sends one request over a fresh connection and reads the response head."""
    context = ssl.create_default_context() if endpoint.scheme == "https" else None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(endpoint.host, endpoint.port, ssl=context),
            CONNECT_TIMEOUT_S if timeout_s is None else min(CONNECT_TIMEOUT_S, timeout_s),
        )
    except asyncio.TimeoutError as e:
        raise ClientTimeout(f"connect to {endpoint.netloc}: timed out") from e
    except OSError as e:
        raise TransportError(f"connect to {endpoint.netloc}: {e}") from e
    try:
        headers = {"Host": endpoint.netloc, **endpoint.headers(body, accept, content_type)}
        head = f"{method} {endpoint.prefix}{path} HTTP/1.1\r\n" + "".join(
            f"{name}: {value}\r\n" for name, value in headers.items()
        )
        writer.write(head.encode("latin-1") + b"\r\n" + (body or b""))
        await writer.drain()
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
    except asyncio.TimeoutError as e:
        writer.close()
        raise ClientTimeout(f"{method} {path}: no answer within {timeout_s} s") from e
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        writer.close()
        raise TransportError(f"{method} {endpoint.netloc}{path}: {e}") from e
    except BaseException:
        writer.close()
        raise
    lines = raw.decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split(" ", 2)[1])
    except (IndexError, ValueError) as e:
        writer.close()
        raise TransportError(f"not an HTTP answer: {lines[0][:100]!r}") from e
    response_headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            response_headers[name.strip().lower()] = value.strip()
    return _AsyncResponse(reader, writer, status, response_headers, timeout_s)


async def async_run(
    endpoint: Endpoint, body: dict[str, Any], timeout_s: float | None
) -> Observation:
    """`POST /v1/runs`."""
    response = await async_request(
        endpoint, "POST", "/v1/runs", json.dumps(body).encode(), timeout_s=timeout_s
    )
    try:
        data = await response.read()
    finally:
        await response.close()
    return decode_run_response(response.status, data, response.headers.get("retry-after"))


async def async_get_json(endpoint: Endpoint, path: str, timeout_s: float | None) -> Any:
    """`GET path` answered with JSON."""
    response = await async_request(endpoint, "GET", path, None, timeout_s=timeout_s)
    try:
        data = await response.read()
    finally:
        await response.close()
    return decode_json_response(response.status, data, path)


async def async_stream(
    endpoint: Endpoint, body: dict[str, Any], timeout_s: float | None
) -> AsyncGenerator[Chunk | Observation, None]:
    """`POST /v1/runs?stream=true`: chunks as they arrive, then the observation."""
    response = await async_request(
        endpoint,
        "POST",
        "/v1/runs?stream=true",
        json.dumps(body).encode(),
        timeout_s=timeout_s,
        accept="text/event-stream",
    )
    try:
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            data = await response.read()
            yield decode_run_response(response.status, data, response.headers.get("retry-after"))
            return
        parser = SseParser()
        async for line in response.lines():
            done = parser.feed(line)
            if done is None:
                continue
            item = decode_event(*done)
            if item is not None:
                yield item
                if isinstance(item, Observation):
                    return
        raise TransportError("the stream ended before the observation")
    finally:
        await response.close()
