"""The unmodified E2B Python SDK (e2b, e2b-code-interpreter) against a live airlock serve:
lifecycle, streamed commands, exits, timeouts, kills, binary files, confinement, a
second tenant, what airlock refuses, and run_code on the session's kernel."""

from __future__ import annotations

import inspect
import io

import httpx
import pytest
from e2b import CommandExitException, Sandbox

from conftest import WALL_TIME_S, Server

ALL_BYTES = bytes(range(256))


@pytest.fixture
def sandbox(server: Server):
    s = Sandbox.create(timeout=120, envs={"GREETING": "hello"}, metadata={"test": "e2b"})
    yield s
    s.kill()


def test_lifecycle(server: Server) -> None:
    s = Sandbox.create(timeout=60, metadata={"who": "lifecycle"})
    assert s.is_running()
    info = s.get_info()
    assert info.sandbox_id == s.sandbox_id
    assert info.template_id == "base"
    assert info.metadata == {"who": "lifecycle"}
    listed = [x.sandbox_id for x in Sandbox.list().next_items()]
    assert s.sandbox_id in listed
    s.set_timeout(90)
    assert s.get_info().end_at > info.end_at
    again = Sandbox.connect(s.sandbox_id)
    assert again.commands.run("echo connected").stdout == "connected\n"
    s.kill()
    assert not s.is_running()
    assert Sandbox.kill(s.sandbox_id) is False
    assert s.sandbox_id not in [x.sandbox_id for x in Sandbox.list().next_items()]


def test_unknown_template_is_refused_naming_the_known_ones(server: Server) -> None:
    with pytest.raises(Exception) as refused:
        Sandbox.create(template="no-such-template")
    assert "base, code-interpreter-v1" in str(refused.value)


def test_commands_stream_while_they_run(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run(
        "echo $GREETING; echo to-stderr >&2; read -t 30 < /dev/null; sleep 2; echo last",
        background=True,
    )
    seen_running = []
    chunks = []
    for stdout, stderr, _ in handle:
        chunks.append((stdout, stderr))
        if stdout == "hello\n":
            # The first line arrived while the command still runs: it was streamed.
            seen_running.append(any(p.pid == handle.pid for p in sandbox.commands.list()))
    assert seen_running == [True]
    assert ("last\n", None) in chunks
    assert (None, "to-stderr\n") in chunks
    result = handle.wait()
    assert result.exit_code == 0
    assert result.stdout == "hello\nlast\n"


def test_callbacks_and_env_and_cwd(sandbox: Sandbox) -> None:
    out: list[str] = []
    err: list[str] = []
    sandbox.files.make_dir("sub")
    result = sandbox.commands.run(
        "echo $GREETING $FOO; pwd; echo e >&2",
        envs={"FOO": "bar"},
        cwd="/home/user/sub",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert result.stdout == "hello bar\n/work/sub\n"
    assert "".join(out) == result.stdout
    assert "".join(err) == "e\n"


def test_tmp_persists_between_the_commands_of_one_sandbox_only(server: Server, sandbox: Sandbox) -> None:
    """As on E2B, what a command leaves in /tmp the next command of the same sandbox sees
    (an installed helper runs: the OpenAI Agents SDK's client relies on it); /tmp is the
    sandbox's own, bounded by the policy's [limits] tmp, and names no host path."""
    sandbox.commands.run("mkdir -p /tmp/tools && echo kept > /tmp/state.txt")
    sandbox.commands.run("printf '#!/bin/sh\\necho helper ran with $1\\n' > /tmp/tools/helper && chmod 0555 /tmp/tools/helper")
    assert sandbox.commands.run("cat /tmp/state.txt").stdout == "kept\n"
    assert sandbox.commands.run("/tmp/tools/helper x").stdout == "helper ran with x\n"
    # Bounded: the policy's /tmp size (16 MiB by default), not the host's disk.
    with pytest.raises(CommandExitException) as full:
        sandbox.commands.run("head -c 40000000 /dev/zero > /tmp/big")
    assert "No space left" in full.value.stderr, full.value.stderr
    sandbox.commands.run("rm -f /tmp/big")
    # The mount shows no host path (the session's directory is bound whole at /tmp).
    mounts = sandbox.commands.run("cat /proc/self/mountinfo").stdout
    tmp_lines = [line for line in mounts.splitlines() if line.split()[4] == "/tmp"]
    assert len(tmp_lines) == 1 and tmp_lines[0].split()[3] == "/", tmp_lines
    assert "airlock-sessions" not in mounts, mounts
    # Another sandbox has its own /tmp.
    other = Sandbox.create(timeout=60)
    try:
        seen = other.commands.run("ls -A /tmp; test ! -e /tmp/state.txt && test ! -e /tmp/tools && echo fresh")
        assert seen.stdout.endswith("fresh\n"), seen.stdout
    finally:
        other.kill()


def test_a_non_zero_exit_raises(sandbox: Sandbox) -> None:
    with pytest.raises(CommandExitException) as raised:
        sandbox.commands.run("echo out; echo oops >&2; exit 3")
    assert raised.value.exit_code == 3
    assert raised.value.stderr == "oops\n"


def test_timeouts(sandbox: Sandbox) -> None:
    from e2b import TimeoutException

    # The client's deadline.
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 60", timeout=1)
    # The policy's wall time: the command is killed and says so.
    with pytest.raises(CommandExitException) as raised:
        sandbox.commands.run("sleep 60", timeout=WALL_TIME_S * 10)
    assert "wall time" in (raised.value.error or "")
    # The sandbox is still usable.
    assert sandbox.commands.run("echo alive").stdout == "alive\n"


def test_kill_a_background_command(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 60", background=True)
    assert any(p.pid == handle.pid for p in sandbox.commands.list())
    assert handle.kill() is True
    with pytest.raises(CommandExitException):
        handle.wait()
    assert sandbox.commands.kill(handle.pid) is False


def test_every_byte_value_round_trips(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/all.bin", ALL_BYTES)
    assert sandbox.files.read("/home/user/all.bin", format="bytes") == bytes(ALL_BYTES)
    # Octet-stream and gzip uploads (envd 0.5.7), where this SDK version has them.
    params = inspect.signature(sandbox.files.write).parameters
    if "use_octet_stream" in params:
        sandbox.files.write("octet.bin", ALL_BYTES, use_octet_stream=True)
    else:
        sandbox.files.write("octet.bin", io.BytesIO(ALL_BYTES))
    assert sandbox.files.read("octet.bin", format="bytes") == ALL_BYTES
    if "gzip" in params:
        sandbox.files.write("gz.bin", ALL_BYTES * 100, gzip=True)
        assert sandbox.files.read("gz.bin", format="bytes") == ALL_BYTES * 100
    # The command sees the same bytes the SDK wrote.
    digest = sandbox.commands.run("sha256sum all.bin octet.bin | cut -c1-64 | uniq").stdout
    import hashlib

    assert digest == hashlib.sha256(ALL_BYTES).hexdigest() + "\n"
    # And the SDK reads back what a command wrote.
    sandbox.commands.run("printf '\\x00\\xff\\x80' > made.bin")
    assert sandbox.files.read("made.bin", format="bytes") == b"\x00\xff\x80"


def test_a_secret_in_a_file_is_redacted_as_out_files_are(sandbox: Sandbox) -> None:
    # Assembled by the command, so no key crosses the wire on the way in.
    sandbox.commands.run(
        "k=AKIA; k=${k}QYLPMN5HHHFPZAM2; printf 'aws_key=%s\\n' $k > creds.txt; "
        "printf '\\x00\\xff%s\\x00' $k > blob.bin"
    )
    assert sandbox.files.read("creds.txt") == "aws_key=[REDACTED:aws-access-key-id]\n"
    # A binary cannot be rewritten: withheld.
    with pytest.raises(Exception) as withheld:
        sandbox.files.read("blob.bin", format="bytes")
    assert "withheld" in str(withheld.value)
    # A file named after a key is listed under its redacted name; airlock's own
    # reserved names are not listed at all.
    sandbox.commands.run("k=AKIA; k=${k}QYLPMN5HHHFPZAM2; mkdir -p named; touch named/$k.txt")
    names = {e.name for e in sandbox.files.list("/home/user/named")}
    assert names == {"[REDACTED:aws-access-key-id].txt"}, names
    listed = {e.name for e in sandbox.files.list("/home/user")}
    assert not any(n.startswith(".airlock") for n in listed), listed


def test_files_calls(sandbox: Sandbox) -> None:
    sandbox.files.write("a/b.txt", "text")
    assert sandbox.files.read("a/b.txt") == "text"
    assert sandbox.files.exists("a/b.txt")
    assert not sandbox.files.exists("a/none")
    names = {e.name for e in sandbox.files.list("/home/user/a")}
    assert names == {"b.txt"}
    assert sandbox.files.make_dir("c") is True
    assert sandbox.files.make_dir("c") is False
    moved = sandbox.files.rename("a/b.txt", "c/d.txt")
    assert moved.path == "/home/user/c/d.txt"
    assert sandbox.files.get_info("c/d.txt").size == 4
    sandbox.files.remove("c")
    assert not sandbox.files.exists("c/d.txt")


def test_files_stay_in_the_workspace(sandbox: Sandbox) -> None:
    for bad in ["/etc/passwd", "../x", "/home/user/../../etc/passwd", "/tmp/x"]:
        with pytest.raises(Exception):
            sandbox.files.write(bad, "x")
        with pytest.raises(Exception):
            sandbox.files.read(bad)
    # Links a command made that point out are not followed.
    sandbox.commands.run("ln -s /etc/passwd pw; ln -s /etc etc")
    with pytest.raises(Exception):
        sandbox.files.read("pw")
    with pytest.raises(Exception):
        sandbox.files.read("etc/passwd")
    with pytest.raises(Exception):
        sandbox.files.write("etc/x", "x")
    info = sandbox.files.get_info("pw")
    assert info.symlink_target == "/etc/passwd"


def test_a_second_tenant_gets_nothing(server: Server, sandbox: Sandbox) -> None:
    from e2b import NotFoundException, SandboxException

    with pytest.raises((NotFoundException, SandboxException)):
        Sandbox.connect(sandbox.sandbox_id, api_key=server.key_b)
    assert sandbox.sandbox_id not in [
        x.sandbox_id for x in Sandbox.list(api_key=server.key_b).next_items()
    ]
    assert Sandbox.kill(sandbox.sandbox_id, api_key=server.key_b) is False
    # Without the sandbox's own access token, its envd answers nothing.
    for token in [None, "0" * 64]:
        headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983"}
        if token:
            headers["X-Access-Token"] = token
        r = httpx.get(f"{server.url}/files", params={"path": "all.bin"}, headers=headers)
        assert r.status_code == 401
        assert set(r.json()) == {"code", "message"}
    # A bad key on the control plane is E2B's 401.
    r = httpx.get(f"{server.url}/v2/sandboxes", headers={"X-API-Key": "e2b_" + "0" * 64})
    assert r.status_code == 401
    assert sandbox.is_running()


def test_what_airlock_does_not_do_is_refused_clearly(server: Server, sandbox: Sandbox) -> None:
    with pytest.raises(Exception) as refused:
        sandbox.commands.run("cat", stdin=True, background=True).wait()
    assert "not supported by airlock" in str(refused.value)
    if hasattr(sandbox, "pause"):
        with pytest.raises(Exception) as refused:
            sandbox.pause()
        assert "not supported by airlock" in str(refused.value)
    for path in ["pause", "resume", "snapshots"]:
        r = httpx.post(
            f"{server.url}/sandboxes/{sandbox.sandbox_id}/{path}",
            headers={"X-API-Key": server.key_a},
            json={},
        )
        assert r.status_code == 501
        assert r.json()["message"].startswith("not supported by airlock: ")
    with pytest.raises(Exception) as refused:
        sandbox.files.watch_dir("/home/user")
    assert "not supported by airlock" in str(refused.value) or "watch" in str(refused.value)


def test_host_routing(server: Server, sandbox: Sandbox) -> None:
    host = server.url.removeprefix("http://")
    r = httpx.get(
        f"{server.url}/health",
        headers={"Host": f"49983-{sandbox.sandbox_id}.sandbox.test", "X-Access-Token": sandbox._envd_access_token},
    )
    assert r.status_code == 204, r.text
    r = httpx.get(
        f"{server.url}/health",
        headers={"Host": f"49983-{sandbox.sandbox_id}.sandbox.test", "X-Access-Token": "f" * 64},
    )
    assert r.status_code == 401
    assert host


def test_run_code_on_the_kernel(server: Server) -> None:
    from e2b_code_interpreter import Sandbox as CodeSandbox

    s = CodeSandbox.create(timeout=120)
    try:
        assert s.get_info().template_id == "code-interpreter-v1"
        assert s.run_code("1+1").text == "2"
        s.run_code("x = 41")
        assert s.run_code("x + 1").text == "42"
        printed: list[str] = []
        execution = s.run_code("print('hi')", on_stdout=lambda m: printed.append(m.line))
        assert execution.logs.stdout == ["hi\n"]
        assert printed == ["hi\n"]
        failed = s.run_code("1/0")
        assert failed.error is not None and failed.error.name == "ZeroDivisionError"
        # Commands and the kernel share one workspace.
        s.commands.run("echo shared > f.txt")
        assert s.run_code("open('f.txt').read()").text == "'shared\\n'"
        with pytest.raises(Exception) as refused:
            s.run_code("1", language="r")
        assert "python only" in str(refused.value)
        # A loop past the client's timeout: the SDK's timeout error; the policy's wall
        # time interrupts it in the kernel, and the sandbox answers the next call.
        from e2b import TimeoutException

        with pytest.raises(TimeoutException):
            s.run_code("while True: pass", timeout=2)
        assert s.run_code("x").text == "41"
        assert s.commands.run("echo usable").stdout == "usable\n"
    finally:
        s.kill()


def test_run_code_returns_charts_and_tables(server: Server) -> None:
    """Open matplotlib figures come back as PNG results, a DataFrame as the main result's
    text and HTML (needs matplotlib and pandas in the sandbox: AIRLOCK_TEST_PYLIB, or the
    code-interpreter-v1 image)."""
    import os

    from conftest import code_interpreter_image

    if not os.environ.get("AIRLOCK_TEST_PYLIB") and not code_interpreter_image()[0]:
        message = "AIRLOCK_TEST_PYLIB (scripts/ci/pylib.sh) is not set: no matplotlib in the sandbox"
        if os.environ.get("AIRLOCK_REQUIRE_ALL") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from e2b_code_interpreter import Sandbox as CodeSandbox

    s = CodeSandbox.create(timeout=120)
    try:
        chart = s.run_code(
            "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n"
            "plt.plot([1, 2, 3], [3, 1, 2])\nNone"
        )
        assert chart.error is None, chart.error
        pngs = [r.png for r in chart.results if r.png]
        assert len(pngs) == 1
        import base64

        assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")
        table = s.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
        assert table.error is None, table.error
        assert "<table" in (table.results[-1].html or "")
        assert table.text is not None and "a" in table.text
    finally:
        s.kill()


def test_code_contexts_display_and_tracebacks(server: Server) -> None:
    """Contexts have their own globals and cwd; display() outputs come back as results
    beside the main one; an error carries its traceback; output streams to the callback."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    s = CodeSandbox.create(timeout=120)
    try:
        s.run_code("x = 'default'")
        s.files.make_dir("/home/user/sub")
        ctx = s.create_code_context(cwd="/home/user/sub", language="python")
        assert ctx.cwd == "/home/user/sub", ctx
        assert s.run_code("import os; os.getcwd()", context=ctx).text == "'/work/sub'"
        missing = s.run_code("x", context=ctx)
        assert missing.error is not None and missing.error.name == "NameError"
        assert "NameError" in missing.error.traceback, missing.error
        assert s.run_code("x").text == "'default'"
        if hasattr(s, "list_code_contexts"):
            ids = {c.id for c in s.list_code_contexts()}
            assert {"default", ctx.id} <= ids, ids
        if hasattr(s, "restart_code_context"):
            s.run_code("y = 1", context=ctx)
            s.restart_code_context(ctx)
            assert s.run_code("y", context=ctx).error is not None
        if hasattr(s, "remove_code_context"):
            s.remove_code_context(ctx)
            with pytest.raises(Exception):
                s.run_code("1", context=ctx)
        shown = s.run_code(
            "class Shown:\n"
            "    def _repr_html_(self): return '<b>shown</b>'\n"
            "    def __repr__(self): return 'Shown()'\n"
            "display(Shown())\n"
            "print('after display')\n"
            "21 * 2"
        )
        assert shown.error is None, shown.error
        assert any(r.html == "<b>shown</b>" and not r.is_main_result for r in shown.results), shown.results
        assert shown.text == "42"
        printed: list[str] = []
        s.run_code("for i in range(3): print(i)", on_stdout=lambda m: printed.append(m.line))
        assert "".join(printed) == "0\n1\n2\n", printed
    finally:
        s.kill()


def test_display_results_arrive_as_the_cell_makes_them(server: Server) -> None:
    """A display() before a sleep reaches on_result before the cell's later output (the
    order of events: E2B's /execute streams results as they happen); the main result
    comes at the end, and kernel and commands share the sandbox's /tmp."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    s = CodeSandbox.create(timeout=120)
    try:
        events: list[str] = []
        execution = s.run_code(
            "import time\n"
            "class Early:\n"
            "    def _repr_html_(self): return '<i>early</i>'\n"
            "display(Early())\n"
            "time.sleep(1.5)\n"
            "print('after the sleep')\n"
            "'the end'",
            on_result=lambda r: events.append("result:" + (r.html or r.text or "")),
            on_stdout=lambda m: events.append("stdout:" + m.line),
        )
        assert execution.error is None, execution.error
        assert events == [
            "result:<i>early</i>",
            "stdout:after the sleep\n",
            "result:'the end'",
        ], events
        # Each result once, in the execution too.
        assert [r.is_main_result for r in execution.results] == [False, True], execution.results
        s.commands.run("echo from-a-command > /tmp/shared.txt")
        assert s.run_code("open('/tmp/shared.txt').read()").text == "'from-a-command\\n'"
    finally:
        s.kill()
