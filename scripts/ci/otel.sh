#!/usr/bin/env bash
# OpenTelemetry export (issue 33, docs/telemetry.md), end to end: an OTLP/HTTP receiver on
# 127.0.0.1 that decodes with the official protobuf definitions (PyPI opentelemetry-proto,
# pinned in crates/airlock-telemetry/tests/py/requirements.txt) receives what `airlock
# serve` (HTTP with a traceparent) and `airlock mcp` (stdio, `_meta.traceparent`) export:
# the job span in the caller's trace with its attributes and children, egress spans
# (allowed and denied), the metrics, the audit record as a log record, the Python and
# TypeScript packages' callers' traces continued, a session call's, an E2B command's and
# code cell's spans, which path each warm-pool job's sandbox took, and no source, stdin,
# output, command or cell text anywhere; and a collector that accepts and never answers
# delays no job. The venv lives in the CI cache, keyed on the pins. Builds the airlock binary
# unless AIRLOCK_BIN names one. As root (the native sandbox).
set -euo pipefail
cd "$(dirname "$0")/../.."

. scripts/ci/lib.sh
ci_begin otel.sh "the native sandbox needs it"
tests="crates/airlock-telemetry/tests/py"
venv="$(make_venv otel "$tests/requirements.txt")"

ci_airlock_bin

# The TypeScript caller (js/test/otel-caller.ts) needs js's pinned dev dependencies and
# its build; without node the check says why it skipped (a failure under
# AIRLOCK_REQUIRE_ALL=1).
if command -v node >/dev/null && command -v npm >/dev/null; then
  log "building js/ for the TypeScript caller (npm ci, npm run build:test)"
  mkdir -p "$cache/npm"
  (
    cd js
    export npm_config_cache="$cache/npm" npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false
    npm ci --no-audit --no-fund --silent
    npm run --silent build:test
  )
fi

log "OTLP export of serve, mcp, sessions, E2B and the packages' callers, checked by a receiver decoding with opentelemetry-proto"
"$venv/bin/python" "$tests/otlp_e2e.py" "$AIRLOCK_BIN"
