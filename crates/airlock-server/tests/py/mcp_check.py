#!/usr/bin/env python3
"""Checks airlock's MCP tool server (and the HTTP API's tool contract) with the official
`mcp` client package (PyPI).

Usage:
  mcp_check.py stdio AIRLOCK_BIN         spawns `AIRLOCK_BIN mcp` and talks over stdio
  mcp_check.py http URL TOKEN            streamable HTTP to URL (.../mcp); also the HTTP
                                         API's side of the contract (/v1/runs, 401 bodies)
  mcp_check.py cancel-stdio AIRLOCK_BIN  cancellation: spawns `AIRLOCK_BIN mcp --max-in-flight 1`
  mcp_check.py cancel-http URL TOKEN     cancellation against a server started with
                                         --max-in-flight 1 (URL is its .../mcp)
  mcp_check.py tool-schema BASE TOKEN    GET BASE/v1/tool-schema?format=chat|responses;
                                         needs openai-agents (run with the agents venv)

Every check runs and is reported (ok:/FAIL:/SKIP: lines); the exit status is non-zero
when any failed, or when any was skipped and AIRLOCK_REQUIRE_ALL=1.
"""
import asyncio
import base64
import copy
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse
import uuid

from airlock_cases import (CASES, CLIENT_TIMEOUT_S, POLICY_WALL_TIME_S, Report, expected_tools,
                           http_json, observation_from_text)

TIMEOUT = float(CLIENT_TIMEOUT_S)
# Formats OpenAI's strict mode accepts; anything else ("double", "uint64") breaks it.
STRICT_FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
RUNTIME_DIR = os.environ.get("AIRLOCK_RUNTIME_DIR", "/run/airlock")
# A cancelled job's slot must be free again this soon (on top of a normal call's time).
SLOT_FREED_WITHIN_S = 1.0


def field(obj, snake, camel):
    """A field of an mcp type, whichever naming this version of the package uses."""
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, camel)


# ---------------------------------------------------------------------------------------
# Schema checks


def strict_schema_problems(schema, path="$", require_all=True):
    """Why `schema` is not usable as-is by a strict-mode function-calling model: `$ref` /
    `$defs`, a root `$schema`, an open object, a `format` strict mode does not know, and
    (with `require_all`) a property left out of `required`."""
    problems = []
    if path == "$" and "$schema" in schema:
        problems.append("$: has a root $schema")

    def walk(node, where):
        if isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{where}[{i}]")
            return
        if not isinstance(node, dict):
            return
        for key in ("$ref", "$defs", "definitions"):
            if key in node:
                problems.append(f"{where}: has {key}")
        if "format" in node and node["format"] not in STRICT_FORMATS:
            problems.append(f"{where}: format {node['format']!r}")
        types = node.get("type")
        is_object = types == "object" or (isinstance(types, list) and "object" in types) or "properties" in node
        if is_object:
            if node.get("additionalProperties") is not False:
                problems.append(f"{where}: additionalProperties is {node.get('additionalProperties')!r}, not false")
            props = set(node.get("properties", {}))
            required = set(node.get("required", []))
            if require_all and props != required:
                problems.append(f"{where}: not every property is required (missing {sorted(props - required)})")
        for key, value in node.items():
            if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
                for name, sub in value.items():
                    walk(sub, f"{where}.{key}.{name}")
            elif key != "enum" and key != "const" and key != "default":
                walk(value, f"{where}.{key}")

    walk(schema, path)
    return problems


def enum_values(schema):
    """Every enum value anywhere under `schema` (a nullable enum may sit in an anyOf)."""
    found = []
    if isinstance(schema, dict):
        found.extend(schema.get("enum", []))
        for value in schema.values():
            found.extend(enum_values(value))
    elif isinstance(schema, list):
        for value in schema:
            found.extend(enum_values(value))
    return found


def validate(instance, schema):
    """The jsonschema validation error of `instance` against `schema`, or None."""
    import jsonschema
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    errors = sorted(validator_class(schema).iter_errors(instance), key=lambda e: list(e.path))
    return None if not errors else f"{errors[0].message} at {list(errors[0].path)}"


# ---------------------------------------------------------------------------------------
# stdio and HTTP: listing and calls


class Session:
    """A ClientSession plus what the checks need from each result."""

    def __init__(self, session, report, transport):
        self.session = session
        self.report = report
        self.transport = transport
        self.output_schema = None

    async def call(self, arguments, timeout=TIMEOUT):
        """Calls run_code; returns (result, observation), checking the structured content."""
        result = await self.session.call_tool("run_code", arguments, read_timeout_seconds=timeout)
        text = "".join(c.text for c in result.content if getattr(c, "type", "") == "text")
        obs = json.loads(text)
        structured = field(result, "structured_content", "structuredContent")
        what = f"{self.transport}: structuredContent equals the text observation"
        if structured != obs:
            self.report.ok(False, f"{what} ({json.dumps(structured)[:300]})")
        if self.output_schema is not None:
            error = validate(structured, self.output_schema)
            if error is not None:
                self.report.ok(False, f"{self.transport}: structuredContent fits the outputSchema: {error}")
        return result, obs


def is_error(result):
    return field(result, "is_error", "isError")


async def exercise(session, report, transport):
    await session.initialize()
    s = Session(session, report, transport)
    tools = (await session.list_tools()).tools
    want = expected_tools(transport)
    report.ok([t.name for t in tools] == want, f"{transport}: the tools are {want} ({[t.name for t in tools]})")
    tool = next((t for t in tools if t.name == "run_code"), None)
    if tool is None:
        return
    schema = field(tool, "input_schema", "inputSchema")
    properties = schema.get("properties", {})
    report.ok("code" in properties and "code" in schema.get("required", []), f"{transport}: code is a required argument")
    report.ok("python" in enum_values(properties.get("language", {})), f"{transport}: python is a language")
    report.ok("return_files" in properties, f"{transport}: run_code takes return_files")
    # Strict-ready without rewriting references; whether optional arguments are listed in
    # `required` (as nullable) is the server's choice here: the Agents SDK's conversion adds
    # them, and CrewAI reads either form (crewai_check.py).
    problems = strict_schema_problems(schema, require_all=False)
    report.ok(not problems, f"{transport}: inputSchema is strict-ready (no $ref/$defs, closed objects): {problems[:4]}")
    output_schema = field(tool, "output_schema", "outputSchema")
    report.ok(isinstance(output_schema, dict) and output_schema.get("type") == "object"
              and {"ok", "outcome", "stdout"} <= set(output_schema.get("properties", {})),
              f"{transport}: an outputSchema for the observation is declared ({json.dumps(output_schema)[:200]})")
    if isinstance(output_schema, dict):
        s.output_schema = output_schema
    report.ok("network is off" in (tool.description or ""), f"{transport}: description says the network is off")
    report.ok("wall time" in (tool.description or ""), f"{transport}: description gives the limits")

    async def attempt(what, arguments, expect):
        """One call; `expect(result, obs)` is a list of (condition, description)."""
        try:
            result, obs = await s.call(arguments)
        except Exception as e:  # reported, and the next check still runs
            report.ok(False, f"{transport}: {what}: {type(e).__name__}: {e}"[:1500])
            return
        for condition, description in expect(result, obs):
            report.ok(condition, f"{transport}: {what}: {description}"
                      + ("" if condition else f"; observation: {json.dumps(obs)[:800]}"))

    await attempt(
        "files and timeout_s",
        {"language": "python",
         "code": "import sys\nprint(sum(range(10)))\nprint(open('in.txt').read(), file=sys.stderr)",
         "files": [{"path": "in.txt", "content": "from a file"}], "timeout_s": 3},
        lambda r, o: [(is_error(r) is False, "a job that exits 0 is not an error"),
                      (o.get("ok") is True and o.get("stdout") == "45\n", "stdout is the program's"),
                      (o.get("stderr") == "from a file\n", "input files reach the program"),
                      (o.get("backend") == "native" and bool(o.get("job_id")), "observation fields")])
    await attempt("exit code 3", {"language": "python", "code": "raise SystemExit(3)"},
                  lambda r, o: [(is_error(r) is True, "a job that exits 3 is an error"),
                                (o.get("outcome") == "exited" and o.get("exit_code") == 3, "exit code 3")])
    await attempt("unknown language", {"language": "cobol", "code": "x"},
                  lambda r, o: [(is_error(r) is True, "is an error"),
                                (o.get("outcome") == "error" and (o.get("error") or {}).get("kind") == "invalid_input",
                                 "invalid_input")])
    await attempt("code alone", {"code": "print(1)"},
                  lambda r, o: [(o.get("ok") is True and o.get("stdout") == "1\n", "runs as Python (the default language)")])
    nulls = {name: None for name in properties}
    nulls["code"] = "print('nulls')"
    await attempt("every optional argument null", nulls,
                  lambda r, o: [(o.get("ok") is True and o.get("stdout") == "nulls\n", "null is taken as absent")])
    await attempt("a file's optional fields null",
                  {"language": "python", "code": "print(open('a.txt').read())", "files": [{"path": "a.txt", "content": "A", "content_base64": None}]},
                  lambda r, o: [(o.get("ok") is True and o.get("stdout") == "A\n", "content_base64: null is absent")])
    await attempt("timeout_s 1e9", {"language": "python", "code": "1", "timeout_s": 1e9},
                  lambda r, o: [(is_error(r) is True, "is an error"),
                                ((o.get("error") or {}).get("kind") == "policy_denied", "above the ceiling is policy_denied")])
    # /out files: past the MCP inline budget (64 KiB by default) a file comes back only as a
    # resource_link, which the client reads back byte for byte with resources/read.
    try:
        result, obs = await s.call({"code": (
            "open('/out/big.bin', 'wb').write(bytes(range(256)) * 400)\n"
            "open('/out/note.txt', 'w').write('small note')\n"), "return_files": True})
        links = {c.name: c for c in result.content if getattr(c, "type", "") == "resource_link"}
        listed = {f["path"]: f for f in obs.get("files", [])}
        report.ok(set(listed) == {"big.bin", "note.txt"} and set(links) == {"big.bin"},
                  f"{transport}: the file past the inline budget is a resource_link ({sorted(links)}, {sorted(listed)})")
        report.ok("content_base64" not in listed.get("big.bin", {}),
                  f"{transport}: a 100 KiB file is not inlined over MCP")
        report.ok(listed.get("note.txt", {}).get("content_base64") is not None,
                  f"{transport}: a small file is still inlined")
        uris = {"big.bin": links["big.bin"].uri if "big.bin" in links else None,
                "note.txt": f"airlock://jobs/{obs.get('job_id')}/out/note.txt"}
        for name, want in (("big.bin", bytes(range(256)) * 400), ("note.txt", b"small note")):
            if uris[name] is None:
                continue
            read = await session.read_resource(uris[name])
            content = read.contents[0]
            got = base64.b64decode(content.blob) if hasattr(content, "blob") else content.text.encode()
            report.ok(got == want, f"{transport}: resources/read of {uris[name]} gives the file's bytes ({len(got)} B)")
        templates = await session.list_resource_templates()
        report.ok([field(t, "uri_template", "uriTemplate")
                   for t in field(templates, "resource_templates", "resourceTemplates")] == ["airlock://jobs/{job_id}/out/{path}"],
                  f"{transport}: resources/templates/list announces the job file template")
    except Exception as e:
        report.ok(False, f"{transport}: /out files as resource links: {type(e).__name__}: {e}"[:1500])
    listings = [json.dumps((await session.list_tools()).model_dump(mode="json"), sort_keys=False) for _ in range(3)]
    report.ok(len(set(listings)) == 1, f"{transport}: tools/list is the same on every call")
    try:
        extra = await session.call_tool("run_code", {"language": "python", "code": "1", "network": "on"},
                                        read_timeout_seconds=TIMEOUT)
        report.ok(is_error(extra) is True, f"{transport}: unknown arguments are refused")
    except Exception as e:  # a protocol-level refusal is a refusal too
        report.ok(True, f"{transport}: unknown arguments are refused ({type(e).__name__})")

    for name, arguments in CASES.items():
        try:
            result, obs = await s.call(dict(arguments))
        except Exception as e:
            report.case(f"{name} ({transport})", e)
            continue
        report.case(f"{name} ({transport})", obs)
        report.ok(is_error(result) is (obs.get("ok") is not True),
                  f"{transport}: {name}: isError is the opposite of ok ({is_error(result)})")


def http_contract(url, token, report):
    """The HTTP API's side: 401 bodies, code alone, nulls, ceilings, return_files."""
    base = url.rsplit("/mcp", 1)[0]
    for path, body in (("/mcp", {}), ("/v1/runs", {"code": "1"})):
        status, answer = http_json("POST", base + path, "alk_wrong", body)
        kind = (answer.get("error") or {}).get("kind") if isinstance(answer, dict) else None
        report.ok(status == 401, f"http: a wrong token on {path} is 401 ({status})")
        report.ok(kind == "unauthorized", f"http: a 401 from {path} has kind unauthorized ({kind!r}: {str(answer)[:200]})")
    status, obs = http_json("POST", base + "/v1/runs", token, {"code": "print(1)"})
    report.ok(status == 200 and isinstance(obs, dict) and obs.get("ok") is True and obs.get("stdout") == "1\n",
              f'http: POST /v1/runs {{"code":"print(1)"}} runs as Python ({status}: {str(obs)[:300]})')
    status, doc = http_json("GET", base + "/v1/openapi.json", None, None)
    props = sorted(run_request_properties(doc)) if status == 200 else []
    report.ok("code" in props, f"http: the OpenAPI RunRequest lists its properties ({props})")
    nulls = {name: None for name in props if name != "code"}
    nulls["code"] = "print('nulls')"
    status, obs = http_json("POST", base + "/v1/runs", token, nulls)
    report.ok(status == 200 and isinstance(obs, dict) and obs.get("stdout") == "nulls\n",
              f"http: every optional field null is taken as absent ({status}: {str(obs)[:300]})")
    status, obs = http_json("POST", base + "/v1/runs", token, {"language": "python", "code": "1", "timeout_s": 1e9})
    kind = (obs.get("error") or {}).get("kind") if isinstance(obs, dict) else None
    report.ok(status == 403 and kind == "policy_denied", f"http: timeout_s 1e9 is 403 policy_denied ({status} {kind})")
    for name, arguments in CASES.items():
        status, obs = http_json("POST", base + "/v1/runs", token, dict(arguments), timeout=TIMEOUT)
        report.case(f"{name} (POST /v1/runs)", obs if isinstance(obs, dict) else AssertionError(f"{status}: {obs}"))


def run_request_properties(doc):
    """RunRequest's property names, also when the schema is a union of variants."""
    schemas = doc.get("components", {}).get("schemas", {})
    schema = schemas.get("RunRequest", {})
    names = set(schema.get("properties", {}))
    for key in ("anyOf", "oneOf", "allOf"):
        for variant in schema.get(key, []):
            if "$ref" in variant:
                variant = schemas.get(variant["$ref"].rsplit("/", 1)[-1], {})
            names |= set(variant.get("properties", {}))
    return names


# ---------------------------------------------------------------------------------------
# Cancellation


def marker_code(marker):
    """A job that runs 60 s (past the policy's wall time) as a process whose argv holds
    `marker`."""
    return ("import os, sys\n"
            f"os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n")


def marker_pids(marker):
    needle = marker.encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    pids.append(int(entry))
        except OSError:
            pass
    return pids


def job_dir_of(pids):
    """The job directory of the processes `pids`: the one named as their cgroup (a native
    job's /work is a tmpfs mounted nowhere on the host, so the directory holds none of its
    source; docs/native.md)."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        for line in lines:
            name = line.rsplit("/", 1)[-1]
            if name and not name.startswith(".") and os.path.isdir(os.path.join(RUNTIME_DIR, name)):
                return name
    return None


def job_cgroups(pid, job):
    """The host paths of `pid`'s cgroups that are the job's own (named after it)."""
    paths = set()
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if job not in path:
            continue
        if controllers == "":
            for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
                paths.add(root + path)
        else:
            for controller in controllers.split(","):
                paths.add(f"/sys/fs/cgroup/{controller.removeprefix('name=')}{path}")
    return {p for p in paths if os.path.isdir(p)}


async def find_job(marker, timeout=15.0):
    """Waits until the marked job runs; returns (job dir name, its cgroup paths)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = marker_pids(marker)
        job = job_dir_of(pids)
        if pids and job:
            return job, set().union(*(job_cgroups(p, job) for p in pids))
        await asyncio.sleep(0.05)
    return None, set()


async def leftovers(marker, job, cgroups, within):
    """What of the job is still there after `within` seconds (empty when nothing)."""
    deadline = time.monotonic() + within
    while True:
        left = [f"process {p}" for p in marker_pids(marker)]
        if job and os.path.exists(os.path.join(RUNTIME_DIR, job)):
            left.append(f"job dir {RUNTIME_DIR}/{job}")
        left += [f"cgroup {c}" for c in sorted(cgroups) if os.path.isdir(c)]
        if not left or time.monotonic() > deadline:
            return left
        await asyncio.sleep(0.05)


class CancelChecks:
    """Starts a long job, abandons it one way, and checks the slot and the leftovers."""

    def __init__(self, session, report, transport, health_url=None):
        self.session = session
        self.report = report
        self.transport = transport
        self.health_url = health_url
        self.token = None
        self.baseline = None

    async def timed_hello(self):
        start = time.monotonic()
        result = await self.session.call_tool("run_code", {"language": "python", "code": "print('next')"}, read_timeout_seconds=TIMEOUT)
        elapsed = time.monotonic() - start
        obs = observation_from_text([c for c in result.content if getattr(c, "type", "") == "text"])
        return elapsed, obs

    async def measure_baseline(self):
        await self.timed_hello()  # warm-up
        self.baseline, obs = await self.timed_hello()
        self.report.ok(obs.get("stdout") == "next\n", f"{self.transport}: a short call runs ({self.baseline:.2f}s)")

    async def after_abandon(self, how, marker, job, cgroups):
        """The checks after the long job was abandoned: the next call gets the slot at
        once, and the job's process, directory and cgroups are gone."""
        report, where = self.report, f"{self.transport}: {how}"
        elapsed, obs = await self.timed_hello()
        report.ok(obs.get("stdout") == "next\n", f"{where}: the next call runs ({str(obs)[:200]})")
        report.ok(elapsed <= self.baseline + SLOT_FREED_WITHIN_S,
                  f"{where}: the next call got the slot within {SLOT_FREED_WITHIN_S}s "
                  f"(took {elapsed:.2f}s, a free slot takes {self.baseline:.2f}s)")
        await self.check_leftovers(where, marker, job, cgroups)

    async def check_leftovers(self, where, marker, job, cgroups, within=2.0):
        report = self.report
        report.ok(job is not None, f"{where}: the long job was seen running (job dir {job}, cgroups {sorted(cgroups)})")
        if job is not None and not cgroups:
            report.skip(f"{where}: the job had no cgroup of its own to check")
        left = await leftovers(marker, job, cgroups, within)
        report.ok(not left, f"{where}: nothing of the job remains ({left})")
        if self.health_url:
            # A job counts as in flight until its sandbox is removed, which a reply does not
            # wait for (docs/serve.md): the next call's own removal may still be under way.
            deadline = time.monotonic() + within
            while True:
                _, health = http_json("GET", self.health_url, None, None)
                idle = isinstance(health, dict) and health.get("jobs_in_flight") == 0
                if idle or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            report.ok(idle, f"{where}: /v1/health shows no job in flight within {within}s ({health})")

    async def client_timeout(self):
        """The client gives up (its read timeout); the SDK sends notifications/cancelled."""
        marker = f"airlock-cancel-timeout-{uuid.uuid4().hex}"
        found = asyncio.ensure_future(find_job(marker))
        start = time.monotonic()
        try:
            result = await self.session.call_tool("run_code", {"language": "python", "code": marker_code(marker)}, read_timeout_seconds=2.5)
            self.report.ok(False, f"{self.transport}: client timeout: the call returned instead of timing out ({result})")
            found.cancel()
            return
        except Exception as e:
            self.report.ok(time.monotonic() - start < POLICY_WALL_TIME_S,
                           f"{self.transport}: client timeout: the call timed out client-side ({type(e).__name__})")
        job, cgroups = await found
        await self.after_abandon("client timeout", marker, job, cgroups)

    async def caller_cancelled(self):
        """The caller cancels the call mid-job (the SDK sends notifications/cancelled)."""
        marker = f"airlock-cancel-task-{uuid.uuid4().hex}"
        call = asyncio.ensure_future(self.session.call_tool(
            "run_code", {"language": "python", "code": marker_code(marker)}, read_timeout_seconds=TIMEOUT))
        job, cgroups = await find_job(marker)
        call.cancel()
        try:
            await call
            self.report.ok(False, f"{self.transport}: cancelled: the call finished instead")
            return
        except asyncio.CancelledError:
            pass
        except Exception as e:
            self.report.ok(False, f"{self.transport}: cancelled: {type(e).__name__}: {e}")
            return
        await asyncio.sleep(0.1)  # the courtesy notifications/cancelled goes out
        await self.after_abandon("notifications/cancelled", marker, job, cgroups)


def http_disconnect(url, token, code):
    """Opens a streamable-HTTP MCP session by hand, posts a run_code call, and returns a
    function that drops the connection carrying the call (no notifications/cancelled)."""
    parsed = urllib.parse.urlsplit(url)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
               "Accept": "application/json, text/event-stream"}

    def post(conn, message, extra=None):
        conn.request("POST", parsed.path, body=json.dumps(message), headers={**headers, **(extra or {})})
        return conn.getresponse()

    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    answer = post(conn, {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                         "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "airlock-ci-disconnect", "version": "1"}}})
    session_id = answer.getheader("mcp-session-id")
    init = answer.read().decode()
    version = "2025-06-18"
    for line in init.splitlines():
        text = line[5:].strip() if line.startswith("data:") else line
        try:
            version = json.loads(text)["result"]["protocolVersion"]
            break
        except (ValueError, KeyError, TypeError):
            continue
    session = {"mcp-protocol-version": version}
    if session_id:
        session["mcp-session-id"] = session_id
    post(conn, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session).read()
    call = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    # Sent, and its response never read: the call is in flight until the connection drops.
    call.request("POST", parsed.path, headers={**headers, **session}, body=json.dumps(
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "run_code", "arguments": {"language": "python", "code": code}}}))

    def drop():
        call.sock.shutdown(2) if call.sock else None
        call.close()
        conn.close()
    return drop


def stdio_disconnect(airlock_bin, code):
    """Spawns `airlock mcp`, starts a run_code call over raw JSON-RPC, and returns the
    process (closing its stdin is the client going away)."""
    proc = subprocess.Popen([airlock_bin, "mcp", "--max-in-flight", "1"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=dict(os.environ))

    def send(message):
        proc.stdin.write((json.dumps(message) + "\n").encode())
        proc.stdin.flush()
    send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
          "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                     "clientInfo": {"name": "airlock-ci-disconnect", "version": "1"}}})
    proc.stdout.readline()
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": "run_code", "arguments": {"language": "python", "code": code}}})
    return proc


async def cancel_checks(session, report, transport, health_url=None):
    await session.initialize()
    checks = CancelChecks(session, report, transport, health_url)
    await checks.measure_baseline()
    await checks.client_timeout()
    await checks.caller_cancelled()
    return checks


# ---------------------------------------------------------------------------------------
# /v1/tool-schema


def tool_schema(base, token, report):
    from agents.strict_schema import ensure_strict_json_schema
    shapes = {
        "chat": lambda d: (d.get("type") == "function" and isinstance(d.get("function"), dict)
                           and d["function"].get("name") == "run_code" and d["function"].get("strict") is True,
                           d.get("function", {}).get("parameters")),
        "responses": lambda d: (d.get("type") == "function" and d.get("name") == "run_code"
                                and d.get("strict") is True and "function" not in d,
                                d.get("parameters")),
    }
    for fmt, shape in shapes.items():
        status, doc = http_json("GET", f"{base}/v1/tool-schema?format={fmt}", token, None)
        if not report.ok(status == 200 and isinstance(doc, dict), f"tool-schema {fmt}: 200 ({status}: {str(doc)[:200]})"):
            continue
        right_shape, parameters = shape(doc)
        report.ok(right_shape, f"tool-schema {fmt}: the {fmt} shape with strict: true ({json.dumps(doc)[:300]})")
        if not isinstance(parameters, dict):
            report.ok(False, f"tool-schema {fmt}: has parameters")
            continue
        problems = strict_schema_problems(parameters)
        report.ok(not problems, f"tool-schema {fmt}: parameters are strict-ready: {problems[:4]}")
        try:
            converted = ensure_strict_json_schema(copy.deepcopy(parameters))
            report.ok(converted == parameters,
                      f"tool-schema {fmt}: the Agents SDK's ensure_strict_json_schema leaves it unchanged"
                      + ("" if converted == parameters else f" (it becomes {json.dumps(converted)[:400]})"))
        except Exception as e:
            report.ok(False, f"tool-schema {fmt}: ensure_strict_json_schema raises {type(e).__name__}: {e}")


# ---------------------------------------------------------------------------------------


def http_transport(url, token):
    import mcp.client.streamable_http as http_mod
    headers = {"Authorization": f"Bearer {token}"}
    if hasattr(http_mod, "streamable_http_client"):
        return http_mod.streamable_http_client(url, http_client=http_mod.create_mcp_http_client(headers=headers))
    return http_mod.streamablehttp_client(url, headers=headers)


async def main():
    mode = sys.argv[1]
    report = Report("mcp")
    if mode == "tool-schema":
        tool_schema(sys.argv[2].rstrip("/"), sys.argv[3], report)
        report.finish()
        return
    from mcp import ClientSession
    if mode in ("stdio", "cancel-stdio"):
        from mcp.client.stdio import StdioServerParameters, stdio_client
        args = ["mcp"] if mode == "stdio" else ["mcp", "--max-in-flight", "1"]
        # The client's default environment is a minimal one; pass ours on (AIRLOCK_STATE_DIR).
        params = StdioServerParameters(command=sys.argv[2], args=args, env=dict(os.environ))
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                if mode == "stdio":
                    await exercise(session, report, "stdio")
                else:
                    checks = await cancel_checks(session, report, "stdio")
        if mode == "cancel-stdio":
            # The client goes away (stdin closed) mid-job.
            marker = f"airlock-cancel-eof-{uuid.uuid4().hex}"
            proc = stdio_disconnect(sys.argv[2], marker_code(marker))
            job, cgroups = await find_job(marker)
            proc.stdin.close()
            try:
                proc.wait(timeout=20)
                report.ok(True, f"stdio: stdin closed: airlock mcp exits ({proc.returncode})")
            except subprocess.TimeoutExpired:
                proc.kill()
                report.ok(False, "stdio: stdin closed: airlock mcp still runs 20s later")
            await checks.check_leftovers("stdio: stdin closed", marker, job, cgroups)
    elif mode in ("http", "cancel-http"):
        url, token = sys.argv[2], sys.argv[3]
        async with http_transport(url, token) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                if mode == "http":
                    await exercise(session, report, "http")
                else:
                    base = url.rsplit("/mcp", 1)[0]
                    checks = await cancel_checks(session, report, "http", base + "/v1/health")
                    # The client drops the connection carrying the call (no cancel message).
                    marker = f"airlock-cancel-drop-{uuid.uuid4().hex}"
                    drop = await asyncio.to_thread(http_disconnect, url, token, marker_code(marker))
                    job, cgroups = await find_job(marker)
                    drop()
                    await checks.after_abandon("connection closed", marker, job, cgroups)
        if mode == "http":
            http_contract(url, token, report)
    else:
        raise SystemExit(f"unknown mode {mode}")
    report.finish()


if __name__ == "__main__":
    asyncio.run(main())
