"""airlock.Sandbox over a real `airlock serve` whose policy enables kernel sessions: a
notebook-style three-step analysis, files in and out, the context manager ending it."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import airlock


@pytest.fixture(scope="module")
def session_server(airlock_bin: str) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="airlock-sandbox-") as work_dir:
        work = Path(work_dir)
        policy = work / "policy.toml"
        policy.write_text('version = "sbx-1"\n[sessions]\nenabled = true\nmode = "kernel"\n')
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
