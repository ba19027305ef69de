#!/usr/bin/env bash
# Issue 31's contract block, verbatim, on the built-in policy (no --policy): mint a key,
# serve, the three exports, then `Sandbox.create(); s.run_code("1+1").text` must print 2.
# Usage: contract.sh AIRLOCK_BIN PYTHON (PYTHON: a venv's interpreter with
# e2b-code-interpreter). Only the port is chosen here (a free one, not 8700, so runs on a
# shared host do not collide) and the state directory is a temporary one.
set -euo pipefail
bin_dir="$(cd "$(dirname "$1")" && pwd)"
venv_bin="$(cd "$(dirname "$2")" && pwd)"
work="$(mktemp -d /tmp/airlock-e2b-contract.XXXXXX)"
serve_pid=""
cleanup() {
  if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
export AIRLOCK_STATE_DIR="$work/state"
# `airlock` and `python3` as the block names them: the build's binary, the venv's python.
export PATH="$bin_dir:$venv_bin:$PATH"
[ "$(command -v airlock)" = "$bin_dir/airlock" ] || { echo "contract.sh: $1 is not named airlock" >&2; exit 1; }
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

KEY=$(airlock token new --tenant me --e2b --tokens-file tokens.toml)   # prints e2b_<hex>
airlock serve --listen 127.0.0.1:$PORT --tokens tokens.toml >serve.log 2>&1 &
serve_pid=$!
for _ in $(seq 600); do
  grep -q "listening on" serve.log && break
  kill -0 "$serve_pid" 2>/dev/null || { cat serve.log >&2; echo "contract.sh: airlock serve exited" >&2; exit 1; }
  sleep 0.05
done
grep -q "listening on" serve.log || { cat serve.log >&2; echo "contract.sh: airlock serve did not start" >&2; exit 1; }
export E2B_API_URL=http://127.0.0.1:$PORT E2B_SANDBOX_URL=http://127.0.0.1:$PORT E2B_API_KEY=$KEY
out="$(python3 -c 'from e2b_code_interpreter import Sandbox; s = Sandbox.create(); print(s.run_code("1+1").text)')" || {
  tail -40 serve.log >&2; echo "contract.sh: the contract block failed" >&2; exit 1; }
if [ "$out" != "2" ]; then
  tail -40 serve.log >&2
  echo "contract.sh: the contract block printed ${out@Q}, not 2" >&2
  exit 1
fi
echo "contract.sh: the contract block printed 2 on the built-in policy"
