"""Fixtures: the real `airlock` binary (local mode) and a real `airlock serve` on
127.0.0.1 with a tokens file (remote mode), started the way scripts/ci/server.sh does.

Tests that need something this host lacks skip with the reason; AIRLOCK_REQUIRE_ALL=1
(python/ci.sh sets it in CI) turns every skip into a failure."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import airlock
from airlock import _local

REPO = Path(__file__).resolve().parents[2]
REQUIRE_ALL = os.environ.get("AIRLOCK_REQUIRE_ALL") == "1"
#: Longest wait for `airlock serve` to print its address.
SERVER_START_S = 30.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if REQUIRE_ALL and report.skipped:
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under AIRLOCK_REQUIRE_ALL=1: {reason}"


def _binary() -> str | None:
    try:
        return _local.find_binary()
    except airlock.BinaryNotFound:
        pass
    built = REPO / "target" / "debug" / "airlock"
    return str(built) if built.is_file() else None


@pytest.fixture(scope="session")
def airlock_bin() -> str:
    """The binary under test: AIRLOCK_BIN, else the installed wheel's, else the build."""
    found = _binary()
    if found is None:
        pytest.skip("no airlock binary (install the wheel, set AIRLOCK_BIN, or cargo build)")
    if os.geteuid() != 0:
        pytest.skip("the native sandbox needs root here")
    return found


@pytest.fixture(autouse=True)
def _environment(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    # Every test starts local, with the binary under test, whatever the caller's shell has.
    monkeypatch.delenv("AIRLOCK_URL", raising=False)
    monkeypatch.delenv("AIRLOCK_TOKEN", raising=False)
    if request.node.get_closest_marker("pure") is not None:
        # Tests of the wire format alone: no binary, no root.
        monkeypatch.setenv("AIRLOCK_BIN", "/nonexistent/airlock")
        return
    monkeypatch.setenv("AIRLOCK_BIN", request.getfixturevalue("airlock_bin"))


@dataclass(frozen=True)
class Server:
    url: str
    token: str
    log: Path


@pytest.fixture(scope="session")
def server(airlock_bin: str) -> Iterator[Server]:
    """`airlock serve` on 127.0.0.1 with one tenant's token."""
    with tempfile.TemporaryDirectory(prefix="airlock-pytest-") as work_dir:
        work = Path(work_dir)
        token = subprocess.run(
            [
                airlock_bin,
                "token",
                "new",
                "--tenant",
                "pytest",
                "--tokens-file",
                str(work / "tokens.toml"),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        log = work / "serve.log"
        env = {**os.environ, "AIRLOCK_STATE_DIR": str(work / "state")}
        with log.open("wb") as log_file:
            process = subprocess.Popen(
                [
                    airlock_bin,
                    "serve",
                    "--listen",
                    "127.0.0.1:0",
                    "--tokens",
                    str(work / "tokens.toml"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                env=env,
            )
        try:
            deadline = time.monotonic() + SERVER_START_S
            address = None
            while address is None:
                match = re.search(r"listening on (http://[0-9.:]+)", log.read_text())
                if match:
                    address = match.group(1)
                elif process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"airlock serve did not start:\n{log.read_text()}")
                else:
                    time.sleep(0.05)
            yield Server(url=address, token=token, log=log)
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        assert token not in log.read_text(), "the bearer token reached the server log"


@pytest.fixture(params=["local", "remote"])
def mode(request: pytest.FixtureRequest) -> str:
    """Each test that takes `client` runs once per mode."""
    return str(request.param)


@pytest.fixture
def remote_or_local(mode: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """The keywords of a client (`Client(**remote_or_local)`) for the mode."""
    if mode == "local":
        return {}
    srv: Server = request.getfixturevalue("server")
    return {"url": srv.url, "token": srv.token}


@pytest.fixture
def client(mode: str, request: pytest.FixtureRequest) -> airlock.Client:
    if mode == "local":
        return airlock.Client()
    srv: Server = request.getfixturevalue("server")
    return airlock.Client(srv.url, srv.token)


@pytest.fixture
def async_client(mode: str, request: pytest.FixtureRequest) -> airlock.AsyncClient:
    if mode == "local":
        return airlock.AsyncClient()
    srv: Server = request.getfixturevalue("server")
    return airlock.AsyncClient(srv.url, srv.token)
