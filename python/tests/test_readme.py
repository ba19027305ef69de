"""Every python block of python/README.md, run as written, local and remote. The framework
examples (the first block under each `###` heading of "Framework tools") run with a
scripted model (no model service, no network) in place of the lines marked
`# your model`, and must print the job's answer (45); the client examples must run to
their end (their asserts hold)."""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .scripted import (
    Script,
    agent_framework_client,
    crewai_llm,
    langchain_model,
    llamaindex_function_llm,
    openai_agents_model,
    pydantic_ai_model,
)

# Agent frameworks phone home unless told not to; CI has no network.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

README = Path(__file__).resolve().parents[1] / "README.md"
HELLO = {"code": "print(sum(range(10)))"}


def _examples() -> dict[str, str]:
    """The first python block under each `###` heading of the README's framework section."""
    text = README.read_text() if README.is_file() else ""
    section = text.partition("## Framework tools")[2].partition("\n## ")[0]
    found: dict[str, str] = {}
    for heading, body in re.findall(r"^### (.+?)\n(.*?)(?=^### |\Z)", section, re.S | re.M):
        match = re.search(r"```python\n(.*?)```", body, re.S)
        if match:
            found[heading.strip()] = match.group(1)
    return found


def _scripted(factory: Callable[[Script], Any]) -> Callable[[], Any]:
    """A scripted model that calls run_code with the hello job and answers with its stdout."""
    return lambda: factory(Script(dict(HELLO), echo_stdout=True))


def _custom_host() -> str:
    return json.dumps(HELLO)


#: heading -> (the module the example needs, the scripted model).
FRAMEWORKS: dict[str, tuple[str, Callable[[], Any]]] = {
    "Custom hosts (Chat Completions, Responses)": ("airlock", _custom_host),
    "LangChain / LangGraph": ("langgraph", _scripted(langchain_model)),
    "CrewAI": ("crewai", _scripted(crewai_llm)),
    "OpenAI Agents SDK": ("agents", _scripted(openai_agents_model)),
    "Pydantic AI": ("pydantic_ai", _scripted(pydantic_ai_model)),
    "LlamaIndex": ("llama_index.core", _scripted(llamaindex_function_llm)),
    "Microsoft Agent Framework": ("agent_framework", _scripted(agent_framework_client)),
}


#: The `##` sections whose python blocks run as they are.
CLIENT_SECTIONS = ("The drop-in: `run_in_container`", "`Client` and `AsyncClient`")


def _client_examples() -> dict[str, str]:
    text = README.read_text() if README.is_file() else ""
    found: dict[str, str] = {}
    for section in CLIENT_SECTIONS:
        body = text.partition(f"\n## {section}\n")[2].partition("\n## ")[0]
        match = re.search(r"```python\n(.*?)```", body, re.S)
        if match:
            found[section] = match.group(1)
    return found


def test_every_python_block_is_run() -> None:
    if not README.is_file():
        pytest.skip(f"no README at {README} (the tests run from a copy without it)")
    assert set(FRAMEWORKS) <= set(_examples()), sorted(_examples())
    assert set(CLIENT_SECTIONS) <= set(_client_examples())
    text = README.read_text()
    run = list(_examples().values()) + list(_client_examples().values())
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert sorted(blocks) == sorted(run), "a python block of the README is not run"


@pytest.mark.parametrize("section", CLIENT_SECTIONS)
def test_readme_client_example_runs(
    section: str,
    in_tmp: Path,
    remote_or_local: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    examples = _client_examples()
    if section not in examples:
        pytest.skip(f"no README at {README} (the tests run from a copy without it)")
    if remote_or_local:
        monkeypatch.setenv("AIRLOCK_URL", remote_or_local["url"])
        monkeypatch.setenv("AIRLOCK_TOKEN", remote_or_local["token"])
    exec(compile(examples[section], f"README.md ({section})", "exec"), {})


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("heading", sorted(FRAMEWORKS))
def test_readme_example_runs(
    heading: str,
    in_tmp: Path,
    remote_or_local: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module, scripted = FRAMEWORKS[heading]
    pytest.importorskip(module, reason=f"the extra for {heading} is not installed")
    examples = _examples()
    if heading not in examples:
        pytest.skip(f"no README at {README} (the tests run from a copy without it)")
    if remote_or_local:
        # The examples use the default client: AIRLOCK_URL selects the server.
        monkeypatch.setenv("AIRLOCK_URL", remote_or_local["url"])
        monkeypatch.setenv("AIRLOCK_TOKEN", remote_or_local["token"])
    source = examples[heading]
    marked = [line for line in source.splitlines() if "# your model" in line]
    names = {m.group(1) for line in marked if (m := re.match(r"(\w+) = ", line))}
    assert len(names) == 1, f"{heading}: one `NAME = ...  # your model` line expected"
    code = "\n".join(line for line in source.splitlines() if "# your model" not in line)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, f"README.md ({heading})", "exec"), {names.pop(): scripted()})
    printed = capsys.readouterr().out
    assert "45" in printed, printed
