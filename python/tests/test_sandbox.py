"""airlock.Sandbox over a real `airlock serve` whose policy enables kernel sessions: a
notebook-style three-step analysis, files in and out, the context manager ending it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import struct
import subprocess
import tempfile
import time
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import airlock


@contextlib.contextmanager
def _serve(airlock_bin: str, policy_text: str) -> Iterator[str]:
    """A real `airlock serve` on 127.0.0.1 with `policy_text`; yields its URL."""
    with tempfile.TemporaryDirectory(prefix="airlock-sandbox-") as work_dir:
        work = Path(work_dir)
        policy = work / "policy.toml"
        policy.write_text(policy_text)
        log = work / "serve.log"
        env = {**os.environ, "AIRLOCK_STATE_DIR": str(work)}
        with log.open("wb") as log_file:
            process = subprocess.Popen(
                [airlock_bin, "serve", "--listen", "127.0.0.1:0", "--policy", str(policy)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                env=env,
            )
        try:
            deadline = time.monotonic() + 30
            while True:
                match = re.search(r"listening on (http://[0-9.:]+)", log.read_text())
                if match:
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"airlock serve did not start:\n{log.read_text()}")
                time.sleep(0.05)
            yield match.group(1)
        finally:
            process.terminate()
            process.wait(timeout=30)


@pytest.fixture(scope="module")
def session_server(airlock_bin: str) -> Iterator[str]:
    policy = 'version = "sbx-1"\n[sessions]\nenabled = true\nmode = "kernel"\n'
    with _serve(airlock_bin, policy) as url:
        yield url


@pytest.fixture(scope="module")
def charts_server(airlock_bin: str) -> Iterator[str]:
    """A kernel-session server whose minimal root holds matplotlib and pandas
    (AIRLOCK_TEST_PYLIB, made by scripts/ci/pylib.sh)."""
    pylib = os.environ.get("AIRLOCK_TEST_PYLIB", "")
    if not (Path(pylib) / "matplotlib").is_dir() or not (Path(pylib) / "pandas").is_dir():
        pytest.skip(
            "AIRLOCK_TEST_PYLIB names no directory with matplotlib and pandas "
            "(scripts/ci/pylib.sh makes one)"
        )
    policy = (
        'version = "sbx-charts"\n'
        '[limits]\ntimeout = "60s"\nmemory = "1GiB"\n'
        f"[filesystem]\nsite_packages = [{json.dumps(pylib)}]\n"
        '[sessions]\nenabled = true\nmode = "kernel"\n'
    )
    with _serve(airlock_bin, policy) as url:
        yield url


def _png_size(data: bytes) -> tuple[int, int]:
    """Decodes a PNG far enough to know it is one: signature, chunk CRCs, and image data
    that inflates to the rows its header promises (8-bit RGB or RGBA)."""
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    at, idat, size, channels = 8, b"", (0, 0), 0
    while True:
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert zlib.crc32(kind + body) == crc, kind
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            size, channels = (width, height), 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        at += 12 + length
    width, height = size
    assert len(zlib.decompress(idat)) == height * (1 + width * channels)
    return size


def test_charts_and_tables_come_back_as_results(charts_server: str) -> None:
    with airlock.Sandbox.create(charts_server, timeout_s=120) as sbx:
        sbx.files.write("data.csv", "x,y\n1,1\n2,4\n3,9\n4,16\n")
        load = sbx.run_code(
            "import pandas as pd\nimport matplotlib.pyplot as plt\ndf = pd.read_csv('data.csv')",
            timeout_s=60,
        )
        assert load.error is None and load.results == [], load.logs
        table = sbx.run_code("df.describe()", html=True, timeout_s=60)
        (main,) = table.results
        assert main.is_main_result and main.formats() == ["text", "html"]
        assert main.text is not None and "mean" in main.text
        assert main.html is not None and "<table" in main.html and "mean" in main.html
        chart = sbx.run_code(
            "df.plot(x='x', y='y', title='squares')\nint(df['y'].sum())", timeout_s=60
        )
        figure, value = chart.results
        assert not figure.is_main_result and figure.formats() == ["png"]
        assert figure.png_bytes is not None
        width, height = _png_size(figure.png_bytes)
        assert width >= 100 and height >= 100
        assert value.text == "30" and value.html is None and chart.text == "30"
        assert [f.media_type for f in chart.observation.files] == ["image/png"]
        # The figure was closed with its call.
        assert sbx.run_code("len(plt.get_fignums())").text == "0"


def test_a_notebook_style_analysis_in_three_steps(session_server: str) -> None:
    with airlock.Sandbox.create(session_server) as sbx:
        assert sbx.mode == "kernel"
        sbx.files.write("data.csv", "x,y\n1,2\n3,4\n5,6\n")
        load = sbx.run_code("rows = [l.split(',') for l in open('data.csv').read().split()[1:]]")
        assert load.error is None and load.results == []
        total = sbx.run_code("ys = [int(r[1]) for r in rows]\nprint('rows', len(rows))\nsum(ys)")
        assert total.logs.stdout == ["rows 3\n"]
        assert total.text == "12"
        sbx.run_code("open('out.txt', 'w').write(str(max(ys)))")
        assert sbx.files.read("out.txt") == b"6"
        assert {f.path for f in sbx.files.list()} >= {"data.csv", "out.txt"}
        failed = sbx.run_code("undefined_name")
        assert failed.error is not None and failed.error.name == "NameError"
        session = sbx.id
    # The context manager ended it: the session is gone.
    gone = airlock.Sandbox(
        airlock.sandbox._SyncCaller(airlock.sandbox._endpoint(session_server, None), 10),
        {"id": session, "mode": "kernel"},
    )
    with pytest.raises(airlock.SessionNotFound):
        gone.run_code("1")


def test_the_async_sandbox(session_server: str) -> None:
    async def main() -> None:
        async with await airlock.AsyncSandbox.create(session_server) as sbx:
            await sbx.run_code("n = 20")
            result = await sbx.run_code("n + 22")
            assert result.text == "42"
            await sbx.files.write("a.txt", b"hi")
            assert await sbx.files.read("a.txt") == b"hi"

    asyncio.run(main())


def test_langgraph_keeps_one_session_per_conversation_thread(session_server: str) -> None:
    pytest.importorskip("langgraph", reason="the langgraph extra is not installed")
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.prebuilt import create_react_agent

    from airlock.langchain import SessionRunCodeTool

    class ScriptedChatModel(GenericFakeChatModel):
        """Answers each turn with the next scripted tool call, then a final message."""

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    turns = [
        ("alice", "total = 40"),
        ("alice", "total += 2\ntotal"),
        ("bob", "total"),
    ]
    script: list[AIMessage] = []
    for number, (_, code) in enumerate(turns):
        call = {"name": "run_code", "args": {"code": code}, "id": f"call-{number}"}
        script += [AIMessage(content="", tool_calls=[call]), AIMessage(content="done")]
    model = ScriptedChatModel(messages=iter(script))
    with SessionRunCodeTool(url=session_server) as tool:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # create_react_agent moved to langchain
            agent = create_react_agent(model, [tool], checkpointer=InMemorySaver())
        answers: list[dict[str, Any]] = []
        statuses: list[str] = []
        for thread, _ in turns:
            state = agent.invoke(
                {"messages": [HumanMessage("compute")]},
                {"configurable": {"thread_id": thread}},
            )
            message = [m for m in state["messages"] if isinstance(m, ToolMessage)][-1]
            assert isinstance(message.artifact, airlock.Execution)
            answers.append(json.loads(str(message.content)))
            statuses.append(message.status)
        # The call that raised is flagged with LangChain's own flag, and still answered.
        assert statuses == ["success", "success", "error"]
        first, second, other = answers
        # One session for alice's thread: the variable of turn 1 is there in turn 2.
        assert first["session"]["id"] == second["session"]["id"]
        assert first["new_session"] and "new_session" not in second
        assert second["value"] == "42", second
        # bob's thread is another session, which has no `total`.
        assert other["session"]["id"] != first["session"]["id"]
        assert other["error_raised"]["name"] == "NameError", other
        sessions = [first["session"]["id"], other["session"]["id"]]
    # Leaving the `with` ended both sessions.
    for session in sessions:
        gone = airlock.Sandbox(
            airlock.sandbox._SyncCaller(airlock.sandbox._endpoint(session_server, None), 10),
            {"id": session, "mode": "kernel"},
        )
        with pytest.raises(airlock.SessionNotFound):
            gone.run_code("1")
