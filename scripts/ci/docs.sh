#!/usr/bin/env bash
# Runs every code block of README.md and docs/*.md (issue 30 item 7), so a doc cannot drift
# from the product: shell and Python blocks are executed, JSON and TOML blocks validated
# (a policy snippet by `airlock policy check`, an observation against the tool's
# outputSchema, a request body by sending it), the CLI synopsis and the layouts checked
# against the binary and the tree. How each kind is checked, and the `<!-- doc-test: ... -->`
# markers a block may carry, are described in scripts/ci/docs_test.py.
#
# The environment it prepares, reusing what scripts/test.sh built before it:
#   - the airlock binary of this clone's workspace build (`cargo metadata`'s target dir,
#     debug/airlock), first on PATH; AIRLOCK_BIN names another;
#   - python/ci.sh's cached venv (this clone's wheel and the pinned frameworks) for blocks
#     that import airlock or a framework, and scripts/ci/server.sh's "agents" venv (the
#     pinned MCP adapters) for blocks that import those; the agents venv is created here,
#     exactly as server.sh creates it, when missing;
#   - a network namespace of its own with only `lo`, so the `airlock serve` it starts on
#     127.0.0.1:8700 (with a tokens file, sessions on, the charts packages of
#     scripts/ci/pylib.sh) is the docs' port whatever else the machine runs.
# Closes with "N passed, N failed, N skipped"; exits non-zero when a block failed, or under
# AIRLOCK_REQUIRE_ALL=1 when one was skipped without a written reason or for want of a
# prerequisite. First, a self-test: every block of scripts/ci/docs-test/broken.md, each
# broken in one way, must fail (skipped when FILES are given). Arguments: markdown files
# to check instead of README.md and docs/*.md. Run as root (the native sandbox needs it).
# About a minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$(pwd)"

. scripts/ci/lib.sh
ci_begin docs.sh "the native sandbox needs it"

# The airlock binary of this clone.
ci_airlock_bin

# python/ci.sh's venv: the same key (the interpreter's version and the pins of python/ci.sh).
if [ -z "${AIRLOCK_DOCS_PYTHON_VENV:-}" ]; then
  eval "$(sed -n '/^pins=(/,/^)/p' python/ci.sh)"
  key="$( { python3 -c 'import sys; print(sys.version)'; printf '%s\n' "${pins[@]}"; } | sha256sum | cut -c1-16)"
  AIRLOCK_DOCS_PYTHON_VENV="$cache/python-$key"
fi
if [ ! -f "$AIRLOCK_DOCS_PYTHON_VENV/.airlock-ready" ]; then
  log "no python/ci.sh venv at $AIRLOCK_DOCS_PYTHON_VENV (run python/ci.sh first): its blocks are skipped"
  AIRLOCK_DOCS_PYTHON_VENV=""
fi

# scripts/ci/server.sh's "agents" venv (the pinned MCP adapters), made here as there when missing.
if [ -z "${AIRLOCK_DOCS_AGENTS_VENV:-}" ]; then
  AIRLOCK_DOCS_AGENTS_VENV="$(make_venv agents crates/airlock-server/tests/py/requirements-agents.txt \
    crates/airlock-server/tests/py/requirements-agents.lock)"
fi

# matplotlib and pandas for the sessions' chart example (scripts/test.sh exports it).
if [ -z "${AIRLOCK_TEST_PYLIB:-}" ]; then
  AIRLOCK_TEST_PYLIB="$(scripts/ci/pylib.sh)"
fi

export AIRLOCK_BIN AIRLOCK_DOCS_PYTHON_VENV AIRLOCK_DOCS_AGENTS_VENV AIRLOCK_TEST_PYLIB
export PYTHONDONTWRITEBYTECODE=1 CREWAI_TRACING_ENABLED=false OTEL_SDK_DISABLED=true
# The runner itself: ruff and mypy --strict from python/ci.sh's venv, with python/'s rules.
if [ -n "$AIRLOCK_DOCS_PYTHON_VENV" ]; then
  log "ruff and mypy --strict on scripts/ci/docs_test.py"
  "$AIRLOCK_DOCS_PYTHON_VENV/bin/ruff" check -q --config python/pyproject.toml scripts/ci/docs_test.py
  "$AIRLOCK_DOCS_PYTHON_VENV/bin/ruff" format -q --check --config python/pyproject.toml scripts/ci/docs_test.py
  "$AIRLOCK_DOCS_PYTHON_VENV/bin/mypy" --strict --no-error-summary scripts/ci/docs_test.py >&2
fi

# The runner brings `lo` up itself (no dependency on iproute2).
if [ $# = 0 ]; then
  log "self-test: every block of scripts/ci/docs-test/broken.md must fail"
  unshare --net -- python3 "$repo/scripts/ci/docs_test.py" --repo "$repo" --expect-failures \
    scripts/ci/docs-test/broken.md >"$cache/docs-selftest.log" 2>&1 ||
    { cat "$cache/docs-selftest.log" >&2; echo "docs.sh: the self-test failed: the checker lets a broken block through" >&2; exit 1; }
  tail -2 "$cache/docs-selftest.log" >&2
fi
log "running the docs' code blocks in a network namespace of their own"
exec unshare --net -- python3 "$repo/scripts/ci/docs_test.py" --repo "$repo" "$@"
