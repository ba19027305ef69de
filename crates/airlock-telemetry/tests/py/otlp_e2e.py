"""End to end: airlock's OTLP export, received by an OTLP/HTTP receiver on 127.0.0.1 that
decodes every request with the official protobuf definitions (opentelemetry-proto).

Checks (each prints PASS or FAIL; the exit status is non-zero when any failed):
  serve_trace    a job through `airlock serve` with a traceparent continues the caller's
                 trace: `execute_tool run_code` (INTERNAL) with the GenAI and airlock.*
                 attributes and its children; an egress span for an allowed and a denied
                 proxied request
  serve_metrics  the /metrics instruments arrive over OTLP
  serve_logs     the audit record arrives as a log record with the job id, in the span
  python_caller_trace  the Python package inside an instrumented caller's span
  ts_caller_trace  the TypeScript package (js/) inside a span of a caller instrumented
                 with the Node SDK (skipped without node or js/build; AIRLOCK_REQUIRE_ALL=1
                 makes that a failure)
  session_trace  a session's call: a `session call` span in the caller's trace, with
                 airlock.session.id, its job span the child
  acquire        a warm pool's jobs: each `sandbox acquire` says warm, fork or fresh, and
                 the counts match the pool's own (/metrics)
  e2b_command_trace  an E2B command (envd process.Start) with a traceparent: an
                 `e2b command` span with the sandbox id, pid and exit code, its job the child
  e2b_run_code_trace  an E2B code cell (/execute): an `e2b run_code` span, the session's
                 kernel call its child
  mcp_trace      a job through `airlock mcp` (stdio) with `_meta.traceparent`; the MCP
                 request id is `gen_ai.tool.call.id`; export set by the policy's
                 [telemetry] section alone
  no_content     no source, stdin, output, command or cell text anywhere in what was
                 exported
  stuck_export   a collector that accepts and never answers delays no job: while the
                 exporter waits on it, jobs complete one after another, as with export off

Usage: otlp_e2e.py AIRLOCK_BIN
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

AIRLOCK = sys.argv[1]
# Texts that must never leave airlock: in the source (a comment), on stdin, and printed
# only at run time (built from pieces, so the source does not hold it whole).
SOURCE_MARK = "SRCMARK7c1e9a"
STDIN_MARK = "STDINMARK4b2d"
OUTPUT_MARK = "OUTMARK" + "93f0aa"
COMMAND_MARK = "CMDMARK5e81c2"
CELL_MARK = "CELLMARK0d4f7b"
REPO = Path(__file__).resolve().parents[4]
REQUIRE_ALL = os.environ.get("AIRLOCK_REQUIRE_ALL") == "1"
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
MCP_TRACE = "0af7651916cd43dd8448eb211c80319c"
MCP_SPAN = "b7ad6b7169203331"

RESULTS: list[tuple[str, bool, str]] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    RESULTS.append((name, ok, detail))
    print(
        f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}",
        flush=True,
    )


class Received:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.raw: list[bytes] = []
        self.spans: list[tuple[dict[str, Any], trace_pb2.Span]] = []
        self.metrics: list[Any] = []
        self.logs: list[Any] = []

    def span_list(self) -> list[trace_pb2.Span]:
        with self.lock:
            return [s for _, s in self.spans]


def attrs(items: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in items:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = getattr(v, kind) if kind else None
    return out


def start_receiver(received: Received) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with received.lock:
                received.raw.append(body)
                if self.path == "/v1/traces":
                    req = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    for rs in req.resource_spans:
                        resource = attrs(rs.resource.attributes)
                        for ss in rs.scope_spans:
                            for span in ss.spans:
                                received.spans.append((resource, span))
                elif self.path == "/v1/metrics":
                    req = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                    for rm in req.resource_metrics:
                        for sm in rm.scope_metrics:
                            received.metrics.extend(sm.metrics)
                elif self.path == "/v1/logs":
                    req = logs_service_pb2.ExportLogsServiceRequest.FromString(body)
                    for rl in req.resource_logs:
                        for sl in rl.scope_logs:
                            received.logs.extend(sl.log_records)
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def start_upstream() -> http.server.ThreadingHTTPServer:
    """The allowlisted upstream the job fetches through the egress proxy."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            body = b"upstream says hello"
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def otel_env(endpoint: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if endpoint:
        env.update(
            OTEL_EXPORTER_OTLP_ENDPOINT=endpoint,
            OTEL_SERVICE_NAME="airlock-e2e",
            OTEL_RESOURCE_ATTRIBUTES="deployment.environment=ci",
            OTEL_BSP_SCHEDULE_DELAY="200",
            OTEL_BLRP_SCHEDULE_DELAY="200",
            OTEL_METRIC_EXPORT_INTERVAL="500",
        )
    return env


def start_serve(env: dict[str, str], policy: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [AIRLOCK, "serve", "--listen", "127.0.0.1:0", "--policy", str(policy)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"listening on (http://[0-9.:]+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            return proc, m.group(1)
    raise RuntimeError("airlock serve did not start")


def post_run(base: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    req = urllib.request.Request(
        base + "/v1/runs",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **headers},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        result: dict[str, Any] = json.loads(resp.read())
        return result


def wait_for(predicate: Any, what: str, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    print(f"  (gave up waiting for {what})", flush=True)
    return False


def job_code(upstream_port: int) -> str:
    return f"""# {SOURCE_MARK}
import os, sys, urllib.request
sys.stdin.read()
print("OUTMARK" + "93f0aa")
for url in ("http://upstream.test:{upstream_port}/", "http://denied.test/"):
    try:
        urllib.request.urlopen(url, timeout=5).read()
    except Exception as e:
        print(type(e).__name__)
"""


def children_of(spans: list[trace_pb2.Span], parent: trace_pb2.Span) -> list[trace_pb2.Span]:
    return [
        s for s in spans if s.parent_span_id == parent.span_id and s.trace_id == parent.trace_id
    ]


def check_serve(received: Received, endpoint: str, workdir: Path, upstream_port: int) -> None:
    policy = workdir / "policy.toml"
    policy.write_text(
        'version = "otel-e2e-1"\n[network]\nmode = "proxy"\n'
        f'allow = ["upstream.test:{upstream_port}"]\nallow_ranges = ["127.0.0.1/32"]\n'
        'hosts = { "upstream.test" = ["127.0.0.1"], "denied.test" = ["127.0.0.1"] }\n'
        '[sessions]\nenabled = true\nmode = "workspace"\n'
    )
    proc, base = start_serve(otel_env(endpoint), policy)
    try:
        headers = {
            "traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01",
            "tracestate": "vendor=opaque",
            "baggage": "agent.turn=7",
            "Airlock-Tool-Call-Id": "call_e2e_1",
        }
        body = {
            "code": job_code(upstream_port),
            "language": "python",
            "stdin": STDIN_MARK + "\n",
            "network": "proxy",
        }
        obs = post_run(base, body, headers)
        job_id = obs["job_id"]
        ran = obs.get("ok") and OUTPUT_MARK in obs.get("stdout", "")
        check("serve_job_ran", bool(ran), json.dumps(obs)[:400])

        def job_span() -> trace_pb2.Span | None:
            for s in received.span_list():
                if (
                    s.name == "execute_tool run_code"
                    and attrs(s.attributes).get("airlock.job.id") == job_id
                ):
                    return s
            return None

        wait_for(lambda: job_span() is not None, "the job span")
        span = job_span()
        if span is None:
            check("serve_trace", False, "no execute_tool run_code span with the job id")
        else:
            a = attrs(span.attributes)
            problems = []
            if span.trace_id.hex() != CALLER_TRACE:
                problems.append(f"trace {span.trace_id.hex()} is not the caller's")
            if span.parent_span_id.hex() != CALLER_SPAN:
                problems.append(f"parent {span.parent_span_id.hex()} is not the caller's span")
            if span.kind != trace_pb2.Span.SPAN_KIND_INTERNAL:
                problems.append(f"kind {span.kind}")
            expected = {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "run_code",
                "gen_ai.tool.call.id": "call_e2e_1",
                "airlock.job.id": job_id,
                "airlock.backend": "native",
                "airlock.outcome": "exited",
                "airlock.exit_code": 0,
                "airlock.policy.version": "otel-e2e-1",
                "airlock.stdout.truncated": False,
            }
            for key, value in expected.items():
                if a.get(key) != value:
                    problems.append(f"{key}={a.get(key)!r}, expected {value!r}")
            for key in (
                "airlock.stdout.bytes",
                "airlock.redactions",
                "airlock.limits.memory",
                "airlock.limits.timeout",
                "airlock.network.connections",
            ):
                if key not in a:
                    problems.append(f"no {key}")
            wait_for(
                lambda: len(children_of(received.span_list(), span)) >= 6,
                "the children",
            )
            kids = children_of(received.span_list(), span)
            names = sorted(k.name for k in kids)
            for name in ("queue wait", "sandbox acquire", "run", "output"):
                if name not in names:
                    problems.append(f"no child {name!r} (children: {names})")
            egress = [k for k in kids if k.name.startswith("egress ")]
            verdicts = {
                attrs(k.attributes).get("airlock.egress.verdict"): attrs(k.attributes)
                for k in egress
            }
            allowed, denied = verdicts.get("allowed"), verdicts.get("denied")
            if (
                not allowed
                or allowed.get("server.address") != "upstream.test"
                or allowed.get("server.port") != upstream_port
            ):
                problems.append(
                    f"no allowed egress span to upstream.test:{upstream_port} ({verdicts})"
                )
            elif allowed.get("airlock.egress.bytes_down", 0) <= 0:
                problems.append("the allowed egress span counts no bytes")
            if (
                not denied
                or denied.get("server.address") != "denied.test"
                or not denied.get("airlock.egress.reason")
            ):
                problems.append(f"no denied egress span to denied.test with a reason ({verdicts})")
            if not wait_for(
                lambda: any(
                    s.name == "sandbox teardown"
                    and any(link.span_id == span.span_id for link in s.links)
                    for s in received.span_list()
                ),
                "the linked teardown span",
                10,
            ):
                problems.append("no sandbox teardown span linked to the job span")
            check("serve_trace", not problems, "; ".join(problems))

        def metric_names() -> set[str]:
            with received.lock:
                return {m.name for m in received.metrics}

        wait_for(lambda: "airlock.jobs.total" in metric_names(), "the jobs counter")
        names = metric_names()
        jobs_ok = False
        with received.lock:
            for m in received.metrics:
                if m.name == "airlock.jobs.total":
                    for dp in m.sum.data_points:
                        if attrs(dp.attributes).get("outcome") == "exited" and dp.as_double >= 1:
                            jobs_ok = m.sum.is_monotonic or jobs_ok
        missing = {
            "airlock.jobs.in.flight",
            "airlock.queue.wait.seconds.count",
            "airlock.output.bytes.total",
        } - names
        check(
            "serve_metrics",
            jobs_ok and not missing,
            f"jobs counter with outcome=exited >= 1: {jobs_ok}; missing {sorted(missing)}; "
            f"metrics: {sorted(names)}",
        )

        def audit_log() -> Any:
            with received.lock:
                for rec in received.logs:
                    if attrs(rec.attributes).get("airlock.job_id") == job_id:
                        return rec
            return None

        wait_for(lambda: audit_log() is not None, "the audit log record")
        rec = audit_log()
        problems = []
        if rec is None:
            problems.append("no log record with airlock.job_id")
        else:
            a = attrs(rec.attributes)
            if a.get("airlock.event") != "job" or a.get("airlock.outcome") != "exited":
                problems.append(f"fields: {a}")
            if "airlock.source_sha256" not in a:
                problems.append("no airlock.source_sha256")
            if span is not None and (rec.trace_id != span.trace_id or rec.span_id != span.span_id):
                problems.append("not correlated with the job span")
        check("serve_logs", not problems, "; ".join(problems))
        check_python_caller(received, base)
        check_ts_caller(received, base)
        check_session(received, base)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def check_session(received: Received, base: str) -> None:
    """A session's call through the HTTP API: its job span is in the caller's trace and
    names the session."""
    trace_id, parent = "5a1f0e4d3c2b1a09f8e7d6c5b4a39281", "1122334455667788"

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            base + path,
            data=json.dumps(body).encode(),
            headers={
                "content-type": "application/json",
                "traceparent": f"00-{trace_id}-{parent}-01",
            },
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            result: dict[str, Any] = json.loads(resp.read())
            return result

    session = post("/v1/sessions", {})
    session_id = session.get("session_id") or session.get("id")
    post(f"/v1/sessions/{session_id}/runs", {"code": "print(2)"})

    def span() -> trace_pb2.Span | None:
        for s in received.span_list():
            if s.name == "execute_tool run_code" and s.trace_id.hex() == trace_id:
                return s
        return None

    def call_span() -> trace_pb2.Span | None:
        for s in received.span_list():
            if s.name == "session call" and s.trace_id.hex() == trace_id:
                return s
        return None

    wait_for(lambda: span() is not None, "the session call's job span")
    wait_for(lambda: call_span() is not None, "the session call's span")
    s, call = span(), call_span()
    problems = []
    if s is None or call is None:
        problems.append(
            f"no execute_tool run_code ({s is not None}) or session call "
            f"({call is not None}) span in the session caller's trace"
        )
    else:
        got = attrs(s.attributes).get("airlock.session.id")
        if got != session_id:
            problems.append(f"airlock.session.id={got!r}, expected {session_id!r}")
        a = attrs(call.attributes)
        expected = {
            "airlock.session.id": session_id,
            "airlock.session.mode": "workspace",
            "airlock.session.call": 1,
            "airlock.outcome": "exited",
            "airlock.exit_code": 0,
            "airlock.job.id": attrs(s.attributes).get("airlock.job.id"),
        }
        for key, value in expected.items():
            if a.get(key) != value:
                problems.append(f"session call {key}={a.get(key)!r}, expected {value!r}")
        if call.parent_span_id.hex() != parent:
            problems.append("the session call's parent is not the caller's span")
        if s.parent_span_id != call.span_id:
            problems.append("the job span's parent is not the session call's span")
    check("session_trace", not problems, "; ".join(problems))


def skip_or_fail(name: str, reason: str) -> None:
    """A missing prerequisite: a printed skip, or a failure under AIRLOCK_REQUIRE_ALL=1."""
    if REQUIRE_ALL:
        check(name, False, f"skipped under AIRLOCK_REQUIRE_ALL=1: {reason}")
    else:
        print(f"SKIP {name}: {reason}", flush=True)


def check_ts_caller(received: Received, base: str) -> None:
    """The TypeScript package (js/ of this clone, built by otel.sh) called inside a span
    of a caller instrumented with the Node SDK: the job's span is a child of that span."""
    caller = REPO / "js/build/test/otel-caller.js"
    node = shutil.which("node")
    if node is None or not caller.exists():
        skip_or_fail(
            "ts_caller_trace",
            f"needs node ({node}) and {caller} (npm ci && npm run build:test in js/)",
        )
        return
    out = subprocess.run(
        [node, str(caller), base],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )
    problems: list[str] = []
    try:
        told = json.loads(out.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        check("ts_caller_trace", False, f"the caller said {out.stdout!r} {out.stderr[-800:]!r}")
        return
    trace_id, span_id = told["traceId"], told["spanId"]

    def span() -> trace_pb2.Span | None:
        for s in received.span_list():
            if s.name == "execute_tool run_code" and s.trace_id.hex() == trace_id:
                return s
        return None

    wait_for(lambda: span() is not None, "the TypeScript caller's job span")
    s = span()
    if told.get("stdout") != "3\n":
        problems.append(f"the job said {told.get('stdout')!r}")
    if s is None:
        problems.append(
            f"no execute_tool run_code span in the TypeScript caller's trace {trace_id}"
        )
    elif s.parent_span_id.hex() != span_id:
        problems.append("the job span's parent is not the caller's span")
    elif attrs(s.attributes).get("airlock.job.id") != told.get("jobId"):
        problems.append("the span is not the job's")
    check("ts_caller_trace", not problems, "; ".join(problems))


def metric_values(base: str, name: str) -> dict[str, float]:
    """`name`'s series on /metrics, by their `result` label."""
    with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(rf'^{re.escape(name)}(?:\{{result="([^"]*)"\}})? ([0-9.e+]+)$', line)
        if m:
            values[m.group(1) or ""] = float(m.group(2))
    return values


def check_acquire(received: Received, endpoint: str, workdir: Path) -> None:
    """A server with a warm pool of one: a job finding it ready runs warm, jobs that find
    none run in a sandbox forked for them (the zygote), a job the pool does not fit runs
    fresh; every job's `sandbox acquire` says which, and the counts are the pool's."""
    policy = workdir / "warm.toml"
    policy.write_text('version = "otel-e2e-warm"\n[native]\nwarm_pool = 1\n')
    env = otel_env(endpoint)
    env["OTEL_SERVICE_NAME"] = "airlock-e2e-warm"
    proc, base = start_serve(env, policy)
    problems: list[str] = []
    job_ids: list[str] = []

    def ready() -> bool:
        return metric_values(base, "airlock_warm_pool_ready").get("", 0) >= 1

    def run(language: str) -> None:
        code = "print(1)" if language == "python" else "echo 1"
        obs = post_run(base, {"code": code, "language": language}, {})
        if not obs.get("ok"):
            problems.append(f"a {language} job: {json.dumps(obs)[:200]}")
        job_ids.append(obs["job_id"])

    try:
        if not wait_for(ready, "a warm sandbox", 120):
            problems.append("the pool never had a sandbox ready")
        run("python")
        wait_for(ready, "the replacement", 120)
        batch = [threading.Thread(target=run, args=("python",)) for _ in range(4)]
        for t in batch:
            t.start()
        for t in batch:
            t.join()
        run("bash")

        def acquires() -> dict[str, Any]:
            jobs: dict[bytes, str] = {}
            for s in received.span_list():
                a = attrs(s.attributes)
                if s.name == "execute_tool run_code" and a.get("airlock.job.id") in job_ids:
                    jobs[s.span_id] = a["airlock.job.id"]
            found: dict[str, Any] = {}
            for s in received.span_list():
                if s.name == "sandbox acquire" and s.parent_span_id in jobs:
                    found[jobs[s.parent_span_id]] = attrs(s.attributes).get("airlock.acquire")
            return found

        wait_for(lambda: len(acquires()) == len(job_ids), "every job's sandbox acquire span")
        found = acquires()
        said = [found.get(j) for j in job_ids]
        jobs = metric_values(base, "airlock_warm_pool_jobs_total")
        sandboxes = metric_values(base, "airlock_warm_pool_sandboxes_total")
        print(f"  acquire: {said}; pool jobs {jobs}, sandboxes {sandboxes}", flush=True)
        if said[0] != "warm":
            problems.append(f"the job that found a sandbox ready says {said[0]!r}")
        if said[-1] != "fresh":
            problems.append(f"the bash job (unfit) says {said[-1]!r}")
        if "fork" not in said:
            problems.append("no job says fork (the batch found none ready)")
        counted = {v: said.count(v) for v in ("warm", "fork", "fresh")}
        pool = {
            "warm": jobs.get("hit", 0),
            "fork": sandboxes.get("started_for_job", 0),
            "fresh": jobs.get("unfit", 0)
            + jobs.get("miss", 0)
            - sandboxes.get("started_for_job", 0),
        }
        if counted != pool or None in said:
            problems.append(f"the spans say {counted}, the pool counted {pool}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    check("acquire", not problems, "; ".join(problems))


def connect_envelope(message: dict[str, Any]) -> bytes:
    payload = json.dumps(message).encode()
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def check_e2b(received: Received, endpoint: str, workdir: Path) -> None:
    """E2B's in-sandbox API, called as the SDKs call it, with a traceparent: a command
    (envd process.Start) and a code cell (the code interpreter's /execute)."""
    policy = workdir / "e2b.toml"
    policy.write_text('version = "otel-e2e-e2b"\n')
    proc, base = start_serve(otel_env(endpoint), policy)
    command_trace, command_parent = "c0ffee00c0ffee00c0ffee00c0ffee01", "0102030405060708"
    cell_trace, cell_parent = "ce11ce11ce11ce11ce11ce11ce11ce12", "1112131415161718"
    try:
        req = urllib.request.Request(
            base + "/sandboxes",
            data=json.dumps({"templateID": "code-interpreter-v1"}).encode(),
            headers={"content-type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            sandbox = json.loads(resp.read())
        sandbox_id, token = sandbox["sandboxID"], sandbox["envdAccessToken"]

        def in_sandbox(
            port: int, path: str, body: bytes, content_type: str, trace_id: str, parent: str
        ) -> bytes:
            req = urllib.request.Request(
                base + path,
                data=body,
                headers={
                    "content-type": content_type,
                    "e2b-sandbox-id": sandbox_id,
                    "e2b-sandbox-port": str(port),
                    "x-access-token": token,
                    "traceparent": f"00-{trace_id}-{parent}-01",
                },
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=120) as resp:
                return bytes(resp.read())

        stream = in_sandbox(
            49983,
            "/process.Process/Start",
            connect_envelope(
                {
                    "process": {
                        "cmd": "/bin/bash",
                        "args": ["-l", "-c", f"echo {COMMAND_MARK}; exit 3"],
                    }
                }
            ),
            "application/connect+json",
            command_trace,
            command_parent,
        )
        if b'"exitCode":3' not in stream:
            check("e2b_command_trace", False, f"the command's stream: {stream[:400]!r}")
        else:
            check_e2b_span(
                received,
                "e2b_command_trace",
                "e2b command",
                command_trace,
                command_parent,
                {
                    "airlock.e2b.sandbox.id": sandbox_id,
                    "airlock.exit_code": 3,
                    "airlock.outcome": "exited",
                },
                "execute_tool run_code",
                ("airlock.e2b.pid",),
            )
        lines = in_sandbox(
            49999,
            "/execute",
            json.dumps({"code": f"x = 6 * 7\nprint('{CELL_MARK}')"}).encode(),
            "application/json",
            cell_trace,
            cell_parent,
        )
        if CELL_MARK.encode() not in lines or b"end_of_execution" not in lines:
            check("e2b_run_code_trace", False, f"the cell's lines: {lines[:400]!r}")
        else:
            check_e2b_span(
                received,
                "e2b_run_code_trace",
                "e2b run_code",
                cell_trace,
                cell_parent,
                {"airlock.e2b.sandbox.id": sandbox_id, "airlock.outcome": "exited"},
                "session call",
                ("airlock.e2b.execution_count",),
                {"airlock.session.mode": "kernel"},
            )
        urllib.request.urlopen(
            urllib.request.Request(base + f"/sandboxes/{sandbox_id}", method="DELETE"), timeout=60
        ).read()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def check_e2b_span(
    received: Received,
    name: str,
    span_name: str,
    trace_id: str,
    parent: str,
    expected: dict[str, Any],
    child_name: str,
    present: tuple[str, ...],
    child_expected: dict[str, Any] | None = None,
) -> None:
    def spans() -> tuple[trace_pb2.Span | None, trace_pb2.Span | None]:
        top = next(
            (
                s
                for s in received.span_list()
                if s.name == span_name and s.trace_id.hex() == trace_id
            ),
            None,
        )
        child = None
        if top is not None:
            child = next(
                (s for s in children_of(received.span_list(), top) if s.name == child_name), None
            )
        return top, child

    wait_for(lambda: None not in spans(), f"the {span_name} span and its {child_name} child")
    top, child = spans()
    problems: list[str] = []
    if top is None:
        problems.append(f"no {span_name!r} span in the caller's trace")
    else:
        a = attrs(top.attributes)
        if top.parent_span_id.hex() != parent:
            problems.append("its parent is not the caller's span")
        for key, value in expected.items():
            if a.get(key) != value:
                problems.append(f"{key}={a.get(key)!r}, expected {value!r}")
        for key in (*present, "airlock.session.id", "airlock.job.id"):
            if key not in a:
                problems.append(f"no {key}")
        if child is None:
            problems.append(f"no {child_name!r} child")
        else:
            ca = attrs(child.attributes)
            for key, value in (child_expected or {}).items():
                if ca.get(key) != value:
                    problems.append(f"child {key}={ca.get(key)!r}, expected {value!r}")
            if ca.get("airlock.session.id") != a.get("airlock.session.id"):
                problems.append("the child names another session")
    check(name, not problems, "; ".join(problems))


def check_python_caller(received: Received, base: str) -> None:
    """The airlock Python package (python/ of this clone) called inside a span of an
    OpenTelemetry-instrumented program: the job's span is a child of that span."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "python"))
    import airlock
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    tracer = trace.get_tracer("otel-e2e-agent")
    with tracer.start_as_current_span("agent tool call") as caller:
        ctx = caller.get_span_context()
        obs = airlock.Client(base).run("print(1)")
    trace_id, span_id = f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"

    def span() -> trace_pb2.Span | None:
        for s in received.span_list():
            if s.name == "execute_tool run_code" and s.trace_id.hex() == trace_id:
                return s
        return None

    wait_for(lambda: span() is not None, "the Python caller's job span")
    s = span()
    problems = []
    if s is None:
        problems.append(f"no execute_tool run_code span in the Python caller's trace {trace_id}")
    elif s.parent_span_id.hex() != span_id:
        problems.append("the job span's parent is not the caller's span")
    elif attrs(s.attributes).get("airlock.job.id") != obs.job_id:
        problems.append("the span is not the job's")
    check("python_caller_trace", not problems, "; ".join(problems))


def check_mcp(received: Received, endpoint: str, workdir: Path) -> None:
    """`airlock mcp` with export configured by the policy's [telemetry] section alone
    (no OTEL_EXPORTER_OTLP_* variable)."""
    policy = workdir / "mcp.toml"
    policy.write_text(
        'version = "otel-e2e-mcp"\n[telemetry]\n'
        f'endpoint = "{endpoint}"\nservice_name = "airlock-mcp-policy"\n'
    )
    env = otel_env(None)
    env.update(OTEL_BSP_SCHEDULE_DELAY="200", OTEL_BLRP_SCHEDULE_DELAY="200")
    proc = subprocess.Popen(
        [AIRLOCK, "mcp", "--policy", str(policy)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None

    def send(msg: dict[str, Any]) -> None:
        proc.stdin.write(json.dumps(msg) + "\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]

    def reply(id_: Any) -> dict[str, Any]:
        for line in proc.stdout:  # type: ignore[union-attr]
            msg = json.loads(line)
            if msg.get("id") == id_:
                return msg  # type: ignore[no-any-return]
        raise RuntimeError("airlock mcp closed")

    try:
        send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "otel-e2e", "version": "1"},
                },
            }
        )
        reply(1)
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send(
            {
                "jsonrpc": "2.0",
                "id": "call-42",
                "method": "tools/call",
                "params": {
                    "name": "run_code",
                    "arguments": {
                        "code": f"# {SOURCE_MARK}\nprint('OUTMARK' + '93f0aa')",
                        "language": "python",
                    },
                    "_meta": {"traceparent": f"00-{MCP_TRACE}-{MCP_SPAN}-01"},
                },
            }
        )
        result = reply("call-42")
        text = json.dumps(result)
        check("mcp_job_ran", OUTPUT_MARK in text, text[:300])

        def span() -> trace_pb2.Span | None:
            for s in received.span_list():
                if s.name == "execute_tool run_code" and s.trace_id.hex() == MCP_TRACE:
                    return s
            return None

        wait_for(lambda: span() is not None, "the MCP job span")
        s = span()
        problems = []
        if s is None:
            problems.append("no execute_tool run_code span in the caller's trace")
        else:
            a = attrs(s.attributes)
            if s.parent_span_id.hex() != MCP_SPAN:
                problems.append("parent is not the caller's span")
            if a.get("gen_ai.tool.call.id") != "call-42":
                problems.append(f"gen_ai.tool.call.id={a.get('gen_ai.tool.call.id')!r}")
            if a.get("airlock.outcome") != "exited":
                problems.append(f"outcome {a.get('airlock.outcome')!r}")
            with received.lock:
                resource = next(r for r, sp in received.spans if sp is s)
            if resource.get("service.name") != "airlock-mcp-policy":
                problems.append(f"service.name {resource.get('service.name')!r}")
        check("mcp_trace", not problems, "; ".join(problems))
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def check_no_content(received: Received) -> None:
    with received.lock:
        blob = b"".join(received.raw)
    leaked = [
        m
        for m in (
            SOURCE_MARK,
            STDIN_MARK,
            OUTPUT_MARK,
            COMMAND_MARK,
            CELL_MARK,
            "upstream says hello",
        )
        if m.encode() in blob
    ]
    check(
        "no_content",
        bool(blob) and not leaked,
        f"found {leaked} in {len(blob)} exported bytes",
    )


def check_stuck_exporter(workdir: Path) -> None:
    """A collector that accepts and reads nothing, never answering: the exporter's first
    request hangs on it (for OTEL_EXPORTER_OTLP_TIMEOUT, set far beyond the test). Jobs
    run while it hangs, and complete just as they do with export off."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)
    accepted: list[socket.socket] = []
    threading.Thread(
        target=lambda: [accepted.append(hole.accept()[0]) for _ in iter(int, 1)],
        daemon=True,
    ).start()
    policy = workdir / "plain.toml"
    policy.write_text('version = "otel-e2e-plain"\n')
    env = otel_env(f"http://127.0.0.1:{hole.getsockname()[1]}")
    env["OTEL_EXPORTER_OTLP_TIMEOUT"] = "600000"
    stuck, stuck_base = start_serve(env, policy)
    off, off_base = start_serve(otel_env(None), policy)
    body = {"code": "print(6 * 7)", "language": "python"}
    problems = []
    try:
        first = post_run(stuck_base, body, {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
        if not wait_for(
            lambda: len(accepted) > 0, "the exporter to connect to the stuck collector"
        ):
            problems.append("the exporter never connected: the test would prove nothing")
        # From here the exporter is blocked on a request that will never be answered.
        order: list[str] = []
        for i in range(5):
            for name, base in (("on", stuck_base), ("off", off_base)):
                obs = post_run(base, body, {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"})
                if obs.get("ok") and obs.get("stdout") == "42\n":
                    order.append(name)
                else:
                    problems.append(f"job {i} with export {name}: {json.dumps(obs)[:200]}")
        if not first.get("ok"):
            problems.append("the first job failed")
        if order != ["on", "off"] * 5:
            problems.append(f"completions {order}")
        # Still unanswered: every job above completed while an export was pending.
        if stuck.poll() is not None:
            problems.append("airlock serve exited")
    finally:
        for p in (stuck, off):
            p.terminate()
        for p in (stuck, off):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                problems.append("airlock serve did not stop within 30 s of SIGTERM")
        for c in accepted:
            c.close()
        hole.close()
    check("stuck_export", not problems, "; ".join(problems))


def main() -> int:
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"airlock-otel-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    received = Received()
    receiver = start_receiver(received)
    upstream = start_upstream()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}"
    check_serve(received, endpoint, workdir, upstream.server_address[1])
    check_mcp(received, endpoint, workdir)
    check_acquire(received, endpoint, workdir)
    check_e2b(received, endpoint, workdir)
    check_no_content(received)
    check_stuck_exporter(workdir)
    failed = [n for n, ok, _ in RESULTS if not ok]
    print(
        f"{len(RESULTS) - len(failed)} passed, {len(failed)} failed"
        + (f": {failed}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
