"""Time to interactive through E2B's own Python SDK against `airlock serve` (issue 31):
from `Sandbox.create()` to the first `run_code` result (the code interpreter's template,
whose session starts a Python kernel), and from `Sandbox.create()` to the first
`commands.run` (the base template: a fresh sandbox over the session's /work). Each sample
is a new sandbox, killed after it is timed. Printed as Markdown beside the medians
computesdk published for E2B's and Daytona's clouds (time to interactive: 0.44 s and
0.11 s), as ratios. Run with a Python that has e2b-code-interpreter (bench/e2b.sh gives it
the pinned SDK of scripts/ci/e2b.sh). A benchmark, not a test."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

# computesdk's published time-to-interactive medians, seconds (issue 31).
PUBLISHED = {"E2B": 0.44, "Daytona": 0.11}


def start_server(
    airlock: str, work: Path, policy: Path | None = None
) -> tuple[subprocess.Popen[bytes], str, str]:
    tokens = work / "tokens.toml"
    key = subprocess.run(
        [airlock, "token", "new", "--tenant", "bench", "--e2b", "--tokens-file", str(tokens)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    log = open(work / "serve.log", "w+b")
    # The built-in policy (sessions on, kernel mode), as the contract block runs it.
    policy_args = ["--policy", str(policy)] if policy is not None else []
    proc = subprocess.Popen(
        [airlock, "serve", "--listen", "127.0.0.1:0", "--tokens", str(tokens), *policy_args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "AIRLOCK_STATE_DIR": str(work / "state")},
    )
    for _ in range(1200):
        log.seek(0)
        found = re.search(rb"listening on (http://127\.0\.0\.1:\d+)", log.read())
        if found:
            return proc, found.group(1).decode(), key
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    log.seek(0)
    raise SystemExit("airlock serve did not start:\n" + log.read().decode(errors="replace"))


def code_interpreter_once() -> float:
    from e2b_code_interpreter import Sandbox

    start = time.perf_counter()
    sandbox = Sandbox.create()
    execution = sandbox.run_code("1+1")
    elapsed = time.perf_counter() - start
    sandbox.kill()
    if execution.text != "2":
        raise SystemExit(f"run_code('1+1') answered {execution.text!r}")
    return elapsed


def command_once() -> float:
    from e2b import Sandbox

    start = time.perf_counter()
    sandbox = Sandbox.create()
    result = sandbox.commands.run("echo ready")
    elapsed = time.perf_counter() - start
    sandbox.kill()
    if result.stdout != "ready\n":
        raise SystemExit(f"commands.run answered {result.stdout!r}")
    return elapsed


def session_once(url: str, key: str) -> float:
    """The same through airlock's own API: POST /v1/sessions, then its first run."""
    import http.client
    import json
    from urllib.parse import urlsplit

    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port)
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}

    def call(method: str, path: str, body: object = None) -> object:
        data = None if body is None else json.dumps(body)
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        text = response.read()
        if response.status >= 300:
            raise SystemExit(f"{method} {path}: {response.status} {text[:300]!r}")
        return json.loads(text) if text else None

    start = time.perf_counter()
    session = call("POST", "/v1/sessions", {})
    assert isinstance(session, dict)
    result = call("POST", f"/v1/sessions/{session['id']}/runs", {"code": "1+1"})
    elapsed = time.perf_counter() - start
    call("DELETE", f"/v1/sessions/{session['id']}")
    connection.close()
    if not isinstance(result, dict) or result.get("value") != "2":
        raise SystemExit(f"the session's first run answered {result!r}")
    return elapsed


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--airlock", required=True, help="the airlock binary")
    parser.add_argument(
        "--runs", type=int, default=10, help="timed sandboxes per row (after one warm-up)"
    )
    args = parser.parse_args()
    from importlib.metadata import version

    import e2b_code_interpreter  # noqa: F401  (fails early without the SDK)

    # The built-in policy as `airlock serve` runs without --policy, then the same with the
    # native warm pool on (so a zygote): a session's kernel is then forked from it with the
    # session's mounts instead of started from scratch (docs/speed.md).
    builtin = (Path(__file__).resolve().parent.parent / "policy" / "default.toml").read_text()
    pooled = builtin.replace("\nwarm_pool = 0 ", "\nwarm_pool = 2 ", 1)
    if pooled == builtin:
        raise SystemExit("policy/default.toml has no native `warm_pool = 0` line to change")
    rows = []
    for label, policy_text in [("built-in policy", None), ("warm_pool = 2 (zygote)", pooled)]:
        with tempfile.TemporaryDirectory(prefix="airlock-bench-e2b-") as tmp:
            policy = None
            if policy_text is not None:
                policy = Path(tmp) / "policy.toml"
                policy.write_text(policy_text)
            proc, url, key = start_server(args.airlock, Path(tmp), policy)
            os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=key)
            try:
                for name, once in [
                    ("create -> first run_code result (code-interpreter-v1)", code_interpreter_once),
                    ("create -> first commands.run (base)", command_once),
                    (
                        "airlock's API: POST /v1/sessions -> first run result",
                        lambda: session_once(url, key),
                    ),
                ]:
                    # Warm-up: the minimal root's first copy, the SDK's imports; the
                    # pool's zygote, started beside the server, is up well before 3 s.
                    once()
                    if policy is not None:
                        time.sleep(3)
                    times = [once() for _ in range(args.runs)]
                    rows.append((f"{name}, {label}", times))
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    print(
        f"e2b {version('e2b')}, e2b-code-interpreter {version('e2b-code-interpreter')}, "
        f"{args.runs} sandboxes per row after one warm-up, binary {args.airlock}\n"
    )
    print(
        "| airlock, through E2B's Python SDK (or airlock's own API where named) | median s | p90 s | "
        + " | ".join(f"x {k} ({v} s)" for k, v in PUBLISHED.items())
        + " |"
    )
    print("|---|---|---|" + "---|" * len(PUBLISHED))
    for name, times in rows:
        median = statistics.median(times)
        ratios = " | ".join(f"{median / v:.2f}" for v in PUBLISHED.values())
        print(f"| {name} | {median:.3f} | {percentile(times, 0.9):.3f} | {ratios} |")
    print(
        "\nx is airlock's median over the published median (lower is better); E2B's and "
        "Daytona's figures are computesdk's, over the network to their clouds, not measured here."
    )


if __name__ == "__main__":
    main()
