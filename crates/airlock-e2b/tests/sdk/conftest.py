"""A live `airlock serve` for the E2B SDK tests: two tenants with E2B-shaped keys minted by
`airlock token new --e2b`, the default policy (sessions on, kernel mode, so the code
interpreter's template has its kernel) with a short wall time, on 127.0.0.1 at a free port.
The binary is AIRLOCK_BIN (scripts/ci/e2b.sh sets it to the workspace build). With
AIRLOCK_E2B_TEMPLATE_IMAGE and AIRLOCK_E2B_IMAGE_STORE (scripts/ci/code-interpreter.sh), the
code-interpreter-v1 template runs on that image."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[4]
# The policy's wall time: a command past it is killed (the timeout test waits for it). On
# the code-interpreter image a cell's first import of pandas or matplotlib (its font cache
# built in the sandbox's /tmp) can take longer than 4 s on a loaded machine.
WALL_TIME_S = 30 if os.environ.get("AIRLOCK_E2B_TEMPLATE_IMAGE") else 4


# The memory of the code-interpreter-v1 template on the image (a kernel with pandas and
# matplotlib loaded wants about 1 GiB).
IMAGE_TEMPLATE_MEMORY_MIB = 1024


def code_interpreter_image() -> tuple[str, str]:
    """The code-interpreter-v1 image's rootfs spec and its store, when the run names them
    (AIRLOCK_E2B_TEMPLATE_IMAGE = "image:airlock-code-interpreter:v1@sha256:…",
    AIRLOCK_E2B_IMAGE_STORE: scripts/ci/code-interpreter.sh sets both); else empty."""
    image = os.environ.get("AIRLOCK_E2B_TEMPLATE_IMAGE", "")
    store = os.environ.get("AIRLOCK_E2B_IMAGE_STORE", "")
    if bool(image) != bool(store):
        raise RuntimeError("set both AIRLOCK_E2B_TEMPLATE_IMAGE and AIRLOCK_E2B_IMAGE_STORE, or neither")
    return image, store


@dataclass
class Server:
    url: str
    key_a: str
    key_b: str


def _policy() -> str:
    text = (REPO / "policy" / "default.toml").read_text()
    replacements = [
        ('timeout = "5s"', f'timeout = "{WALL_TIME_S}s"'),
        ("allow = []                     # variable names", 'allow = ["GREETING", "FOO"] # variable names'),
    ]
    image, store = code_interpreter_image()
    if image:
        # The code-interpreter-v1 template on the image scripts/ci/code-interpreter.sh
        # built (IPython, numpy, pandas, matplotlib), with the memory its kernel wants.
        replacements += [
            ('store = ""', f'store = "{store}"'),
            (
                "kernel = true                  # /execute runs on the session's Python kernel\n",
                f'kernel = true\nrootfs = "{image}"\nmemory = "{IMAGE_TEMPLATE_MEMORY_MIB}MiB"\n',
            ),
        ]
    pylib = os.environ.get("AIRLOCK_TEST_PYLIB")
    if pylib:
        # matplotlib and pandas for the kernel (scripts/ci/pylib.sh).
        replacements.append(("site_packages = []", f"site_packages = [{pylib!r}]".replace("'", '"')))
    for old, new in replacements:
        assert old in text, f"policy/default.toml changed: {old!r} not found"
        text = text.replace(old, new, 1)
    return text


def _mint(binary: str, tenant: str, tokens: Path) -> str:
    out = subprocess.run(
        [binary, "token", "new", "--tenant", tenant, "--e2b", "--tokens-file", str(tokens)],
        check=True,
        capture_output=True,
        text=True,
    )
    key = out.stdout.strip()
    assert re.fullmatch(r"e2b_[0-9a-f]{64}", key), key
    assert key not in tokens.read_text(), "the tokens file must hold the digest only"
    return key


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    binary = os.environ.get("AIRLOCK_BIN", "")
    if not binary or not os.access(binary, os.X_OK):
        message = "AIRLOCK_BIN does not name the airlock binary"
        if os.environ.get("AIRLOCK_REQUIRE_ALL") == "1":
            pytest.fail(message)
        pytest.skip(message)
    with tempfile.TemporaryDirectory(prefix="airlock-e2b-") as tmp:
        root = Path(tmp)
        tokens = root / "tokens.toml"
        key_a = _mint(binary, "alice", tokens)
        key_b = _mint(binary, "bob", tokens)
        policy = root / "policy.toml"
        policy.write_text(_policy())
        log = open(root / "serve.log", "w+b")
        proc = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--tokens", str(tokens), "--policy", str(policy)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "AIRLOCK_STATE_DIR": str(root / "state")},
        )
        try:
            url = None
            for _ in range(600):
                log.seek(0)
                found = re.search(rb"listening on (http://127\.0\.0\.1:\d+)", log.read())
                if found:
                    url = found.group(1).decode()
                    break
                if proc.poll() is not None:
                    break
                time.sleep(0.05)
            if url is None:
                log.seek(0)
                pytest.fail("airlock serve did not start:\n" + log.read().decode(errors="replace"))
            os.environ["E2B_API_URL"] = url
            os.environ["E2B_SANDBOX_URL"] = url
            os.environ["E2B_API_KEY"] = key_a
            yield Server(url=url, key_a=key_a, key_b=key_b)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.seek(0)
            tail = log.read().decode(errors="replace")[-4000:]
            print("airlock serve log (tail):\n" + tail)
            log.close()
