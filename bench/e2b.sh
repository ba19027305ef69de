#!/usr/bin/env bash
# Time to interactive through E2B's Python SDK (bench/e2b_tti.py): create → first run_code, and
# create → first commands.run, beside E2B's and Daytona's published medians. As root. The
# SDK is the pinned one scripts/ci/e2b.sh tests (its cached venv); the binary is a release
# build unless AIRLOCK_BIN names one. A benchmark, not a test.
#
#   bench/e2b.sh              10 sandboxes per row
#   bench/e2b.sh --runs 30
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ci/lib.sh
ci_begin bench/e2b.sh "the native sandbox's cgroups"
ci_airlock_bin release
venv="$(scripts/ci/e2b.sh --venv current)"
"$venv/bin/python" bench/e2b_tti.py --airlock "$AIRLOCK_BIN" "$@"
