#!/usr/bin/env bash
# Checks of `airlock serve` and `airlock mcp` with real clients airlock did not write,
# on this machine, as root:
#   1. the official `mcp` Python package lists and calls run_code over stdio and over
#      streamable HTTP (with a bearer token);
#   2. the OpenAPI document validates (openapi-spec-validator);
#   3. schemathesis fuzzes the live API and finds no 500s (and no response that breaks
#      the documented statuses, content types, headers or schemas).
# Python packages go into a cached venv outside the clone
# (${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}/venv). Builds the airlock binary unless
# AIRLOCK_BIN names one. Exits non-zero on any failure. Idempotent; a few minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."

cache="${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}"
venv="$cache/venv"
# Bounds of the fuzzing pass (2 cores: keep it to a few minutes).
SCHEMATHESIS_EXAMPLES="${SCHEMATHESIS_EXAMPLES:-40}"
SCHEMATHESIS_MAX_TIME="${SCHEMATHESIS_MAX_TIME:-150}"
log() { printf '==> server.sh: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
  echo "scripts/ci/server.sh: run as root (the native sandbox needs it)" >&2
  exit 1
fi
mkdir -p "$cache"

# Python with venv support.
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  log "installing python3-venv"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi
# The venv, with the clients pinned to versions this script was last run with (reinstalled
# only when the list changes): a new release of one cannot break CI by surprise. To move
# on, bump a pin and run this script.
packages="mcp==2.3.0 openapi-spec-validator==0.9.0 schemathesis==4.32.5"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.airlock-packages" 2>/dev/null)" != "$packages" ]; then
  log "creating $venv with: $packages"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # shellcheck disable=SC2086
  "$venv/bin/pip" install -q $packages
  echo "$packages" >"$venv/.airlock-packages"
fi
"$venv/bin/pip" list 2>/dev/null | grep -iE '^(mcp|openapi-spec-validator|schemathesis|hypothesis) ' >&2 || true

# The airlock binary.
if [ -z "${AIRLOCK_BIN:-}" ]; then
  log "cargo build -p airlock-cli"
  cargo build -q -p airlock-cli --locked
  target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
  AIRLOCK_BIN="$target_dir/debug/airlock"
fi
[ -x "$AIRLOCK_BIN" ] || { echo "no airlock binary at $AIRLOCK_BIN" >&2; exit 1; }

work="$(mktemp -d /tmp/airlock-server-ci.XXXXXX)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
export AIRLOCK_STATE_DIR="$work/state"
py="$venv/bin/python"
checks="crates/airlock-server/tests/py/mcp_check.py"

log "MCP over stdio (airlock mcp) with the mcp package"
timeout 300 "$py" "$checks" stdio "$AIRLOCK_BIN"

# A tokens file with one fresh tenant.
token="$("$AIRLOCK_BIN" token new --tenant ci --tokens-file "$work/tokens.toml")"

log "starting airlock serve"
"$AIRLOCK_BIN" serve --listen 127.0.0.1:0 --tokens "$work/tokens.toml" --queue 64 \
  2>"$work/serve.log" &
server_pid=$!
addr=""
for _ in $(seq 1 100); do
  addr="$(grep -o 'listening on http://[0-9.:]*' "$work/serve.log" | head -1 | sed 's|listening on http://||' || true)"
  [ -n "$addr" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
  sleep 0.1
done
[ -n "$addr" ] || { echo "airlock serve did not start" >&2; cat "$work/serve.log" >&2; exit 1; }
base="http://$addr"
log "serving on $base"

log "MCP over streamable HTTP (/mcp) with the mcp package"
timeout 300 "$py" "$checks" http "$base/mcp" "$token"

log "the docs/serve.md example: run_in_container() with the standard library"
AIRLOCK_URL="$base" AIRLOCK_TOKEN="$token" timeout 120 python3 crates/airlock-server/tests/py/run_in_container.py

log "validating the OpenAPI document"
"$py" -c 'import sys, urllib.request; open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1]).read())' \
  "$base/v1/openapi.json" "$work/openapi.json"
"$venv/bin/openapi-spec-validator" "$work/openapi.json"

log "schemathesis against the live server ($SCHEMATHESIS_EXAMPLES examples per operation, at most ${SCHEMATHESIS_MAX_TIME}s)"
# Response-side checks: no 5xx, and every status, content type, header and body as the
# document says. Data acceptance checks are left out: the policy's semantic rules
# (known languages, paths without "..", durations) are not all expressible in the schema.
# Run from the scratch dir: schemathesis keeps its example database in the working dir.
(cd "$work" && "$venv/bin/schemathesis" run "$base/v1/openapi.json" \
  --header "Authorization: Bearer $token" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_headers_conformance,response_schema_conformance \
  --max-examples "$SCHEMATHESIS_EXAMPLES" --max-time "$SCHEMATHESIS_MAX_TIME" \
  --workers 2 --request-timeout 60 --seed 1 --no-color \
  --report-dir "$work/schemathesis" >"$work/schemathesis.log" 2>&1) || {
    tail -80 "$work/schemathesis.log" >&2
    echo "schemathesis found failures" >&2
    exit 1
  }
tail -20 "$work/schemathesis.log" >&2

# The server is still healthy and still answers; the token never reached its log.
"$py" -c 'import json, sys, urllib.request; h = json.load(urllib.request.urlopen(sys.argv[1])); assert h["status"] == "ok", h; print("health:", h)' \
  "$base/v1/health" >&2
if grep -qF "$token" "$work/serve.log"; then
  echo "the bearer token appears in the server log" >&2
  exit 1
fi

log "stopping airlock serve (pid $server_pid)"
kill -TERM "$server_pid"
for _ in $(seq 1 300); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$server_pid" 2>/dev/null; then
  echo "airlock serve did not stop within 30 s of SIGTERM" >&2
  exit 1
fi
wait "$server_pid" || { echo "airlock serve exited with an error" >&2; tail -20 "$work/serve.log" >&2; exit 1; }
server_pid=""
log "all server checks passed"
