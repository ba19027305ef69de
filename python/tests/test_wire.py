"""The wire format alone: request bodies and argv, responses, SSE, tool shapes."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

import airlock
from airlock import _http
from airlock.client import ToolDefinition

pytestmark = pytest.mark.pure

ERROR_BODY = {"ok": False, "outcome": "error", "error": {"kind": "k", "message": "m"}}


def _body(kind: str) -> bytes:
    return json.dumps({**ERROR_BODY, "error": {"kind": kind, "message": "why"}}).encode()


@pytest.mark.parametrize(
    ("status", "kind", "expected"),
    [
        (400, "invalid_input", airlock.InvalidInput),
        (403, "policy_denied", airlock.PolicyDenied),
        (401, "policy_denied", airlock.Unauthorized),  # servers before `unauthorized`
        (401, "unauthorized", airlock.Unauthorized),
        (503, "backend_unavailable", airlock.BackendUnavailable),
        (500, "internal", airlock.InternalError),
        (500, "a_kind_from_the_future", airlock.InternalError),
    ],
)
def test_error_bodies_become_typed_errors(
    status: int, kind: str, expected: type[airlock.AirlockError]
) -> None:
    with pytest.raises(expected) as raised:
        _http.decode_run_response(status, _body(kind), None)
    assert raised.value.status == status and raised.value.message == "why"
    assert raised.value.observation is not None


def test_a_full_queue_says_when_to_retry() -> None:
    with pytest.raises(airlock.BackendUnavailable) as raised:
        _http.decode_run_response(429, _body("backend_unavailable"), "1")
    assert raised.value.retry_after_s == 1.0


def test_an_answer_that_is_not_airlocks_is_a_transport_error() -> None:
    with pytest.raises(airlock.TransportError):
        _http.decode_run_response(502, b"<html>bad gateway</html>", None)


def test_sse_events_are_parsed() -> None:
    parser = _http.SseParser()
    lines = [": keep-alive", "event: stdout", 'data: {"text":"a\\n"}', "", "event: observation"]
    observation = {**ERROR_BODY, "job_id": "j"}
    lines += ["data: " + json.dumps(observation), ""]
    events = [e for e in (parser.feed(line) for line in lines) if e is not None]
    assert events[0] == ("stdout", '{"text":"a\\n"}')
    assert _http.decode_event(*events[0]) == airlock.Chunk(stream="stdout", text="a\n")
    decoded = _http.decode_event(*events[1])
    assert isinstance(decoded, airlock.Observation) and decoded.job_id == "j"


def test_request_bodies_send_only_what_is_set() -> None:
    request = airlock.RunRequest(source="print(1)")
    assert request.to_json() == {"language": "python", "code": "print(1)"}
    full = airlock.RunRequest(
        source=b"\xff",
        language=None,
        files={"a.txt": "t", "b.bin": b"\x00"},
        stdin="in",
        args=["-v"],
        timeout_s=1.5,
        env={"A": "b"},
        return_files=True,
    ).to_json()
    assert "language" not in full
    assert full["code_base64"] == base64.b64encode(b"\xff").decode()
    assert full["files"] == [
        {"path": "a.txt", "content": "t"},
        {"path": "b.bin", "content_base64": "AA=="},
    ]
    assert (full["timeout_s"], full["return_files"], full["args"]) == (1.5, True, ["-v"])


def test_argv_passes_the_source_and_inputs_as_files(tmp_path: Path) -> None:
    request = airlock.RunRequest(
        source="print(1)", files={"in.txt": "x"}, stdin=b"\x00", timeout_s=0.25
    )
    argv = request.to_argv(tmp_path, tmp_path / "out")
    assert argv[:3] == ["--json", "-l", "python"]
    assert argv[argv.index("--timeout") + 1] == "250.000ms"
    assert argv[argv.index("--out") + 1] == str(tmp_path / "out")
    name, path = argv[argv.index("--file") + 1].split("=", 1)
    assert name == "in.txt" and Path(path).read_text() == "x"
    assert Path(argv[argv.index("--stdin") + 1]).read_bytes() == b"\x00"
    assert Path(argv[-1]).read_text() == "print(1)"


def test_bad_arguments_are_refused_before_anything_runs() -> None:
    with pytest.raises(airlock.InvalidInput):
        airlock.RunRequest(source="", timeout_s=0)
    with pytest.raises(airlock.InvalidInput):
        airlock.RunRequest(source="", args="-v")


def test_tool_definitions_in_both_shapes() -> None:
    parameters = {"type": "object", "properties": {"timeout_s": {"maximum": 5.0}}}
    chat = {
        "type": "function",
        "function": {
            "name": "run_code",
            "description": "d",
            "parameters": parameters,
            "strict": True,
        },
    }
    responses = {
        "type": "function",
        "name": "run_code",
        "description": "d",
        "parameters": parameters,
        "strict": True,
    }
    for wire in (chat, responses):
        tool = ToolDefinition.from_wire(wire)
        assert tool.strict and tool.max_timeout_s == 5.0
        assert tool.chat() == chat and tool.responses() == responses


def test_remote_mode_takes_no_local_options() -> None:
    with pytest.raises(ValueError):
        airlock.Client("http://127.0.0.1:1", policy="p.toml")
    with pytest.raises(airlock.TransportError):
        airlock.Client("ftp://example")


def test_the_call_keywords_are_the_request_fields() -> None:
    # One list of keywords (RunOptions) for run/stream, sync and async, and it is the
    # request's own fields: a field added to RunRequest must be added there too.
    from dataclasses import fields

    from airlock._request import RunOptions, build_request

    assert set(RunOptions.__annotations__) == {f.name for f in fields(airlock.RunRequest)} - {
        "source"
    }
    request = build_request("print(1)", files=None, env=None, args=["a"], timeout_s=2)
    assert request.language == "python" and request.files == {} and request.env == {}
    assert request.args == ("a",) and request.timeout_s == 2 and request.return_files is False
    with pytest.raises(TypeError, match="timeout"):
        build_request("print(1)", timeout=5)  # type: ignore[call-arg]


def test_host_files_stay_inside_out_dir(tmp_path: Path) -> None:
    import hashlib

    from airlock.tools import HostFiles, safe_relative_path

    assert safe_relative_path("../../etc/passwd") == Path("_.", "_.", "etc", "passwd")
    assert safe_relative_path("/abs//a b\\c\x00.txt") == Path("abs", "a_b", "c_.txt")
    assert safe_relative_path(".hidden") == Path("_hidden")
    assert safe_relative_path("") == Path("file")

    def released(path: str, content: bytes) -> dict[str, Any]:
        return {
            "path": path,
            "bytes": len(content),
            "sha256": hashlib.sha256(content).hexdigest(),
            "media_type": "application/octet-stream",
            "redactions": 0,
            "content_base64": base64.b64encode(content).decode(),
        }

    files = [
        released("../escape.txt", b"one"),
        released("a b.txt", b"two"),
        released("a_b.txt", b"three"),
        released("link/x.txt", b"four"),
    ]
    out = tmp_path / "out"
    (out / "job-1").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (out / "job-1" / "link").symlink_to(outside)
    observation = airlock.Observation.from_dict(
        {"job_id": "job-1", "ok": True, "outcome": "exited", "files": files}
    )
    with pytest.raises(OSError, match="not a directory airlock created"):
        HostFiles(out_dir=out).save(observation)
    assert list(outside.iterdir()) == []
    observation.files.pop()
    out = tmp_path / "out2"
    written = HostFiles(out_dir=out).save(observation)
    assert [p.relative_to(out) for p in written] == [
        Path("job-1/_./escape.txt"),
        Path("job-1/a_b.txt"),
        Path("job-1/a_b-2.txt"),  # a sanitised name never replaces another file
    ]
    assert [p.read_bytes() for p in written] == [b"one", b"two", b"three"]
