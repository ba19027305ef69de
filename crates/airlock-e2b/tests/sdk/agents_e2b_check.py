"""The OpenAI Agents SDK's E2B sandbox client (agents.extensions.sandbox.e2b, openai-agents
pinned in requirements-agents.txt), unmodified, against a live `airlock serve` on the
built-in policy: the client creates the sandbox through E2B's SDK, prepares its workspace
(a command with cwd "/", `mkdir -p` of the manifest's root), runs commands whose files
persist, reads and writes files through the session's read()/write() (whose path helper an
earlier command installed under /tmp), and kills the sandbox at shutdown. Driven through the client's own session
API: no model is reachable, and a SandboxAgent's tools call exactly these methods.

Usage: agents_e2b_check.py AIRLOCK_BIN. Exits non-zero on the first failed check."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def start(binary: str, root: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    tokens = root / "tokens.toml"
    key = subprocess.run(
        [binary, "token", "new", "--tenant", "agents", "--e2b", "--tokens-file", str(tokens)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    log = open(root / "serve.log", "w+b")
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--tokens", str(tokens)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "AIRLOCK_STATE_DIR": str(root / "state")},
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
    sys.exit("airlock serve did not start:\n" + log.read().decode(errors="replace"))


def check(condition: bool, what: str) -> None:
    print(("ok   " if condition else "FAIL ") + what, flush=True)
    if not condition:
        raise SystemExit(1)


async def exercise() -> None:
    from agents.extensions.sandbox.e2b import E2BSandboxClient, E2BSandboxClientOptions
    from agents.sandbox.manifest import Manifest
    from e2b import Sandbox

    client = E2BSandboxClient()
    options = E2BSandboxClientOptions(
        sandbox_type="e2b",
        template="base",
        timeout=120,
        metadata={"from": "openai-agents"},
        # airlock has no pause: a sandbox ends at its timeout (E2B's "kill").
        on_timeout="kill",
        auto_resume=False,
    )
    # The manifest's root is the sandbox's workspace (airlock's /work, E2B's home).
    session = await client.create(manifest=Manifest(root="/work"), options=options)
    sandbox_id = session.state.sandbox_id
    listed = [s.sandbox_id for s in Sandbox.list().next_items()]
    check(sandbox_id in listed, f"the client's create made E2B sandbox {sandbox_id}")
    async with session:
        result = await session.exec("echo hello from $(pwd)")
        check(
            result.exit_code == 0 and result.stdout == b"hello from /work\n",
            f"exec runs in the workspace root ({result.stdout!r}, {result.stderr!r})",
        )
        failed = await session.exec("exit 3")
        check(
            failed.exit_code == 3,
            f"a non-zero exit comes back as the exit code ({failed.exit_code})",
        )
        # Files a command writes persist for the next (the workspace is the session's).
        wrote = await session.exec("mkdir -p data && printf persisted > data/note.txt")
        check(wrote.exit_code == 0, f"a command writes into the workspace ({wrote.stderr!r})")
        again = await session.exec("cat data/note.txt")
        check(again.stdout == b"persisted", f"files persist across commands ({again.stdout!r})")
        # The session's own read() and write(): each first runs the path-resolving helper
        # the client installed under /tmp/openai-agents/bin with an earlier command (the
        # sandbox's /tmp persists between its commands, as on E2B), then E2B's files API.
        read = await session.read(Path("data/note.txt"))
        content = read.read()
        check(content == b"persisted", f"read() returns a file a command wrote ({content!r})")
        every_byte = bytes(range(256))
        await session.write(Path("data/all.bin"), io.BytesIO(every_byte))
        counted = await session.exec("wc -c < data/all.bin")
        check(counted.stdout.strip() == b"256", f"write() lands in the workspace ({counted.stdout!r})")
        back = (await session.read(Path("data/all.bin"))).read()
        check(back == every_byte, "every byte value round-trips through write() and read()")
        helper = await session.exec("ls /tmp/openai-agents/bin")
        check(
            helper.exit_code == 0 and helper.stdout.startswith(b"resolve-workspace-path-"),
            f"the client's helper stays installed in the sandbox's /tmp ({helper.stdout!r})",
        )
    listed = [s.sandbox_id for s in Sandbox.list().next_items()]
    check(sandbox_id not in listed, "shutdown killed the sandbox")


def main() -> None:
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="airlock-agents-e2b-") as tmp:
        proc, url, key = start(binary, Path(tmp))
        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=key)
        try:
            asyncio.run(exercise())
        except BaseException:
            log = (Path(tmp) / "serve.log").read_text(errors="replace")
            print("airlock serve log (tail):\n" + log[-3000:], file=sys.stderr)
            raise
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
