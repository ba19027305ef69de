#!/usr/bin/env python3
"""Runs or checks every fenced code block of README.md and docs/*.md (scripts/ci/docs.sh
prepares the environment and starts this in a network namespace of its own).

What each block gets, by its language tag:

- `sh`, `bash`: run with `bash -e -o pipefail` in a fresh scratch directory holding
  `target/debug/airlock` and `target/release/airlock` (this clone's build), with that
  binary first on PATH, python/ci.sh's venv next (its `python3` has the wheel and the
  frameworks), AIRLOCK_TOKEN set for the server below, AIRLOCK_STATE_DIR in the scratch.
- `python`: run in the same kind of directory by the venv its imports need: server.sh's
  "agents" venv for the MCP adapters (`langchain_mcp_adapters`, `crewai_tools`),
  python/ci.sh's for `airlock` and the frameworks, else the system `python3`.
- `json`: parsed; an observation (it has `job_id` and `outcome`) is validated against the
  `run_code` tool's outputSchema; an `mcpServers` file is used: the official `mcp` client
  starts (stdio) or reaches (HTTP, `alk_...` standing for the server's token) each server
  and lists its tools, which must include `run_code`.
- `toml`: parsed, then loaded by `airlock policy check` as a policy (a fragment is given
  `version = "doc-test"` when it has none; `sha256:…` stands for any digest).
- anything else (`text`, no tag): must carry a marker saying how it is checked.

Markers, HTML comments on the lines just before a block (several may stack):

- `<!-- doc-test: skip (REASON) -->`: not run, listed as skipped with REASON. Under
  AIRLOCK_REQUIRE_ALL=1 a skip without a reason fails.
- `<!-- doc-test: prepared "TEXT" (REASON) -->`: TEXT (`\"`, `\\`, `\n` escaped), a setup
  step scripts/test.sh has already done (a build, an install), must occur in the block and
  is left out of the run.
- `<!-- doc-test: expect "TEXT" -->`: the run's stdout must contain TEXT.
- `<!-- doc-test: serves -->`: the block starts a server that runs until stopped: it is
  run in a network namespace of its own, must answer `GET /v1/health` on 127.0.0.1:8700,
  and is then stopped.
- `<!-- doc-test: post /v1/runs -->`: a JSON request body, sent to the server; the answer
  must be 200 with `"ok": true`.
- `<!-- doc-test: sse -->`: a server-sent event stream of `POST /v1/runs?stream=true`: a job
  writing the block's `stdout` and `stderr` texts is streamed, and the stream must carry
  those texts on those events, then an `observation` event with the block's fields.
- `<!-- doc-test: syntax (REASON) -->`: JSON or TOML that is not a policy or cannot be
  used here (a host's paths, placeholders): parsed only.
- `<!-- doc-test: cli-usage -->`: a synopsis of the CLI: every subcommand it names exists,
  every `--flag` it shows is in that subcommand's `--help`, and every command of
  `airlock --help` is in it.
- `<!-- doc-test: layout -->`: a tree listing: each line's first word is a path of the
  repository; every crate under crates/ and every docs/*.md is listed.
- `<!-- doc-test: crates -->`: a crate graph: every `airlock-*` name is a crate under
  crates/, and every crate is named.

Every relative link outside code blocks must lead to a file of the clone, and an anchor to
one of its headings.

Also at hand: `airlock serve` on 127.0.0.1:8700 with a tokens file (its token in
AIRLOCK_TOKEN), sessions enabled (kernel mode, matplotlib and pandas from
AIRLOCK_TEST_PYLIB), a 1 GiB memory and 60 s wall-time ceiling.

Prints PASS, FAIL (with the file and line of the block, and why) or SKIP per block, and
closes with "N passed, N failed, N skipped".
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

PORT = 8700
BLOCK_TIMEOUT_S = 300
SERVER_START_TIMEOUT_S = 60
ZERO_DIGEST = "sha256:" + "0" * 64

MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([A-Za-z0-9_+-]*)")
AGENTS_MODULES = {"langchain_mcp_adapters", "crewai_tools"}
PYTHON_CI_MODULES = {"airlock", "langgraph", "langchain_core", "agents", "crewai", "mcp"}


@dataclass
class Directive:
    name: str
    args: list[str]
    reason: str | None


@dataclass
class Block:
    file: str
    line: int
    lang: str
    text: str
    directives: list[Directive] = field(default_factory=list)

    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def directive(self, name: str) -> Directive | None:
        return next((d for d in self.directives if d.name == name), None)


class Skip(Exception):
    """The block was not checked: a marker says so, or a prerequisite is missing."""

    def __init__(self, reason: str, prerequisite: bool = False) -> None:
        super().__init__(reason)
        self.prerequisite = prerequisite


class Failed(Exception):
    """The block breaks: the message says how."""


def parse_directive(text: str) -> Directive:
    # Quoted arguments first (`\"`, `\\` and `\n` are their escapes), then a reason in
    # parentheses at the end of what is left.
    quoted = r'"((?:[^"\\]|\\.)*)"'
    args = [
        re.sub(r'\\(["\\n])', lambda m: "\n" if m.group(1) == "n" else m.group(1), a)
        for a in re.findall(quoted, text)
    ]
    text = re.sub(quoted, "", text)
    reason = None
    match = re.search(r"\((.*)\)\s*$", text)
    if match:
        reason = match.group(1).strip() or None
        text = text[: match.start()]
    words = text.split()
    if not words:
        raise ValueError("an empty doc-test marker")
    return Directive(words[0], args + words[1:], reason)


def parse_markdown(path: Path, name: str) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a markdown file, each with the markers just before it, and the
    problems found (a marker without a block, an unclosed fence)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    pending: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = MARKER.match(line)
        if marker:
            pending.append((i + 1, marker.group(1)))
            i += 1
            continue
        fence = FENCE.match(line)
        if fence:
            indent, ticks, lang = fence.group(1), fence.group(2), fence.group(3)
            body: list[str] = []
            j = i + 1
            while j < len(lines) and not re.match(
                rf"^\s*{re.escape(ticks[0])}{{{len(ticks)},}}\s*$", lines[j]
            ):
                body.append(
                    lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j].lstrip()
                )
                j += 1
            if j == len(lines):
                problems.append(f"{name}:{i + 1}: a code block that is never closed")
            block = Block(name, i + 1, lang.lower(), "\n".join(body) + "\n")
            for at, text in pending:
                try:
                    block.directives.append(parse_directive(text))
                except ValueError as e:
                    problems.append(f"{name}:{at}: {e}")
            pending = []
            blocks.append(block)
            i = j + 1
            continue
        if line.strip() and pending:
            problems.extend(
                f"{name}:{at}: a doc-test marker not followed by a code block" for at, _ in pending
            )
            pending = []
        i += 1
    problems.extend(
        f"{name}:{at}: a doc-test marker not followed by a code block" for at, _ in pending
    )
    return blocks, problems


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but `-` and `_` dropped,
    spaces as `-`."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def broken_links(repo: Path, name: str) -> list[str]:
    """Relative links of a markdown file (outside code blocks) whose file or heading does
    not exist."""
    path = repo / name
    problems = []
    in_code = False
    anchors_of: dict[Path, set[str]] = {}

    def anchors(target: Path) -> set[str]:
        if target not in anchors_of:
            found: set[str] = set()
            fenced = False
            for line in target.read_text(encoding="utf-8").splitlines():
                if FENCE.match(line):
                    fenced = not fenced
                elif not fenced and line.startswith("#"):
                    found.add(github_anchor(line.lstrip("#")))
            anchors_of[target] = found
        return anchors_of[target]

    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        for link in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"^[a-z]+:", link):
                continue  # http:, https:, mailto:
            file_part, _, anchor = link.partition("#")
            target = (path.parent / file_part).resolve() if file_part else path
            if not target.exists():
                problems.append(f"{name}:{number}: a link to {link}, which does not exist")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target):
                problems.append(
                    f"{name}:{number}: a link to {link}: no such heading in {file_part or name}"
                )
    return problems


CODE_PATH = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)+)(?:\(\))?`")
DEFINITION = "(?:fn|struct|enum|trait|type|mod|const|static)"


def stale_code_names(repo: Path, name: str) -> list[str]:
    """Rust paths a doc names in backticks (`Engine::run_until`, `airlock_host::out::release`)
    whose item is defined nowhere in crates/: a walk through the code that names a function
    since renamed or removed is wrong when followed. Each segment after the crate must be
    defined (a module may also be a file of that name)."""
    sources = "\n".join(
        p.read_text(encoding="utf-8", errors="replace") for p in (repo / "crates").rglob("*.rs")
    )
    files = {p.stem for p in (repo / "crates").rglob("*.rs")}
    crates = {p.name.replace("-", "_") for p in (repo / "crates").iterdir()}
    problems = []
    for number, line in enumerate((repo / name).read_text(encoding="utf-8").splitlines(), 1):
        for path in CODE_PATH.findall(line):
            segments = [s for s in path.split("::") if s not in crates and s != "crate"]
            for segment in segments:
                if segment in files:
                    continue
                if not re.search(rf"\b{DEFINITION}\s+{re.escape(segment)}\b", sources):
                    problems.append(
                        f"{name}:{number}: `{path}` names {segment}, which crates/ does not define"
                    )
                    break
    return problems


def bring_loopback_up() -> None:
    """`ip link set lo up` without iproute2: SIOCGIFFLAGS, then SIOCSIFFLAGS with IFF_UP."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, siocgifflags, request))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sh", b"lo", flags | iff_up))


def health_answers(timeout_s: float = 2) -> bool:
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{PORT}/v1/health", timeout=timeout_s
        ) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def kill_group(process: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """Ends a process started in a session of its own, and everything it started."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()


def serve_check(script: str) -> int:
    """In a network namespace of its own (`unshare --net`): runs a block that starts a
    server, waits until 127.0.0.1:8700 answers /v1/health, stops it. Exit 0 when it did."""
    bring_loopback_up()
    process = subprocess.Popen(["bash", "-e", "-o", "pipefail", script], start_new_session=True)
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    answered = False
    while time.monotonic() < deadline and process.poll() is None:
        if health_answers():
            answered = True
            break
        time.sleep(0.2)
    exited = process.poll()
    kill_group(process)
    if not answered:
        print(
            f"the block's server never answered GET /v1/health on 127.0.0.1:{PORT}"
            + (f" (the block exited with {exited})" if exited is not None else ""),
            file=sys.stderr,
        )
        return 1
    print(f"the block's server answered GET /v1/health on 127.0.0.1:{PORT}")
    return 0


class Harness:
    def __init__(self, repo: Path, airlock: Path, work: Path) -> None:
        self.repo = repo
        self.airlock = airlock
        self.work = work
        self.require_all = os.environ.get("AIRLOCK_REQUIRE_ALL") == "1"
        self.python_venv = os.environ.get("AIRLOCK_DOCS_PYTHON_VENV") or None
        self.agents_venv = os.environ.get("AIRLOCK_DOCS_AGENTS_VENV") or None
        self.pylib = os.environ.get("AIRLOCK_TEST_PYLIB") or None
        self.bindir = work / "bin"
        self.bindir.mkdir()
        (self.bindir / "airlock").symlink_to(airlock)
        self.token = ""
        self.server: subprocess.Popen[bytes] | None = None
        self.server_error = ""
        self.output_schema: dict[str, object] | None = None
        self.scratch_count = 0

    # --- the environment -------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in (
            "AIRLOCK_URL",
            "AIRLOCK_BIN",
            "AIRLOCK_DOCS_PYTHON_VENV",
            "AIRLOCK_DOCS_AGENTS_VENV",
        ):
            env.pop(name, None)
        path = [str(self.bindir)]
        if self.python_venv:
            path.append(f"{self.python_venv}/bin")
        env["PATH"] = ":".join([*path, os.environ.get("PATH", "/usr/bin:/bin")])
        env["AIRLOCK_TOKEN"] = self.token
        env["AIRLOCK_STATE_DIR"] = str(self.work / "state")
        return env

    def scratch(self) -> Path:
        """A fresh working directory for one block, with ./target/{debug,release}/airlock."""
        self.scratch_count += 1
        directory = self.work / f"block-{self.scratch_count}"
        for profile in ("debug", "release"):
            (directory / "target" / profile).mkdir(parents=True)
            (directory / "target" / profile / "airlock").symlink_to(self.airlock)
        return directory

    def start_server(self) -> None:
        tokens = self.work / "tokens.toml"
        made = subprocess.run(
            [str(self.airlock), "token", "new", "--tenant", "docs", "--tokens-file", str(tokens)],
            capture_output=True,
            text=True,
            env=self.env(),
        )
        if made.returncode != 0:
            self.server_error = f"airlock token new failed: {made.stderr.strip()}"
            return
        self.token = made.stdout.strip()
        policy = self.work / "server-policy.toml"
        site_packages = f"site_packages = [{json.dumps(self.pylib)}]\n" if self.pylib else ""
        policy.write_text(
            'version = "docs"\n'
            '[limits]\nmemory = "1GiB"\ntimeout = "60s"\n'
            f"[filesystem]\n{site_packages}"
            '[sessions]\nenabled = true\nmode = "kernel"\n'
        )
        log = open(self.work / "serve.log", "wb")
        self.server = subprocess.Popen(
            [
                str(self.airlock),
                "serve",
                "--listen",
                f"127.0.0.1:{PORT}",
                "--tokens",
                str(tokens),
                "--policy",
                str(policy),
            ],
            stdout=log,
            stderr=log,
            env=self.env(),
            start_new_session=True,
        )
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline and self.server.poll() is None:
            if health_answers():
                return
            time.sleep(0.2)
        self.server_error = (
            "airlock serve did not start: " + (self.work / "serve.log").read_text()[-2000:]
        )

    def need_server(self) -> None:
        if self.server_error:
            raise Failed(self.server_error)

    def python_for(self, block: Block) -> str:
        modules = set(re.findall(r"^\s*(?:from|import)\s+(\w+)", block.text, re.MULTILINE))
        if modules & AGENTS_MODULES:
            if not self.agents_venv:
                raise Skip("server.sh's agents venv is missing", prerequisite=True)
            return f"{self.agents_venv}/bin/python"
        if modules & PYTHON_CI_MODULES:
            if not self.python_venv:
                raise Skip(
                    "python/ci.sh's venv is missing (run python/ci.sh first)", prerequisite=True
                )
            return f"{self.python_venv}/bin/python"
        return sys.executable

    def run(
        self, argv: list[str], cwd: Path, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=self.env(),
            text=True,
            start_new_session=True,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            stdout, stderr = process.communicate(stdin, timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_group(process)
            raise Failed(f"still running after {BLOCK_TIMEOUT_S} s") from None
        finally:
            kill_group(process)  # whatever the block left running in its session
        return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)

    # --- the checks ----------------------------------------------------------------------

    def check(self, block: Block) -> str:
        """Checks one block: returns what was done, or raises Skip or Failed."""
        skip = block.directive("skip")
        if skip:
            raise Skip(skip.reason or "")
        if block.directive("cli-usage"):
            return self.check_cli_usage(block)
        if block.directive("layout"):
            return self.check_layout(block)
        if block.directive("crates"):
            return self.check_crates(block)
        if block.directive("sse"):
            return self.check_sse(block)
        if block.directive("syntax"):
            return self.check_syntax(block)
        if block.lang in ("sh", "bash", "shell"):
            return self.check_shell(block)
        if block.lang == "python":
            return self.check_python(block)
        if block.lang == "json":
            return self.check_json(block)
        if block.lang == "toml":
            return self.check_policy(block)
        raise Failed(
            f"a `{block.lang or 'untagged'}` block nothing checks: give it a language the "
            "harness runs, "
            "or a doc-test marker (skip with a reason, cli-usage, layout, crates)"
        )

    def runnable_text(self, block: Block) -> str:
        text = block.text
        for directive in block.directives:
            if directive.name == "prepared":
                for prefix in directive.args:
                    if prefix not in text:
                        raise Failed(
                            f'the marker says the block contains "{prefix}", and it does not'
                        )
                    text = text.replace(prefix, "", 1)
        return text

    def judge(self, block: Block, result: subprocess.CompletedProcess[str], what: str) -> str:
        if result.returncode != 0:
            raise Failed(
                f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}"
                f"\n--- stderr\n{result.stderr[-3000:]}"
            )
        for directive in block.directives:
            if directive.name == "expect":
                for wanted in directive.args:
                    if wanted not in result.stdout:
                        raise Failed(
                            f"stdout lacks {wanted!r}:\n{result.stdout[-3000:]}"
                            f"\n--- stderr\n{result.stderr[-2000:]}"
                        )
        return what

    def check_shell(self, block: Block) -> str:
        text = self.runnable_text(block)
        prepared = [arg for d in block.directives if d.name == "prepared" for arg in d.args]
        if any("pip install" in arg for arg in prepared) and not self.python_venv:
            raise Skip(
                "python/ci.sh's venv, where the wheel is installed, is missing "
                "(run python/ci.sh first)",
                prerequisite=True,
            )
        cwd = self.scratch()
        script = cwd / "block.sh"
        script.write_text(text)
        if block.directive("serves"):
            result = self.run(
                ["unshare", "--net", "--", sys.executable, __file__, "--serve-check", str(script)],
                cwd,
            )
            return self.judge(
                block,
                result,
                "ran its server in a network namespace of its own; it answered /v1/health",
            )
        self.need_server()
        return self.judge(
            block, self.run(["bash", "-e", "-o", "pipefail", str(script)], cwd), "ran"
        )

    def check_python(self, block: Block) -> str:
        python = self.python_for(block)
        self.need_server()
        cwd = self.scratch()
        script = cwd / "block.py"
        script.write_text(self.runnable_text(block))
        return self.judge(block, self.run([python, str(script)], cwd), f"ran with {python}")

    def check_syntax(self, block: Block) -> str:
        if block.lang == "json":
            self.load_json(block)
        elif block.lang == "toml":
            self.load_toml(block.text)
        else:
            raise Failed(f"`syntax` is for json and toml blocks, not `{block.lang}`")
        return f"parsed as {block.lang} only"

    def load_json(self, block: Block) -> object:
        try:
            return json.loads(block.text)
        except json.JSONDecodeError as e:
            raise Failed(f"not JSON: {e}") from e

    def load_toml(self, text: str) -> dict[str, object]:
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise Failed(f"not TOML: {e}") from e

    def check_policy(self, block: Block) -> str:
        document = self.load_toml(block.text)
        text = block.text.replace("sha256:…", ZERO_DIGEST)
        if "version" not in document:
            text = 'version = "doc-test"\n' + text
        path = self.scratch() / "policy.toml"
        path.write_text(text)
        result = self.run([str(self.airlock), "policy", "check", str(path)], path.parent)
        if result.returncode != 0:
            raise Failed(f"airlock policy check refuses it:\n{result.stdout}{result.stderr}")
        return "a policy `airlock policy check` accepts"

    def check_json(self, block: Block) -> str:
        document = self.load_json(block)
        post = block.directive("post")
        if post:
            return self.post(block, post.args[0] if post.args else "/v1/runs", document)
        if isinstance(document, dict) and "mcpServers" in document:
            return self.check_mcp_servers(document["mcpServers"])
        if isinstance(document, dict) and "job_id" in document and "outcome" in document:
            return self.check_observation(document)
        return "parsed as JSON"

    def post(self, block: Block, path: str, body: object) -> str:
        self.need_server()
        request = urllib.request.Request(
            f"http://127.0.0.1:{PORT}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=BLOCK_TIMEOUT_S) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")[:2000]
            raise Failed(f"POST {path}: {e.code} {body}") from e
        if not (isinstance(answer, dict) and answer.get("ok") is True):
            raise Failed(f"POST {path} answered, but not ok: {json.dumps(answer)[:2000]}")
        return f"POST {path}: 200, ok"

    def check_observation(self, observation: dict[str, object]) -> str:
        python = self.python_with("jsonschema")
        if self.output_schema is None:
            tool = subprocess.run(
                [str(self.airlock), "tool-schema", "--format", "mcp"],
                capture_output=True,
                text=True,
                check=True,
            )
            self.output_schema = json.loads(tool.stdout)["outputSchema"]
        program = (
            "import json, sys, jsonschema\n"
            "schema, instance = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
            "jsonschema.validate(instance, schema)\n"
        )
        result = self.run(
            [python, "-c", program, json.dumps(self.output_schema), json.dumps(observation)],
            self.work,
        )
        if result.returncode != 0:
            raise Failed(
                "not an observation the run_code tool's outputSchema accepts:\n"
                + result.stderr[-3000:]
            )
        return "an observation the run_code tool's outputSchema accepts"

    def python_with(self, module: str) -> str:
        for venv in (self.python_venv, self.agents_venv):
            if venv and Path(f"{venv}/bin/python").exists():
                return f"{venv}/bin/python"
        raise Skip(f"no venv with {module} (python/ci.sh's or server.sh's)", prerequisite=True)

    def check_mcp_servers(self, servers: object) -> str:
        if not isinstance(servers, dict) or not servers:
            raise Failed("mcpServers is not an object of servers")
        python = self.python_with("mcp")
        self.need_server()
        program = r"""
import asyncio, json, os, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

config = json.loads(sys.argv[1])

async def main() -> None:
    if "command" in config:
        params = StdioServerParameters(
            command=config["command"], args=config.get("args", []), env=dict(os.environ)
        )
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
    else:
        token = os.environ["AIRLOCK_TOKEN"]
        headers = {k: v.replace("alk_...", token) for k, v in config.get("headers", {}).items()}
        async with streamablehttp_client(config["url"], headers=headers) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
    names = [tool.name for tool in tools.tools]
    assert "run_code" in names, names
    print(names)

asyncio.run(main())
"""
        done = []
        for name, config in servers.items():
            result = self.run([python, "-c", program, json.dumps(config)], self.work)
            if result.returncode != 0:
                raise Failed(
                    f"server {name!r}: the mcp client could not list its tools:\n"
                    + result.stderr[-3000:]
                )
            done.append(name)
        return f"the mcp client listed run_code from {', '.join(done)}"

    @staticmethod
    def sse_events(text: str) -> list[tuple[str, str]]:
        """The (event, data) pairs of a server-sent event stream; comments dropped."""
        events = []
        for chunk in re.split(r"\r?\n\r?\n", text):
            fields = dict(
                line.split(": ", 1)
                for line in chunk.splitlines()
                if ": " in line and line[0] != ":"
            )
            if "event" in fields:
                events.append((fields["event"], fields.get("data", "")))
        return events

    def check_sse(self, block: Block) -> str:
        self.need_server()
        documented = self.sse_events(block.text)
        written = {"stdout": "", "stderr": ""}
        for event, data in documented[:-1]:
            if event not in written:
                raise Failed(f"a documented event airlock does not send: {event!r}")
            written[event] += json.loads(data)["text"]
        if not documented or documented[-1][0] != "observation":
            raise Failed("the documented stream does not end with an `observation` event")
        code = (
            "import sys\n"
            f"sys.stdout.write({written['stdout']!r}); sys.stdout.flush()\n"
            f"sys.stderr.write({written['stderr']!r}); sys.stderr.flush()\n"
        )
        request = urllib.request.Request(
            f"http://127.0.0.1:{PORT}/v1/runs?stream=true",
            data=json.dumps({"code": code}).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=BLOCK_TIMEOUT_S) as response:
                kind = response.headers.get("Content-Type", "")
                stream = response.read().decode()
        except urllib.error.HTTPError as e:
            raise Failed(f"POST /v1/runs?stream=true: {e.code}") from e
        if not kind.startswith("text/event-stream"):
            raise Failed(f"the answer is {kind!r}, not text/event-stream")
        received = self.sse_events(stream)
        got = {"stdout": "", "stderr": ""}
        for event, data in received[:-1]:
            if event not in got:
                raise Failed(f"an event the docs do not describe: {event!r} in\n{stream[-2000:]}")
            got[event] += json.loads(data)["text"]
        if got != written:
            raise Failed(f"the stream carried {got}, the docs show {written}")
        if not received or received[-1][0] != "observation":
            raise Failed(f"the stream does not end with an observation event:\n{stream[-2000:]}")
        observation = json.loads(received[-1][1])
        shown = re.findall(r'"(\w+)":(true|false|"[^"…]*")', documented[-1][1])
        for name, value in shown:
            if value != '"…"' and observation.get(name) != json.loads(value):
                raise Failed(
                    f"the observation event has {name}={observation.get(name)!r}, not {value}"
                )
        return "a streamed job's events match the documented ones"

    def help_of(self, argv: list[str]) -> str:
        result = subprocess.run(
            [str(self.airlock), *argv, "--help"], capture_output=True, text=True
        )
        if result.returncode != 0:
            raise Failed(f"`airlock {' '.join(argv)} --help` fails: {result.stderr.strip()[:500]}")
        return result.stdout

    @staticmethod
    def commands_in(help_text: str) -> list[str]:
        section = (
            help_text.split("Commands:", 1)[1].split("\n\n", 1)[0]
            if "Commands:" in help_text
            else ""
        )
        return [
            m.group(1)
            for m in re.finditer(r"^\s{2}([a-z][a-z0-9-]*)\s", section, re.MULTILINE)
            if m.group(1) != "help"
        ]

    def check_cli_usage(self, block: Block) -> str:
        groups: list[list[str]] = []
        for line in block.text.splitlines():
            if line.startswith("airlock "):
                groups.append([line])
            elif groups and line.strip():
                groups[-1].append(line)
        if not groups:
            raise Failed("a cli-usage block without a line starting with `airlock `")
        top = self.commands_in(self.help_of([]))
        named: set[str] = set()
        for group in groups:
            command = group[0].split()[1]
            feature = re.search(r"built with --features (\w+)", " ".join(group))
            if command not in top and feature:
                named.add(command)  # a cargo feature's command, absent from this build
                continue
            if command not in top:
                raise Failed(
                    f"`airlock {command}`: no such command (airlock --help lists {', '.join(top)})"
                )
            named.add(command)
            text = re.sub(
                r"\([^)]*\)", "", " ".join(group)
            )  # asides: "(built with --features kube)"
            help_text = self.help_of([command])
            words = set(re.split(r"[\s|\[\]]+", text))
            for sub in self.commands_in(help_text):
                if sub in words:
                    help_text += self.help_of([command, sub])
            for flag in set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)):
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", help_text):
                    raise Failed(
                        f"`airlock {command}`: {flag} is not in its --help "
                        "(or its subcommands' named there)"
                    )
        missing = [c for c in top if c not in named]
        if missing:
            raise Failed(f"airlock --help has commands the synopsis omits: {', '.join(missing)}")
        return f"every command and flag is in airlock's --help ({len(groups)} commands)"

    def every_crate(self) -> list[str]:
        return sorted(
            p.name for p in (self.repo / "crates").iterdir() if (p / "Cargo.toml").exists()
        )

    def check_layout(self, block: Block) -> str:
        listed: set[str] = set()
        docs_line = ""
        for line in block.text.splitlines():
            if not line.strip():
                continue
            path = line.split()[0]
            if not (self.repo / path).exists():
                raise Failed(f"{path}: no such path in the repository")
            listed.add(path.rstrip("/"))
            if path.rstrip("/") == "docs":
                docs_line = line
        missing = [f"crates/{c}" for c in self.every_crate() if f"crates/{c}" not in listed]
        if missing:
            raise Failed(f"crates the layout omits: {', '.join(missing)}")
        if "docs" in listed:
            names = set(
                re.findall(
                    r"[\w.-]+", docs_line.split(None, 1)[1] if " " in docs_line.strip() else ""
                )
            )
            omitted = [
                p.name
                for p in sorted((self.repo / "docs").glob("*.md"))
                if p.stem not in names and p.name not in names
            ]
            if omitted:
                raise Failed(f"docs the layout's docs/ line omits: {', '.join(omitted)}")
        return f"{len(listed)} paths exist; every crate and every docs/*.md listed"

    def check_crates(self, block: Block) -> str:
        crates = set(self.every_crate())
        named = set(re.findall(r"airlock-[a-z0-9-]*[a-z0-9]", block.text))
        unknown = sorted(named - crates)
        if unknown:
            raise Failed(f"not crates of this workspace: {', '.join(unknown)}")
        missing = sorted(crates - named)
        if missing:
            raise Failed(f"crates the graph omits: {', '.join(missing)}")
        return f"names exactly the {len(crates)} crates"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--serve-check", help=argparse.SUPPRESS)
    parser.add_argument(
        "--expect-failures",
        action="store_true",
        help="the self-test: pass only when every block and link of FILES fails "
        "(skips count as failures)",
    )
    parser.add_argument(
        "files",
        nargs="*",
        help="markdown files, relative to the repo (default: README.md docs/*.md)",
    )
    options = parser.parse_args()
    if options.serve_check:
        return serve_check(options.serve_check)

    repo: Path = options.repo.resolve()
    airlock = Path(os.environ.get("AIRLOCK_BIN") or repo / "target/debug/airlock")
    if not os.access(airlock, os.X_OK):
        print(
            f"docs_test: no airlock binary at {airlock} (scripts/ci/docs.sh builds it)",
            file=sys.stderr,
        )
        return 1
    docs = sorted(str(p.relative_to(repo)) for p in (repo / "docs").glob("*.md"))
    files = options.files or ["README.md", *docs]

    bring_loopback_up()
    if health_answers(0.5):
        print(
            f"docs_test: something already answers on 127.0.0.1:{PORT}: "
            "run through scripts/ci/docs.sh, "
            "which gives the run a network namespace of its own",
            file=sys.stderr,
        )
        return 1

    passed = failed = skipped = 0
    failures: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="airlock-docs-"))
    harness = Harness(repo, airlock, work)
    if options.expect_failures:
        harness.require_all = True
    try:
        harness.start_server()
        for name in files:
            blocks, problems = parse_markdown(repo / name, name)
            problems += broken_links(repo, name)
            if name == "docs/architecture.md":
                problems += stale_code_names(repo, name)
            for problem in problems:
                print(f"FAIL {problem}", flush=True)
                failures.append(problem)
                failed += 1
            for block in blocks:
                label = f"{block.where()} ({block.lang or 'untagged'})"
                started = time.monotonic()
                try:
                    what = harness.check(block)
                except Skip as skip:
                    reason = str(skip)
                    # The self-test counts a missing prerequisite as not caught.
                    if harness.require_all and (
                        not reason or (skip.prerequisite and not options.expect_failures)
                    ):
                        why = reason or "skipped without a written reason"
                        print(
                            f"FAIL {label}: skipped ({why}) and AIRLOCK_REQUIRE_ALL=1", flush=True
                        )
                        failures.append(f"{block.where()}: skipped ({why})")
                        failed += 1
                    else:
                        print(f"SKIP {label}: {reason or 'NO REASON GIVEN'}", flush=True)
                        skipped += 1
                    continue
                except Failed as failure:
                    print(f"FAIL {label}: {failure}", flush=True)
                    failures.append(
                        f"{block.where()}: {str(failure).splitlines()[0] if str(failure) else ''}"
                    )
                    failed += 1
                    continue
                print(f"PASS {label}: {what} [{time.monotonic() - started:.1f}s]", flush=True)
                passed += 1
    finally:
        if harness.server is not None:
            kill_group(harness.server)
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("\nfailed blocks:")
        for line in failures:
            print(f"  {line}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    if options.expect_failures:
        if passed or skipped or not failed:
            print("self-test FAILED: a broken block above was not caught (PASS or SKIP)")
            return 1
        print(f"self-test passed: all {failed} broken blocks and links were caught")
        return 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
