"""The package against the real binary (local) and a real `airlock serve` (remote)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import sysconfig
import time
import urllib.request
from pathlib import Path

import pytest

import airlock
from airlock.client import LOCAL_MARGIN_S, REMOTE_MARGIN_S

from .conftest import Server

# A fake GitHub token, assembled inside the job so only its output carries it whole.
SECRET_TAIL = "JIGA9HK2gOCZPeJMQW9cy78kyEk2FINMdB8F"
PRINT_SECRET = f"print('token: gh' + 'p_{SECRET_TAIL}')"


def test_run_in_container_is_the_drop_in() -> None:
    result = airlock.run_in_container("print(sum(range(10)))")
    assert isinstance(result, dict)
    assert result["ok"] is True
    assert result["stdout"] == "45\n"
    assert result["stderr"] == ""
    assert result["code"] == 0
    assert result["error"] is None
    # The whole observation, as keys and typed.
    assert result["outcome"] == "exited" and result["backend"] == "native"
    assert result.observation.job_id == result["job_id"]
    assert result.observation.policy_version == "default-1"


def test_run_in_container_remote_from_the_environment(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRLOCK_URL", server.url)
    monkeypatch.setenv("AIRLOCK_TOKEN", server.token)
    # A binary that cannot run proves the job went to the server.
    monkeypatch.setenv("AIRLOCK_BIN", "/nonexistent/airlock")
    result = airlock.run_in_container("print(sum(range(10)))")
    assert (result["ok"], result["stdout"], result["code"]) == (True, "45\n", 0)


def test_timeouts_are_observations(client: airlock.Client) -> None:
    started = time.monotonic()
    result = airlock.run_in_container("while True: pass", timeout_s=0.5, client=client)
    assert result["ok"] is False
    assert result["error"] == "timeout"
    assert result["code"] is None
    assert result.observation.outcome == "timeout"
    assert time.monotonic() - started < 0.5 + LOCAL_MARGIN_S


def test_a_failing_program_is_not_an_error(client: airlock.Client) -> None:
    observation = client.run("import sys; print('no', file=sys.stderr); sys.exit(3)")
    assert observation.ok is False
    assert observation.outcome == "exited"
    assert observation.exit_code == 3
    assert observation.stderr == "no\n"
    assert airlock.run_in_container("raise SystemExit(3)", client=client)["error"] is None


def test_inputs_reach_the_program(client: airlock.Client) -> None:
    observation = client.run(
        "import sys\n"
        "print(open('data/in.txt').read(), open('blob.bin', 'rb').read().hex(), sep='|')\n"
        "print(sys.stdin.read(), sys.argv[1:])\n",
        files={"data/in.txt": "hello", "blob.bin": b"\x00\xff"},
        stdin="from stdin",
        args=["-v", "x y"],
    )
    assert observation.ok, observation
    assert observation.stdout == "hello|00ff\nfrom stdin ['-v', 'x y']\n"


def test_other_languages(client: airlock.Client) -> None:
    observation = client.run("echo $((6 * 7))", language="sh")
    assert observation.stdout == "42\n"


def test_output_floods_are_bounded(client: airlock.Client) -> None:
    observation = client.run("print('x' * 1_000_000)")
    assert observation.stdout_truncated is True
    assert observation.stdout_bytes == 1_000_001
    assert len(observation.stdout.encode()) <= 8000
    assert len(observation.to_json()) < 12_000


def test_secrets_are_redacted(client: airlock.Client) -> None:
    observation = client.run(PRINT_SECRET)
    assert SECRET_TAIL not in observation.stdout
    assert "[REDACTED:github-pat]" in observation.stdout
    assert observation.redactions == 1


def test_policy_refusals_raise_with_the_observation(client: airlock.Client) -> None:
    with pytest.raises(airlock.PolicyDenied) as refused:
        client.run("print(1)", timeout_s=100)
    assert "ceiling" in refused.value.message
    assert refused.value.observation is not None
    assert refused.value.observation.job_id  # audited
    if client.is_remote:
        assert refused.value.status == 403
    result = airlock.run_in_container("print(1)", timeout_s=100, client=client)
    assert result["ok"] is False
    assert str(result["error"]).startswith("policy_denied: ")


def test_bad_input_raises_invalid_input(client: airlock.Client) -> None:
    with pytest.raises(airlock.InvalidInput) as bad:
        client.run("print(1)", language="cobol")
    assert "cobol" in bad.value.message
    with pytest.raises(airlock.InvalidInput, match="NUL"):
        client.run(b"print(1)\x00")


def test_a_missing_backend_is_backend_unavailable() -> None:
    with pytest.raises(airlock.BackendUnavailable):
        airlock.Client(backend="kube").run("print(1)")


def test_a_wrong_token_is_unauthorized(server: Server) -> None:
    with pytest.raises(airlock.Unauthorized) as denied:
        airlock.Client(server.url, "alk_wrong").run("print(1)")
    assert denied.value.status == 401
    with pytest.raises(airlock.Unauthorized):
        airlock.Client(server.url, None).run("print(1)")


def test_the_server_names_its_401_unauthorized(server: Server) -> None:
    with pytest.raises(airlock.Unauthorized) as denied:
        airlock.Client(server.url, "alk_wrong").run("print(1)")
    assert denied.value.observation is not None and denied.value.observation.error is not None
    assert denied.value.observation.error.kind == "unauthorized"


def test_out_files_round_trip(client: airlock.Client, tmp_path: Path) -> None:
    payload = bytes(range(256)) * 4
    observation = client.run(
        f"open('/out/blob.bin', 'wb').write({payload!r})\nopen('/out/note.txt', 'w').write('hi')",
        return_files=True,
    )
    assert observation.ok, observation
    blob = observation.file("blob.bin")
    assert blob.size == len(payload)
    assert blob.sha256 == hashlib.sha256(payload).hexdigest()
    assert blob.read() == payload
    assert observation.file("note.txt").text() == "hi"
    saved = blob.save(tmp_path)
    assert saved == tmp_path / "blob.bin" and saved.read_bytes() == payload
    # The model-facing JSON lists the files but keeps their bytes out.
    assert "content_base64" not in observation.to_json()
    assert "content_base64" in observation.to_json(include_content=True)


def test_files_are_listed_only_unless_asked_for(client: airlock.Client) -> None:
    observation = client.run("print(1)")
    assert observation.files == []


def test_tampered_file_content_is_refused() -> None:
    entry = {"path": "a", "bytes": 1, "sha256": "00" * 32, "media_type": "x", "redactions": 0}
    listed = airlock.OutputFile.from_dict(entry)
    with pytest.raises(LookupError):
        listed.read()
    tampered = airlock.OutputFile.from_dict({**entry, "content_base64": "QQ=="})
    with pytest.raises(ValueError, match="does not match"):
        tampered.read()


def test_stream_yields_chunks_as_they_arrive(client: airlock.Client) -> None:
    source = "import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.4)\n"
    arrivals: list[tuple[float, airlock.Chunk]] = []
    started = time.monotonic()
    with client.stream(source, timeout_s=5) as stream:
        for chunk in stream:
            arrivals.append((time.monotonic() - started, chunk))
    done = time.monotonic() - started
    assert "".join(c.text for _, c in arrivals if c.stream == "stdout") == "0\n1\n2\n"
    assert stream.observation.ok and stream.observation.stdout == "0\n1\n2\n"
    if client.is_remote:
        # Live: the first line arrived well before the job ended.
        assert len(arrivals) == 3
        assert arrivals[0][0] < done - 0.6


def _jobs_in_flight(server: Server) -> int:
    with urllib.request.urlopen(f"{server.url}/v1/health", timeout=10) as response:
        return int(json.load(response)["jobs_in_flight"])


def test_closing_a_stream_early_ends_the_job(server: Server) -> None:
    client = airlock.Client(server.url, server.token)
    source = "import time\nprint('started', flush=True)\ntime.sleep(4)\nprint('late')"
    with client.stream(source, timeout_s=5) as stream:
        first = next(iter(stream))
        assert first.text == "started\n"
        assert _jobs_in_flight(server) == 1
    started = time.monotonic()
    while _jobs_in_flight(server) and time.monotonic() - started < 3:
        time.sleep(0.05)
    # Gone well before the job's own 4 s sleep would have ended it.
    assert _jobs_in_flight(server) == 0


def test_cancelling_an_async_stream_ends_the_job(server: Server) -> None:
    client = airlock.AsyncClient(server.url, server.token)
    source = "import time\nprint('started', flush=True)\ntime.sleep(4)"

    async def main() -> float:
        stream = client.stream(source, timeout_s=5)
        assert (await stream.__anext__()).text == "started\n"
        await stream.aclose()
        # Still inside the running loop: the close itself ended the job.
        started = time.monotonic()
        while await asyncio.to_thread(_jobs_in_flight, server):
            if time.monotonic() - started > 3:
                break
            await asyncio.sleep(0.05)
        return time.monotonic() - started

    assert asyncio.run(main()) < 3


def test_stream_refusals_raise(client: airlock.Client) -> None:
    with pytest.raises(airlock.PolicyDenied):
        for _ in client.stream("print(1)", timeout_s=100):
            pass


def test_async_client(async_client: airlock.AsyncClient) -> None:
    async def main() -> None:
        observation = await async_client.run("print(6 * 7)", timeout_s=2)
        assert observation.stdout == "42\n"
        stream = async_client.stream("print('a'); import sys; print('b', file=sys.stderr)")
        chunks = [chunk async for chunk in stream]
        assert {(c.stream, c.text) for c in chunks} == {("stdout", "a\n"), ("stderr", "b\n")}
        assert stream.observation.ok
        with pytest.raises(airlock.PolicyDenied):
            await async_client.run("print(1)", timeout_s=100)
        results = await asyncio.gather(*(async_client.run(f"print({i})") for i in range(3)))
        assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]

    asyncio.run(main())


def test_async_cancellation_ends_the_job(async_client: airlock.AsyncClient) -> None:
    async def main() -> float:
        task = asyncio.create_task(async_client.run("import time; time.sleep(4)", timeout_s=5))
        await asyncio.sleep(1.0)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    assert asyncio.run(main()) < 2.5


def test_the_client_deadline_follows_the_job_wall_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A binary that never answers: the client gives up at wall time + margin, not sooner.
    hung = tmp_path / "airlock"
    hung.write_text("#!/bin/sh\nexec sleep 60\n")
    hung.chmod(hung.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("AIRLOCK_BIN", str(hung))
    client = airlock.Client(timeout_margin_s=0.5)
    started = time.monotonic()
    with pytest.raises(airlock.ClientTimeout):
        client.run("print(1)", timeout_s=1.0)
    waited = time.monotonic() - started
    assert 1.5 <= waited < 10


def test_the_default_deadline_is_the_policy_wall_time_plus_margin(client: airlock.Client) -> None:
    tool = client.tool()
    assert tool.max_timeout_s == 5.0
    request = airlock.RunRequest(source="print(1)")
    assert client._timeout_for(request) == 5.0 + client.timeout_margin_s
    margin = REMOTE_MARGIN_S if client.is_remote else LOCAL_MARGIN_S
    assert client._timeout_for(airlock.RunRequest(source="", timeout_s=2)) == 2 + margin


def test_a_missing_binary_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRLOCK_BIN", "/nonexistent/airlock")
    with pytest.raises(airlock.BinaryNotFound):
        airlock.run_in_container("print(1)")


def test_an_unreachable_server_is_a_transport_error() -> None:
    with pytest.raises(airlock.TransportError):
        airlock.Client("http://127.0.0.1:9").run("print(1)", timeout_s=1)


def test_the_tool_definition_is_the_servers(client: airlock.Client) -> None:
    tool = client.tool()
    assert tool.name == "run_code"
    assert "5s wall time" in tool.description
    assert set(tool.parameters["properties"]) >= {"language", "code", "files", "timeout_s"}
    assert "python" in tool.parameters["properties"]["language"]["enum"]
    assert client.tool().chat()["function"]["name"] == "run_code"
    assert client.tool().responses()["name"] == "run_code"


def test_the_tool_definition_is_strict(client: airlock.Client) -> None:
    tool = client.tool()
    assert tool.strict
    params = tool.parameters
    assert params["additionalProperties"] is False
    assert sorted(params["required"]) == sorted(params["properties"])
    assert tool.chat()["function"]["strict"] is True


def test_the_binary_is_installed_with_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the wheel's venv (python/ci.sh) the binary sits in the interpreter's scripts."""
    if os.environ.get("AIRLOCK_CI_WHEEL") != "1":
        pytest.skip("not running from the installed wheel (python/ci.sh sets AIRLOCK_CI_WHEEL=1)")
    monkeypatch.delenv("AIRLOCK_BIN")

    found = airlock._local.find_binary()
    assert Path(found).parent == Path(sysconfig.get_path("scripts"))
    # And the package under test is the installed one, not a source checkout.
    assert Path(airlock.__file__).is_relative_to(sysconfig.get_path("purelib"))
