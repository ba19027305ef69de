"""Local mode: the `airlock` binary the wheel installed (or AIRLOCK_BIN), one
`airlock run --json` process per job (crates/airlock-cli/src/run.rs). The CLI prints
exactly one observation on stdout whatever the job did; its exit code is the job's, so it
is not an error signal here."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._request import RunRequest, read_out_dir
from ._types import Observation, ObservationFormatError
from .errors import BinaryNotFound, ClientTimeout, TransportError

#: How long the CLI gets to kill its job and remove the sandbox after SIGTERM.
TERMINATE_GRACE_S = 10.0
#: Bytes of the CLI's stderr quoted in an error.
STDERR_QUOTE_BYTES = 2000


def find_binary(explicit: str | os.PathLike[str] | None = None) -> str:
    """The `airlock` binary: `explicit`, else AIRLOCK_BIN, else the one installed with this
    package (the interpreter's scripts directory, also the user scheme's), else PATH."""
    chosen = explicit if explicit is not None else os.environ.get("AIRLOCK_BIN") or None
    if chosen is not None:
        path = Path(chosen)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise BinaryNotFound(f"airlock binary {str(path)!r} is not an executable file")
        return str(path)
    candidates: list[Path] = []
    for scheme in (None, f"{os.name}_user"):
        try:
            scripts = (
                sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
            )
        except KeyError:
            continue
        if scripts:
            candidates.append(Path(scripts) / "airlock")
    candidates.append(Path(sys.executable).parent / "airlock")
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("airlock")
    if found:
        return found
    raise BinaryNotFound(
        "no airlock binary: install the airlock-sandbox wheel (it carries one), set "
        "AIRLOCK_BIN to a binary, or set AIRLOCK_URL to use a server"
    )


def _parse(stdout: bytes, stderr: bytes, returncode: int) -> dict[str, Any]:
    try:
        data = json.loads(stdout)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        quoted = stderr[-STDERR_QUOTE_BYTES:].decode("utf-8", "replace").strip()
        raise TransportError(
            f"airlock run exited {returncode} without an observation"
            + (f": {quoted}" if quoted else "")
        )
    return data


def _observation(data: dict[str, Any], out_dir: Path | None) -> Observation:
    if out_dir is not None:
        read_out_dir(data, out_dir)
    try:
        return Observation.from_dict(data)
    except ObservationFormatError as e:
        raise TransportError(f"airlock run printed something else: {e}") from e


def _argv(
    binary: str, options: Sequence[str], request: RunRequest, scratch: Path
) -> tuple[list[str], Path | None]:
    out_dir = scratch / "out" if request.return_files else None
    return [binary, "run", *options, *request.to_argv(scratch, out_dir)], out_dir


def run(
    binary: str, options: Sequence[str], request: RunRequest, timeout_s: float | None
) -> Observation:
    """Runs one job with `airlock run --json`; `timeout_s` bounds the whole process."""
    with tempfile.TemporaryDirectory(prefix="airlock-py-") as scratch_dir:
        argv, out_dir = _argv(binary, options, request, Path(scratch_dir))
        try:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
            )
        except OSError as e:
            raise BinaryNotFound(f"start {binary}: {e}") from e
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            _terminate(process)
            raise ClientTimeout(f"airlock run gave no observation within {timeout_s} s") from e
        except BaseException:
            # KeyboardInterrupt and friends: the CLI kills its job on SIGTERM.
            _terminate(process)
            raise
        return _observation(_parse(stdout, stderr, process.returncode), out_dir)


def _terminate(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.communicate(timeout=TERMINATE_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()


async def async_run(
    binary: str, options: Sequence[str], request: RunRequest, timeout_s: float | None
) -> Observation:
    """`run`, as a coroutine: cancelling it terminates the CLI, which kills the job."""
    with tempfile.TemporaryDirectory(prefix="airlock-py-") as scratch_dir:
        argv, out_dir = _argv(binary, options, request, Path(scratch_dir))
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as e:
            raise BinaryNotFound(f"start {binary}: {e}") from e
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout_s)
        except asyncio.TimeoutError as e:
            await _async_terminate(process)
            raise ClientTimeout(f"airlock run gave no observation within {timeout_s} s") from e
        except BaseException:
            await asyncio.shield(_async_terminate(process))
            raise
        return _observation(_parse(stdout, stderr, process.returncode or 0), out_dir)


async def _async_terminate(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), TERMINATE_GRACE_S)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()


def tool_schema(binary: str, policy: str | None, fmt: str, timeout_s: float) -> dict[str, Any]:
    """The run_code tool's definition from the binary: `airlock tool-schema --format F`."""
    policy_args = ["--policy", policy] if policy else []
    try:
        done = subprocess.run(
            [binary, "tool-schema", "--format", fmt, *policy_args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TransportError(f"{binary} tool-schema: {e}") from e
    if done.returncode != 0:
        quoted = done.stderr[-STDERR_QUOTE_BYTES:].decode("utf-8", "replace").strip()
        raise TransportError(f"airlock tool-schema exited {done.returncode}: {quoted}")
    try:
        data = json.loads(done.stdout)
    except ValueError as e:
        raise TransportError("airlock tool-schema printed something other than JSON") from e
    if isinstance(data, dict):
        return data
    raise TransportError("airlock tool-schema printed something other than an object")
