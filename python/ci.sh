#!/usr/bin/env bash
# The Python package's checks (issue 15): builds the airlock-sandbox wheel with maturin
# (it carries the `airlock` binary), installs it into a cached venv with the pinned
# frameworks, then runs ruff, mypy --strict and pytest against the installed wheel: the
# real binary in local mode, a real `airlock serve` on 127.0.0.1 in remote mode, and each
# framework's own agent loop with a scripted model.
#
# The venv lives in ${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}/python-<key>, where the key
# is a hash of the pins and the Python version: reinstalled only when a pin changes.
# AIRLOCK_REQUIRE_ALL=1 turns every skipped test into a failure.
# Run as root (the native sandbox needs it). Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")"
python_dir="$(pwd)"

log() { printf '==> python/ci.sh: %s\n' "$*" >&2; }

# Pins: the tools, and each framework extra at the version its range starts at
# (pyproject.toml). To move on, bump a pin (and the range) and run this script.
pins=(
  "maturin==1.16.0"
  "pytest==9.2.0"
  "mypy==2.4.1"
  "ruff==0.17.6"
  "langchain-core==1.8.3"
  "langgraph==1.2.24"
  "openai-agents==0.20.0"
  "crewai==1.15.30"
  "pydantic-ai-slim==2.68.0"
  "llama-index-core==0.14.25"
  "agent-framework-core==1.23.0"
)

if [ "$(id -u)" != 0 ]; then
  echo "python/ci.sh: run as root (the native sandbox needs it)" >&2
  exit 1
fi
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  log "installing python3-venv"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi

cache="${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}"
key="$( { python3 -c 'import sys; print(sys.version)'; printf '%s\n' "${pins[@]}"; } | sha256sum | cut -c1-16)"
venv="$cache/python-$key"
mkdir -p "$cache"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.airlock-ready" ]; then
  log "creating $venv with: ${pins[*]}"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q "${pins[@]}"
  touch "$venv/.airlock-ready"
fi

work="$(mktemp -d /tmp/airlock-python-ci.XXXXXX)"
trap 'rm -rf "$work"' EXIT

log "building the wheel (maturin, bindings = bin)"
# A debug build: it reuses the workspace's target/debug and is what the tests need; a
# release wheel is `maturin build --release`. --compatibility linux: the wheel is for this
# host, not a manylinux upload.
"$venv/bin/maturin" build --quiet --compatibility linux --out "$work/wheels" >&2
wheel="$(ls "$work"/wheels/airlock_sandbox-*.whl)"
log "installing $(basename "$wheel")"
"$venv/bin/pip" install -q --force-reinstall --no-deps "$wheel"
[ -x "$venv/bin/airlock" ] || { echo "the wheel did not install bin/airlock" >&2; exit 1; }
"$venv/bin/airlock" --version >&2

status=0
log "ruff"
"$venv/bin/ruff" check . || status=1
"$venv/bin/ruff" format --check . || status=1
log "mypy --strict"
"$venv/bin/mypy" || status=1

log "pytest (against the installed wheel)"
# matplotlib and pandas for the sandbox's charts test (scripts/test.sh exports it already).
if [ -z "${AIRLOCK_TEST_PYLIB:-}" ]; then
  AIRLOCK_TEST_PYLIB="$(../scripts/ci/pylib.sh)"
  export AIRLOCK_TEST_PYLIB
fi
# The tests run from a copy, so `import airlock` is the installed package, not ./airlock
# (README.md goes along: test_readme.py runs its examples).
mkdir -p "$work/run"
cp -r tests pyproject.toml README.md "$work/run/"
(
  cd "$work/run"
  unset AIRLOCK_BIN AIRLOCK_URL AIRLOCK_TOKEN
  # The copy has no checkout around it: test_openapi.py reads the snapshot from here.
  export AIRLOCK_OPENAPI_SNAPSHOT="$python_dir/../crates/airlock-server/src/snapshots/openapi.json"
  AIRLOCK_CI_WHEEL=1 "$venv/bin/python" -m pytest -p no:cacheprovider -rs "$@"
) || status=1

if [ "$status" != 0 ]; then
  log "FAILED"
else
  log "all Python checks passed"
fi
exit "$status"
