"""`run_in_container`: the drop-in for the hand-written `docker run` tool handler."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from ._types import Observation
from .client import Client
from .errors import AirlockError, TransportError


class RunResult(dict[str, Any]):
    """The drop-in's dict: every observation field, then `ok`, `stdout`, `stderr`,
    `code` (the exit code, None when the program did not exit by itself) and `error`
    (None; else `"timeout"`, `"oom"`, `"killed"`, `"output_limit"`, or
    `"<kind>: <message>"` when airlock could not run the job). The typed observation is
    `.observation`."""

    observation: Observation

    def __init__(self, observation: Observation) -> None:
        super().__init__(observation.to_dict())
        self.observation = observation
        self["ok"] = observation.ok
        self["stdout"] = observation.stdout
        self["stderr"] = observation.stderr
        self["code"] = observation.exit_code
        self["error"] = _error_text(observation)


def _error_text(observation: Observation) -> str | None:
    if observation.outcome == "exited":
        return None
    if observation.outcome == "error":
        if observation.error is None:
            return "internal: the job could not run"
        return f"{observation.error.kind}: {observation.error.message}"
    return observation.outcome


def run_in_container(
    source: str | bytes,
    *,
    timeout_s: float | None = 5,
    language: str = "python",
    files: Mapping[str, str | bytes] | None = None,
    stdin: str | bytes | None = None,
    args: Sequence[str] = (),
    memory: str | None = None,
    cpus: float | None = None,
    pids: int | None = None,
    env: Mapping[str, str] | None = None,
    return_files: bool = False,
    url: str | None = None,
    token: str | None = None,
    client: Client | None = None,
) -> RunResult:
    """Runs `source` in a fresh airlock sandbox and returns a dict with `ok`, `stdout`,
    `stderr`, `code` and `error`, plus every observation field (and `.observation`).

    Local (the bundled binary) unless `url` or AIRLOCK_URL is given (`token` or
    AIRLOCK_TOKEN then authenticates). A job airlock refused (bad input, the policy)
    comes back as `ok: False` with `error` saying why, as a timeout does; only a client
    that cannot reach airlock at all (no binary, no server) raises `TransportError`."""
    runner = client or Client(url or os.environ.get("AIRLOCK_URL") or None, token)
    try:
        observation = runner.run(
            source,
            language=language,
            files=files,
            stdin=stdin,
            args=args,
            timeout_s=timeout_s,
            memory=memory,
            cpus=cpus,
            pids=pids,
            env=env,
            return_files=return_files,
        )
    except TransportError:
        raise
    except AirlockError as e:
        observation = e.observation or Observation.from_dict(
            {"ok": False, "outcome": "error", "error": {"kind": e.kind, "message": e.message}}
        )
    return RunResult(observation)
