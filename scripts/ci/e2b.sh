#!/usr/bin/env bash
# E2B's SDKs, unmodified and pinned, against a live `airlock serve` (issue 31): each pair
# runs crates/airlock-e2b/tests/sdk/test_python_sdk.py, whose fixture mints two tenants'
# keys with `airlock token new --e2b` and starts the server itself: create, list, connect,
# set_timeout, kill; commands streamed as they run, a non-zero exit, the client's deadline
# and the policy's wall time, a kill; every byte value through files (multipart,
# octet-stream, gzip); files confined to the workspace; a second tenant refused; what
# airlock does not do refused clearly; host routing; run_code on the session's kernel.
# Before them, crates/airlock-e2b/tests/sdk/contract.sh runs issue 31's contract block
# verbatim (token new --e2b, serve with no --policy, the three exports, run_code("1+1")).
#
# Then the TypeScript SDKs (e2b 2.51.0, @e2b/code-interpreter 2.8.0) under Node run the
# same flow from crates/airlock-e2b/tests/sdk/node/e2b.test.mjs.
#
# The pairs (crates/airlock-e2b/tests/sdk/requirements-{current,older}.txt, with .lock
# constraints): e2b 2.63.0 + e2b-code-interpreter 2.11.5, and e2b 2.44.0 +
# e2b-code-interpreter 2.10.0 (before the SDK's /v2/sandboxes create; the first code
# interpreter that honours E2B_SANDBOX_URL). Each in a venv cached under
# ${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}, keyed on its pins. AIRLOCK_CI_RELOCK=1
# installs without the locks and rewrites them. Builds the airlock binary unless
# AIRLOCK_BIN names one. A skipped test fails the run under AIRLOCK_REQUIRE_ALL=1.
set -euo pipefail
cd "$(dirname "$0")/../.."

. scripts/ci/lib.sh
ci_begin e2b.sh "the native sandbox needs it"
tests="crates/airlock-e2b/tests/sdk"

# make_venv_of NAME: the venv of the pair (or the agents set) $tests/requirements-NAME.txt.
make_venv_of() {
  make_venv "e2b-$1" "$tests/requirements-$1.txt" "$tests/requirements-$1.lock"
}

# `e2b.sh --venv NAME` prints the venv of that pair (bench/e2b.sh uses the current SDK).
if [ "${1:-}" = "--venv" ]; then
  make_venv_of "$2"
  exit 0
fi

ci_airlock_bin
export PYTHONDONTWRITEBYTECODE=1
# matplotlib and pandas for the kernel's charts-and-tables test (scripts/test.sh has them
# already; a run of this script alone gets them the same way).
if [ -z "${AIRLOCK_TEST_PYLIB:-}" ]; then
  AIRLOCK_TEST_PYLIB="$(scripts/ci/pylib.sh)"
fi
export AIRLOCK_TEST_PYLIB

failed=0
# Issue 31's contract block, verbatim, on the built-in policy, through the current SDK.
if ! "$tests/contract.sh" "$AIRLOCK_BIN" "$(make_venv_of current)/bin/python3"; then
  log "FAIL the contract block"
  failed=1
fi
for pair in current older; do
  venv="$(make_venv_of "$pair")"
  versions="$("$venv/bin/pip" list 2>/dev/null | awk '/^e2b(-code-interpreter)? /{printf "%s %s  ", $1, $2}')"
  log "python SDK ($pair): $versions"
  if ! (cd "$tests" && "$venv/bin/python" -m pytest -p no:cacheprovider -rs -q test_python_sdk.py); then
    log "FAIL python SDK ($pair)"
    failed=1
  fi
done
# The OpenAI Agents SDK's E2B sandbox client, unmodified (requirements-agents.txt: the
# openai-agents that python/ci.sh pins, with the current SDK pair rather than its [e2b]
# extra's older pins), driven through its session API: no model is reachable.
agents_venv="$(make_venv_of agents)"
log "openai-agents E2B client: $("$agents_venv/bin/pip" list 2>/dev/null | awk '/^(openai-agents|e2b) /{printf "%s %s  ", $1, $2}')"
if ! "$agents_venv/bin/python" "$tests/agents_e2b_check.py" "$AIRLOCK_BIN"; then
  log "FAIL openai-agents E2B client"
  failed=1
fi
# The TypeScript SDKs under Node (crates/airlock-e2b/tests/sdk/node: package.json and its
# lock pin e2b 2.51.0 and @e2b/code-interpreter 2.8.0), installed with `npm ci` from a
# download cache outside the clone.
node_dir="$tests/node"
# node:test with --test-concurrency needs Node 20 (as scripts/ci/js.sh's floor).
MIN_NODE_MAJOR=20
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  log "FAIL node SDK: needs node >= $MIN_NODE_MAJOR and npm on PATH"
  exit 1
fi
if [ "$(node -p 'process.versions.node.split(".")[0]')" -lt "$MIN_NODE_MAJOR" ]; then
  log "FAIL node SDK: node $(node --version) is older than $MIN_NODE_MAJOR"
  exit 1
fi
log "node SDK: npm ci (node $(node --version))"
if (cd "$node_dir" && npm ci --silent --no-audit --no-fund --cache "$cache/npm") >&2; then
  log "node SDK: $(cd "$node_dir" && node -p 'const l=require("./package-lock.json").packages; ["e2b","@e2b/code-interpreter"].map(n=>n+" "+l["node_modules/"+n].version).join("  ")')"
  if ! (cd "$node_dir" && node --test --test-concurrency=1 e2b.test.mjs); then
    log "FAIL node SDK"
    failed=1
  fi
else
  log "FAIL node SDK: npm ci"
  failed=1
fi
exit "$failed"
