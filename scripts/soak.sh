#!/usr/bin/env bash
# Soak (issue 34): 10,000 mixed jobs through one `airlock serve` from 8 clients (hello,
# output floods, timeouts, OOM, non-zero exits, /out files, sh, workspace sessions, E2B
# sandboxes through E2B's Python SDK), then jobs/s, the server's RSS, fds and threads at
# start, middle and end, leftovers and audit lines per job, as Markdown (scripts/soak.py).
# As root (the native sandbox). Not a CI test: its last figures are in docs/serve.md ("Soak").
#
#   scripts/soak.sh                      10,000 jobs, 8 clients, a release build
#   scripts/soak.sh --jobs 2000          fewer
#   AIRLOCK_BIN=target/debug/airlock scripts/soak.sh --jobs 1000
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ci/lib.sh
ci_begin scripts/soak.sh "the native sandbox's cgroups"
ci_airlock_bin release
# E2B's SDK from the pinned venv scripts/ci/e2b.sh keeps; without it the E2B share of the
# mix is reported as skipped.
python=python3
if venv="$(scripts/ci/e2b.sh --venv current 2>/dev/null)" && [ -x "$venv/bin/python" ]; then
  python="$venv/bin/python"
fi
exec "$python" scripts/soak.py --airlock "$AIRLOCK_BIN" "$@"
