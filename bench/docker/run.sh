#!/usr/bin/env bash
# Benchmark (not a test): the same job, side by side in one hyperfine run, as
#   1. `docker run` with DESIGN §5's reference flags (the CLI: one process per job,
#      which itself creates, attaches, starts, waits and removes over the API), and
#   2. `airlock run --backend docker` (the Engine API directly, plus airlock's checks:
#      image digest, policy, audit line, job directory, container removal).
# Also gVisor both ways. As root, with the test image of scripts/ci/docker.sh loaded.
# Starts dockerd only if none runs (and stops only that one).
set -euo pipefail
cd "$(dirname "$0")/../.."
cache="${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}/docker"
runs="${BENCH_RUNS:-30}"
command -v hyperfine >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine >/dev/null

started=""
trap '[ -n "$started" ] && kill "$started" 2>/dev/null || true' EXIT
if ! curl -sf --unix-socket /var/run/docker.sock http://localhost/_ping >/dev/null 2>&1; then
  dockerd --config-file "$cache/daemon.json" >"$cache/dockerd-bench.log" 2>&1 &
  started=$!
  for _ in $(seq 1 300); do curl -sf --unix-socket /var/run/docker.sock http://localhost/_ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
docker image inspect airlock-test:bookworm >/dev/null 2>&1 || docker load -q -i "$cache/image.tar" >/dev/null
image_id=$(docker image inspect airlock-test:bookworm --format '{{.Id}}')

cargo build --release --locked -q -p airlock-cli
airlock="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/airlock"

work="$(mktemp -d /tmp/airlock-bench.XXXXXX)"
chmod 755 "$work"  # the container runs as 65534 and reads /work/main.py
trap '[ -n "$started" ] && kill "$started" 2>/dev/null || true; rm -rf "$work"' EXIT
job='print(sum(range(10)))'
printf '%s\n' "$job" >"$work/main.py"
cat >"$work/policy.toml" <<TOML
version = "bench-1"
[filesystem]
rootfs = "image:airlock-test:bookworm@$image_id"
[audit]
path = "$work/audit.jsonl"
fsync = false
TOML
ref="--network none --read-only --tmpfs /tmp:rw,noexec,nosuid,size=16m --user 65534:65534 --cap-drop ALL --security-opt no-new-privileges --memory 256m --cpus 0.5 --pids-limit 64 -v $work:/work:ro -w /work"

hyperfine --warmup 3 --runs "$runs" --export-markdown "$work/results.md" --export-json "$work/results.json" \
  -n "docker run (reference flags)" "docker run --rm $ref $image_id python3 -I /work/main.py" \
  -n "airlock --backend docker" "$airlock run --backend docker --policy $work/policy.toml -c '$job'" \
  -n "docker run --runtime runsc" "docker run --rm --runtime runsc $ref $image_id python3 -I /work/main.py" \
  -n "airlock --backend gvisor" "$airlock run --backend gvisor --policy $work/policy.toml -c '$job'"
cat "$work/results.md"
python3 - "$work/results.json" <<'PY'
import json, sys
r = {x["command"]: x["mean"] for x in json.load(open(sys.argv[1]))["results"]}
for cli, ours in [("docker run (reference flags)", "airlock --backend docker"), ("docker run --runtime runsc", "airlock --backend gvisor")]:
    print(f"{ours}: {r[ours]*1000:.0f} ms vs {cli}: {r[cli]*1000:.0f} ms -> docker CLI / airlock = {r[cli]/r[ours]:.2f}x")
PY
docker ps -aq --filter label=airlock.managed | grep -q . && { echo "airlock containers left behind" >&2; exit 1; } || true
