"""E2B's code interpreter SDK, unmodified, on the `code-interpreter-v1` template whose root is
the image built from images/code-interpreter-v1 (IPython, numpy, pandas, matplotlib from a
pinned wheelhouse): what notebook code written for E2B uses. scripts/ci/code-interpreter.sh
builds the image and runs this file with AIRLOCK_E2B_TEMPLATE_IMAGE and
AIRLOCK_E2B_IMAGE_STORE naming it (conftest.py puts them in the server's policy)."""

from __future__ import annotations

import base64
import os

import pytest

from conftest import IMAGE_TEMPLATE_MEMORY_MIB, Server, code_interpreter_image

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def code_sandbox(server: Server):
    if not code_interpreter_image()[0]:
        message = "AIRLOCK_E2B_TEMPLATE_IMAGE is not set: no code-interpreter-v1 image to run on (scripts/ci/code-interpreter.sh builds it)"
        if os.environ.get("AIRLOCK_REQUIRE_ALL") == "1":
            pytest.fail(message)
        pytest.skip(message)
    from e2b_code_interpreter import Sandbox as CodeSandbox

    s = CodeSandbox.create(timeout=300)
    yield s
    s.kill()


def test_the_template_runs_on_the_image_with_its_memory(code_sandbox) -> None:
    info = code_sandbox.get_info()
    assert info.template_id == "code-interpreter-v1"
    # E2B's SandboxInfo names it memory_mb (older SDKs: the raw field).
    memory = getattr(info, "memory_mb", None)
    if memory is not None:
        assert memory == IMAGE_TEMPLATE_MEMORY_MIB, info
    # The kernel's interpreter is the image's (Debian 12's python3 with the wheelhouse),
    # not the host's minimal root: IPython is importable and is the one running the cell.
    shell = code_sandbox.run_code("import IPython, sys\n(type(get_ipython()).__name__, sys.version_info[:2])")
    assert shell.error is None, shell.error
    assert shell.text == "('InteractiveShell', (3, 11))", shell.text
    # Commands run on the template's root too.
    pandas = code_sandbox.commands.run("python3 -c 'import pandas; print(pandas.__version__)'")
    assert pandas.exit_code == 0 and pandas.stdout.strip(), pandas


def test_ipython_magics_and_shell_escapes(code_sandbox) -> None:
    printed: list[str] = []
    cell = code_sandbox.run_code(
        "!echo from-a-shell\n%time total = sum(range(10))\ntotal",
        on_stdout=lambda m: printed.append(m.line),
    )
    assert cell.error is None, cell.error
    # The shell's line, then the magic's timing, streamed to the callback as written.
    stdout = "".join(cell.logs.stdout)
    assert stdout.startswith("from-a-shell\n") and "Wall time" in stdout, cell.logs
    assert "".join(printed) == stdout, printed
    assert cell.text == "45"
    # `!cmd` runs under the same sandbox rules: it sees the workspace and nothing else.
    code_sandbox.files.write("/home/user/seen.txt", "workspace file")
    listing = code_sandbox.run_code("files = !ls /work\nfiles")
    assert "seen.txt" in (listing.text or ""), listing
    assert code_sandbox.run_code("%pwd").text == "'/work'"


def test_pandas_tables_come_back_as_html(code_sandbox) -> None:
    table = code_sandbox.run_code(
        "import pandas as pd\npd.DataFrame({'x': [1, 2, 3], 'y': [4.0, 5.5, 6.25]})"
    )
    assert table.error is None, table.error
    main = table.results[-1]
    assert main.is_main_result
    assert "<table" in (main.html or ""), main
    assert "6.25" in (main.text or ""), main


def test_matplotlib_figures_come_back_as_png(code_sandbox) -> None:
    chart = code_sandbox.run_code(
        "import numpy as np, matplotlib.pyplot as plt\n"
        "plt.plot(np.arange(10), np.arange(10) ** 2)\n"
        "plt.show()\n"
        "from IPython.display import HTML, display\n"
        "display(HTML('<b>after the chart</b>'))"
    )
    assert chart.error is None, chart.error
    pngs = [r.png for r in chart.results if r.png]
    assert len(pngs) == 1, chart.results
    assert base64.b64decode(pngs[0]).startswith(PNG_MAGIC)
    htmls = [r.html for r in chart.results if r.html]
    assert htmls == ["<b>after the chart</b>"], chart.results
    # In the order the cell made them: the figure, then the HTML.
    kinds = ["png" if r.png else "html" for r in chart.results]
    assert kinds == ["png", "html"], kinds
