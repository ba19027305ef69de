#!/usr/bin/env bash
# The TypeScript package's checks (js/, npm package airlock-sandbox; issue 32): installs
# the pinned dev dependencies with `npm ci` from js/package-lock.json, checks that the
# generated wire types still match the server's OpenAPI snapshot, lints (Biome),
# typechecks (tsc --strict), builds, then runs the tests with Node's test runner: the
# client, the AI SDK tool and sandbox session in generateText with the SDK's mock model,
# the official MCP TypeScript SDK over stdio and HTTP, and `npm pack` installed into an
# empty project running the README's examples, each against a real `airlock serve` on
# 127.0.0.1 started by the test.
#
# npm's cache lives in ${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}/npm, outside the clone.
# The binary is the workspace build's (`cargo metadata` target dir, debug/airlock),
# built here if missing; AIRLOCK_BIN overrides it. AIRLOCK_REQUIRE_ALL=1 turns every
# skipped test into a failure. Run as root (the native sandbox needs it). Exits non-zero
# on any failure; the last lines are the test runner's summary.
set -euo pipefail
cd "$(dirname "$0")/../.."

# The package's floor; `ai` 7 itself declares Node >= 22 and is tested here on 20.
MIN_NODE_MAJOR=20

. scripts/ci/lib.sh
ci_begin js.sh "the native sandbox needs it"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "scripts/ci/js.sh: needs node >= $MIN_NODE_MAJOR and npm on PATH" >&2
  exit 1
fi
node_major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$node_major" -lt "$MIN_NODE_MAJOR" ]; then
  echo "scripts/ci/js.sh: node $(node --version) is older than $MIN_NODE_MAJOR, the package's floor" >&2
  exit 1
fi

mkdir -p "$cache/npm"
export npm_config_cache="$cache/npm"
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

ci_airlock_bin

cd js
log "npm ci (node $(node --version), npm $(npm --version))"
npm ci --no-audit --no-fund
log "generated types match the server's OpenAPI snapshot (npm run gen:check)"
npm run --silent gen:check
log "lint (Biome)"
npm run --silent lint
log "typecheck (tsc --strict)"
npm run --silent typecheck
log "build"
npm run --silent build
log "tests against a real airlock serve ($AIRLOCK_BIN)"
npm test --silent
log "all checks passed"
