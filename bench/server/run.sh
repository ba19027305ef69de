#!/usr/bin/env bash
# Builds airlock (release) and runs the server benchmark; prints a Markdown table.
# As root (the native sandbox needs it). Usage: bench/server/run.sh [bench.py options]
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build -q --release -p airlock-cli
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
exec python3 bench/server/bench.py "$target_dir/release/airlock" "$@"
