#!/usr/bin/env bash
# The Kubernetes backend's checks that need more than `cargo nextest run --workspace`:
#   1. the golden manifests (deploy/) validated by kubernetes-validate --strict against the
#      oldest supported Kubernetes (1.33), from a venv cached in AIRLOCK_CI_CACHE;
#   2. airlock-engine and airlock-cli built and linted with the `kube` feature, and the
#      binary's `airlock kube install` and `airlock doctor --backend kube` run against the
#      fake API server alone (no Docker; the library-level install, doctor and janitor
#      tests against it run in the workspace run);
#   3. the end-to-end tests through the fake cluster (a fake API server and a test kubelet
#      running each Pod as a real container on a Docker daemon of this run's own,
#      scripts/ci/engines.sh), the `airlock` binary included: run it after
#      scripts/ci/docker.sh, which builds the test image into that daemon's store
#      (AIRLOCK_TEST_IMAGE is derived from it when unset);
#   4. the conformance suite on `--backend kube` through the same fake cluster, run as a
#      process of its own (airlock-kube's example fake_cluster) for the suite's duration,
#      with airlock's seccomp profile installed on its "node" and the probe added to the
#      test image (a Pod's inputs are text: the probe cannot travel as an input file);
#   5. the real-cluster suite, when KUBECONFIG is set (docs/kube.md).
# As root (the fake kubelet writes Pod volumes under /run). Every test runs with
# AIRLOCK_REQUIRE_ALL=1: a missing requirement fails, it is never counted as passed.
set -euo pipefail
cd "$(dirname "$0")/../.."

. scripts/ci/lib.sh
ci_begin kube.sh "the fake kubelet writes Pod volumes under /run"
export AIRLOCK_REQUIRE_ALL=1
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

# 1. Golden manifests, strictly, for the oldest supported version.
kube_version=1.33.0
validate_version=1.37.0
venv="$cache/kube-validate-venv-$validate_version"
if [ ! -f "$venv/.airlock-complete" ]; then
  # Built in place (a venv's scripts name its own path) and marked complete last.
  log "installing kubernetes-validate $validate_version into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "kubernetes-validate==$validate_version"
  touch "$venv/.airlock-complete"
fi
log "kubernetes-validate --strict -k $kube_version deploy/"
"$venv/bin/kubernetes-validate" --strict --quiet -k "$kube_version" \
  deploy/namespace/airlock-jobs.yaml deploy/examples/job-pod.yaml \
  deploy/serve/namespace.yaml deploy/serve/serviceaccount.yaml deploy/serve/deployment.yaml \
  deploy/serve/service.yaml deploy/serve/networkpolicy.yaml
lap validate

# 2. The feature-gated code: built and linted with the feature on.
log "cargo clippy -p airlock-engine -p airlock-cli --features kube"
cargo clippy --locked --no-deps -p airlock-kube -p airlock-engine -p airlock-cli \
  --features airlock-engine/kube,airlock-cli/kube --all-targets -- -D warnings
cargo build --locked -p airlock-cli --features kube
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
# A copy of its own: any later build of airlock-cli without the feature (the probe's, or
# another script's) overwrites debug/airlock.
mkdir -p "$target_dir/kube"
cp "$target_dir/debug/airlock" "$target_dir/kube/airlock.tmp"
mv "$target_dir/kube/airlock.tmp" "$target_dir/kube/airlock"
export AIRLOCK_KUBE_BIN="$target_dir/kube/airlock"
"$AIRLOCK_KUBE_BIN" kube install --print | diff -u <(grep -v '^#' deploy/namespace/airlock-jobs.yaml) - \
  || { echo "airlock kube install --print differs from deploy/namespace/airlock-jobs.yaml" >&2; exit 1; }
log "airlock kube install and airlock doctor --backend kube against the fake API server"
cargo nextest run --locked -p airlock-kube --run-ignored only --no-fail-fast -E 'test(/::cli::/)'
lap "build with the kube feature"

# 3. End to end through the fake cluster on the local Docker daemon.
# This run's own dockerd (scripts/ci/engines.sh: its own socket, data root and
# configuration, docker.sh's image store), stopped at the end; a daemon the host runs is
# neither used nor touched.
# shellcheck source=scripts/ci/engines.sh
. scripts/ci/engines.sh
stop_dockerd() { ci_engines_stop; }
trap stop_dockerd EXIT
ci_dockerd_up
socket=$ci_docker_sock
if ! DOCKER_HOST="unix://$socket" docker image inspect airlock-test:bookworm >/dev/null 2>&1 \
  && [ -s "$cache/docker/image.tar" ]; then
  DOCKER_HOST="unix://$socket" docker load -q -i "$cache/docker/image.tar" >/dev/null
fi
if [ -z "${AIRLOCK_TEST_IMAGE:-}" ]; then
  id=$(DOCKER_HOST="unix://$socket" docker image inspect airlock-test:bookworm --format '{{.Id}}' 2>/dev/null || true)
  if [ -z "$id" ]; then
    echo "scripts/ci/kube.sh: no image airlock-test:bookworm: run scripts/ci/docker.sh first" >&2
    exit 1
  fi
  export AIRLOCK_TEST_IMAGE="airlock-test:bookworm@$id"
fi
# Containers of an earlier, interrupted run of these tests (only the fake kubelet uses the
# label) would fail the leak check below: remove them first, and say so.
stale=$(DOCKER_HOST="unix://$socket" docker ps -aq --filter label=airlock.kube-fake=true)
if [ -n "$stale" ]; then
  log "removing $(echo "$stale" | wc -l) container(s) an earlier run of the fake kubelet left"
  DOCKER_HOST="unix://$socket" docker rm -f $stale >/dev/null
fi
log "end to end through the fake cluster ($AIRLOCK_TEST_IMAGE)"
cargo nextest run --locked -p airlock-kube --run-ignored only --no-fail-fast -E 'test(/::e2e::/)'
left=$(DOCKER_HOST="unix://$socket" docker ps -aq --filter label=airlock.kube-fake=true)
if [ -n "$left" ]; then
  echo "containers of the fake kubelet left behind: $left" >&2
  exit 1
fi
lap "fake cluster"

# 4. The conformance suite on the kube backend, through the fake cluster as a process.
log "conformance suite: kube, through the fake cluster"
cargo build --locked -q -p airlock-kube --example fake_cluster
cargo build --locked -q -p airlock-testkit --bins
cargo nextest run --locked --no-run -p airlock-conformance >/dev/null 2>&1 \
  || cargo nextest run --locked --no-run -p airlock-conformance
# The probe in the test image, rebuilt only when the probe changes (its hash is a label).
probe="$target_dir/debug/airlock-probe"
probe_sum=$(sha256sum "$probe" | cut -d' ' -f1)
probe_ref=airlock-test-probe:bookworm
docker_() { DOCKER_HOST="unix://$socket" docker "$@"; }
probe_id=$(docker_ image inspect "$probe_ref" --format '{{index .Config.Labels "airlock.probe-sha256"}} {{.Id}}' 2>/dev/null || true)
base_id=${AIRLOCK_TEST_IMAGE##*@}
if [ "${probe_id%% *}" != "$probe_sum" ] || [ "$(docker_ image inspect "$probe_ref" --format '{{index .Config.Labels "airlock.base"}}' 2>/dev/null)" != "$base_id" ]; then
  log "adding the probe to the test image ($probe_ref)"
  # Labelled as the fake kubelet's, so an interrupted run's leftover is removed above.
  c=$(docker_ create --label airlock.kube-fake=true "$base_id" /bin/true)
  docker_ cp "$probe" "$c:/usr/local/bin/airlock-probe"
  docker_ commit --change "LABEL airlock.probe-sha256=$probe_sum" \
    --change "LABEL airlock.base=$base_id" "$c" "$probe_ref" >/dev/null
  docker_ rm -f "$c" >/dev/null
fi
probe_image="$probe_ref@$(docker_ image inspect "$probe_ref" --format '{{.Id}}')"
# airlock's seccomp filter on the fake node, as an admin installs it on every node; the
# suite's policy names it (seccomp_profile = "Localhost:airlock.json").
mkdir -p /run/airlock-kube-fake/seccomp
"$AIRLOCK_KUBE_BIN" kube seccomp-profile >/run/airlock-kube-fake/seccomp/airlock.json
run_dir=$(mktemp -d /tmp/airlock-kube-conformance.XXXXXX)
fake_pid=
stop_fake() {
  if [ -n "$fake_pid" ]; then
    kill -TERM "$fake_pid" 2>/dev/null || true
    wait "$fake_pid" 2>/dev/null || true
    fake_pid=
  fi
  cp "$run_dir/fake.log" "$cache/kube-fake-cluster.log" 2>/dev/null || true
  rm -rf "$run_dir"
}
trap 'stop_fake; stop_dockerd' EXIT
"$target_dir/debug/examples/fake_cluster" "$run_dir/kubeconfig" >"$run_dir/ready" 2>"$run_dir/fake.log" &
fake_pid=$!
for _ in $(seq 1 100); do
  grep -q '^ready ' "$run_dir/ready" 2>/dev/null && break
  kill -0 "$fake_pid" 2>/dev/null || { cat "$run_dir/fake.log" >&2; echo "the fake cluster exited" >&2; exit 1; }
  sleep 0.1
done
grep -q '^ready ' "$run_dir/ready" || { echo "the fake cluster did not get ready" >&2; exit 1; }
log "fake cluster $(cut -d' ' -f2 "$run_dir/ready") (pid $fake_pid), image $probe_image"
status=0
AIRLOCK_BIN="$AIRLOCK_KUBE_BIN" AIRLOCK_TEST_KUBECONFIG="$run_dir/kubeconfig" AIRLOCK_TEST_IMAGE="$probe_image" \
  AIRLOCK_DOCKER_SOCKET="$socket" \
  cargo nextest run --locked -p airlock-conformance -E 'test(/::kube::/)' --no-fail-fast \
  --test-threads "${AIRLOCK_CONFORMANCE_THREADS:-4}" || status=1
stop_fake
trap stop_dockerd EXIT
left=$(docker_ ps -aq --filter label=airlock.kube-fake=true)
if [ -n "$left" ]; then
  echo "containers of the fake kubelet left behind:" >&2
  docker_ ps -a --filter label=airlock.kube-fake=true >&2
  status=1
fi
if [ "$status" != 0 ]; then
  echo "conformance suite on kube FAILED (the fake cluster's log: $cache/kube-fake-cluster.log)" >&2
  exit 1
fi
lap "conformance on kube"

# 5. A real cluster, when one is configured.
if [ -n "${KUBECONFIG:-}" ]; then
  log "real-cluster suite (KUBECONFIG=$KUBECONFIG)"
  cargo nextest run --locked -p airlock-kube --run-ignored only --no-fail-fast -E 'test(/::cluster::/)'
  lap "real cluster"
else
  log "real-cluster suite: not run (KUBECONFIG is unset; docs/kube.md says how to run it)"
fi

log "kube checks passed in $(( $(date +%s) - t0 )) s: ${timings[*]}"
