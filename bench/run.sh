#!/usr/bin/env bash
# airlock beside bare python3, bwrap, docker run and gVisor, on the same jobs, in one run
# (bench/bench.py says what each contender is). As root. A benchmark, not a test.
#
#   bench/run.sh                       everything this host has
#   bench/run.sh --runs 50 --jobs 80   more samples
#   bench/run.sh --only "airlock native,serve warm"   python3 plus the named contenders
#
# Uses the Docker daemon if one runs (DOCKER_HOST's, as the docker CLI does, else
# /var/run/docker.sock; it never starts or stops one), the Podman service at
# $AIRLOCK_PODMAN_SOCKET (default /run/podman/podman.sock), and the test image
# scripts/ci/docker.sh builds (airlock-test:bookworm); without them the container rows are
# listed as not run. Run it on a quiet machine: every figure is wall-clock time.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/ci/lib.sh
ci_begin bench/run.sh "the native sandbox's cgroups"
need=()
for pair in hyperfine:hyperfine bwrap:bubblewrap; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
ci_install "${need[@]}"
# The release build (AIRLOCK_BIN names another binary to measure).
ci_airlock_bin release
image=""
docker_sock=/var/run/docker.sock
case "${DOCKER_HOST:-}" in unix://*) docker_sock="${DOCKER_HOST#unix://}" ;; esac
if curl -sf --unix-socket "$docker_sock" http://localhost/_ping >/dev/null 2>&1; then
  id=$(docker image inspect airlock-test:bookworm --format '{{.Id}}' 2>/dev/null || true)
  [ -n "$id" ] && image="airlock-test:bookworm@$id"
fi
work="$(mktemp -d /tmp/airlock-bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT
python3 bench/bench.py --airlock "$AIRLOCK_BIN" --work "$work" --image "$image" "$@"
# The data job with and without [native] warm_preload (docs/speed.md), numpy and pandas from
# the pinned package directory the tests use.
pylib="$(scripts/ci/pylib.sh)"
python3 bench/pandas.py --airlock "$AIRLOCK_BIN" --work "$work" --pylib "$pylib"
# An HTTPS request through the egress proxy's TLS interception beside a plain tunnel
# (issue 16), timed inside one job.
python3 bench/tls.py --airlock "$AIRLOCK_BIN" --work "$work"
# Warm jobs with OpenTelemetry export on (to an accepting receiver on 127.0.0.1) beside
# off, alternating in one run: p50 and throughput, on over off (issue 33).
python3 bench/otel.py --airlock "$AIRLOCK_BIN" --work "$work"
python3 bench/fairness.py --airlock "$AIRLOCK_BIN" --work "$work"
# Time to interactive through E2B's Python SDK (issue 31), beside E2B's and Daytona's
# published medians.
bench/e2b.sh
if [ -n "$image" ] && docker ps -aq --filter label=airlock.managed | grep -q .; then
  echo "bench/run.sh: airlock containers left behind" >&2
  exit 1
fi
