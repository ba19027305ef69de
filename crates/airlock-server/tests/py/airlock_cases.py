"""The run_code calls every framework check makes, and what each observation must show.

Each framework sends the arguments its own way (CrewAI fills optional ones with null,
strict-mode models send every property); what comes back must be the same observation.
Imported by the per-framework checks; needs only the standard library.
"""
import base64
import hashlib
import json
import os
import urllib.error
import urllib.request

# The built-in policy's limits these cases lean on (policy/default.toml).
POLICY_WALL_TIME_S = 5
STDOUT_CAP_BYTES = 8000
# Longer than the policy's wall time plus sandbox setup and teardown: a job that runs to
# its limit must reach the caller as a timeout observation, not as a client-side timeout.
CLIENT_TIMEOUT_S = 60

# Built at run time so this file itself holds no AWS-shaped key.
FAKE_AWS_KEY = "AKIA" + "Q3EGRTZ7PLMXKW2V"
# Every byte value, so an encoding that mangles any of them shows.
OUT_FILE_BYTES = bytes(range(256)) * 8 + b"\x00end\xff"

CASES = {
    "hello": {"code": "print('hello from airlock')"},
    # No timeout_s: the job runs into the policy's own wall time, the case a client timeout
    # equal to that wall time gets wrong.
    "timeout": {"code": "import time\ntime.sleep(60)"},
    "flood": {"code": "import sys\nsys.stdout.write('x' * 500000)"},
    "secret": {"code": f"print('key=' + {FAKE_AWS_KEY[:4]!r} + {FAKE_AWS_KEY[4:]!r})"},
    "out_file": {
        "code": (
            "import base64\n"
            f"data = base64.b64decode({base64.b64encode(OUT_FILE_BYTES).decode()!r})\n"
            "open('/out/blob.bin', 'wb').write(data)\n"
            "print('wrote', len(data))"
        ),
        "return_files": True,
    },
}


class CaseFailure(AssertionError):
    pass


def _expect(condition, what, obs):
    if not condition:
        raise CaseFailure(f"{what}; observation: {json.dumps(obs)[:1500]}")


def expected_tools(transport):
    """The tools airlock's MCP server lists on the built-in policy (sessions on), in order.

    `airlock mcp` (stdio) is one client's process, with no sessions to keep between calls:
    it lists run_code alone. `airlock serve`'s /mcp keeps sessions, so it lists the session
    tools after run_code."""
    if transport == "stdio":
        return ["run_code"]
    return ["run_code", "session_start", "session_end"]


def check_case(name, obs):
    """Raises CaseFailure unless `obs` (the observation dict) is what case `name` must give.

    `name` may carry a suffix after a space ("hello (create_react_agent)")."""
    name = name.split(" ")[0]
    _expect(isinstance(obs, dict) and "outcome" in obs, "an observation object", obs)
    if name == "hello":
        _expect(obs["ok"] is True and obs["outcome"] == "exited", "hello exits 0", obs)
        _expect(obs["stdout"] == "hello from airlock\n", "hello's stdout", obs)
    elif name == "timeout":
        _expect(obs["ok"] is False and obs["outcome"] == "timeout", "outcome timeout", obs)
    elif name == "flood":
        _expect(obs["stdout_truncated"] is True, "stdout_truncated", obs)
        _expect(len(obs["stdout"].encode()) <= STDOUT_CAP_BYTES, "stdout within the cap", obs)
        _expect(obs["stdout_bytes"] == 500000, "stdout_bytes counts every byte", obs)
    elif name == "secret":
        _expect(FAKE_AWS_KEY not in obs["stdout"], "the key is redacted", obs)
        _expect(obs["redactions"] >= 1 and "REDACTED" in obs["stdout"], "a redaction is counted and marked", obs)
    elif name == "out_file":
        _expect(obs["ok"] is True, "the /out job exits 0", obs)
        files = [f for f in obs.get("files", []) if f["path"].endswith("blob.bin")]
        _expect(len(files) == 1, "blob.bin is listed in files", obs)
        entry = files[0]
        _expect(entry.get("content_base64") is not None, "blob.bin has content_base64", obs)
        data = base64.b64decode(entry["content_base64"])
        _expect(data == OUT_FILE_BYTES, "blob.bin's bytes round-trip", obs)
        _expect(entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest(),
                "blob.bin's size and sha256", obs)
    else:
        raise KeyError(name)


def observation_from_text(text):
    """The observation from a tool result's text, which is the observation's JSON."""
    if isinstance(text, (list, tuple)):
        # Content blocks as some frameworks hand them over: [{"type":"text","text":...}].
        text = "".join(b.get("text", "") if isinstance(b, dict) else getattr(b, "text", str(b)) for b in text)
    return json.loads(text)


# The exit status of a check that passed except for skipped checks (scripts/ci/server.sh
# reports it as skipped, not passed).
SKIPPED = 3


def http_json(method, url, token, body, timeout=30):
    """(status, decoded JSON body or the raw text) of one request; never raises on a status."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


class Report:
    """Collects pass/fail per check so one run shows every failure, not only the first.

    A skipped check is never a pass: it is listed at the end, and with
    AIRLOCK_REQUIRE_ALL=1 it fails the run."""

    def __init__(self, label):
        self.label = label
        self.failures = []
        self.skips = []

    def ok(self, condition, what):
        if condition:
            print(f"ok: {self.label}: {what}", flush=True)
        else:
            print(f"FAIL: {self.label}: {what}", flush=True)
            self.failures.append(what)
        return condition

    def case(self, name, obs_or_exc):
        if isinstance(obs_or_exc, BaseException):
            return self.ok(False, f"{name}: {type(obs_or_exc).__name__}: {obs_or_exc}"[:2000])
        try:
            check_case(name, obs_or_exc)
        except CaseFailure as e:
            return self.ok(False, f"{name}: {e}")
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # a field missing or of the wrong type
            return self.ok(False, f"{name}: {type(e).__name__} {e}; observation: {json.dumps(obs_or_exc)[:1500]}")
        return self.ok(True, name)

    def skip(self, what):
        print(f"SKIP: {self.label}: {what}", flush=True)
        self.skips.append(what)

    def finish(self):
        require_all = os.environ.get("AIRLOCK_REQUIRE_ALL") == "1"
        if require_all:
            for what in self.skips:
                print(f"FAIL: {self.label}: skipped with AIRLOCK_REQUIRE_ALL=1: {what}", flush=True)
        failed = len(self.failures) + (len(self.skips) if require_all else 0)
        if failed:
            raise SystemExit(f"FAIL: {self.label}: {failed} check(s) failed")
        if self.skips:
            # Not a pass: exit status SKIPPED tells scripts/ci/server.sh so.
            print(f"SKIPPED: {self.label}: {len(self.skips)} check(s) skipped, the rest passed", flush=True)
            raise SystemExit(SKIPPED)
        print(f"PASS: {self.label}", flush=True)
