#!/usr/bin/env bash
# Images end to end (issue 9), as root on Debian 12:
#   1. builds a Python image from a spec with two wheels from a local wheelhouse (pip
#      download of pinned pure-Python packages, hashed here), twice, to check that the
#      same inputs give the same digest;
#   2. loads it into Docker and runs the conformance suite with it on native (fresh, warm
#      and forked from a zygote), docker and gvisor (cold and warm containers),
#      and airlock-oci's tests (hostile archives, whiteouts, concurrency, the image from
#      inside jobs on native, docker and gvisor with one digest, doctor's age warning;
#      a stock Docker image, the `docker import` of the cached debootstrap tree, saved by
#      `docker save`, imported and built on as a base);
#   3. starts Debian's docker-registry on 127.0.0.1, pushes with skopeo, pulls by digest
#      (and refuses a tampered blob).
# Installs debootstrap, skopeo, docker-registry (and docker.io, runsc, python3-pip if
# missing); starts a dockerd of its own (scripts/ci/engines.sh; the host's daemon is
# neither used nor touched) and the registry, and stops only what it started, by pid. Downloads are cached in ${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}.
set -euo pipefail
cd "$(dirname "$0")/../.."

. scripts/ci/lib.sh
ci_begin images.sh "debootstrap, chroot, dockerd"
state="$cache/images"
mkdir -p "$state"

# 1. Packages.
need=()
for pair in debootstrap:debootstrap skopeo:skopeo docker-registry:docker-registry \
            dockerd:docker.io runsc:runsc curl:curl unshare:util-linux; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
# The conformance suite's pip check hands the job the host's pip wheel (suite::tls).
compgen -G '/usr/share/python-wheels/pip-*.whl' >/dev/null || need+=(python3-pip-whl)
ci_install "${need[@]}"
lap packages

# This run's own dockerd (scripts/ci/engines.sh: its own socket, data root and
# configuration, the runtimes of scripts/ci/dockerd.json that the conformance suite below
# needs); a daemon the host runs is neither used nor touched.
# shellcheck source=scripts/ci/engines.sh
. scripts/ci/engines.sh
work="$(mktemp -d /tmp/airlock-images.XXXXXX)"
chmod 755 "$work"
started_pids=()
cleanup() {
  local pid
  if ci_ping "$ci_docker_sock"; then
    docker image rm -f "$image_name" >/dev/null 2>&1 || true
    docker image rm -f "$docker_base" >/dev/null 2>&1 || true
  fi
  for pid in "${started_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${started_pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  ci_engines_stop
  rm -rf "$work"
}
image_name=airlock-oci-test/python:ci
docker_base=airlock-oci-test/debian-base:ci
trap cleanup EXIT

# 2. Daemons: the dockerd above (DOCKER_HOST for the docker CLI and airlock, and
# AIRLOCK_DOCKER_SOCKET for the tests, name it) and a registry of our own on 127.0.0.1,
# storage in the scratch directory.
ci_dockerd_up
registry_port="${AIRLOCK_CI_REGISTRY_PORT:-5077}"
registry="127.0.0.1:$registry_port"
mkdir -p "$work/registry"
cat >"$work/registry.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $work/registry
  delete:
    enabled: true
http:
  addr: $registry
YAML
docker-registry serve "$work/registry.yml" >"$work/registry.log" 2>&1 &
started_pids+=($!)
for _ in $(seq 1 100); do
  curl -sf "http://$registry/v2/" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://$registry/v2/" >/dev/null || { cat "$work/registry.log" >&2; exit 1; }
lap daemons

# 3. The wheelhouse: two small pure-Python packages at pinned versions, hashed here.
wheels="$state/wheelhouse"
if [ ! -f "$wheels/.complete" ]; then
  log "downloading the wheelhouse"
  rm -rf "$wheels"
  python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --no-deps \
    six==1.16.0 packaging==24.1 -d "$wheels"
  touch "$wheels/.complete"
fi
: >"$work/requirements.txt"
for w in "$wheels"/*.whl; do
  base=$(basename "$w")
  echo "$(echo "$base" | cut -d- -f1)==$(echo "$base" | cut -d- -f2) --hash=sha256:$(sha256sum "$w" | cut -d' ' -f1)" \
    >>"$work/requirements.txt"
done
cat >"$work/python.toml" <<EOF
name = "$image_name"
base = "debian:bookworm"
packages = ["python3", "curl", "ca-certificates", "python3-requests", "nodejs"]
[python]
wheelhouse = "$wheels"
requirements = "$work/requirements.txt"
[image]
# What the conformance suite wants hidden in a container's image (as scripts/ci/docker.sh
# trims its test image); python3 with its standard library and curl, for its proxy tests;
# requests and node for its TLS interception tests (suite::tls; pip comes from the host).
remove = ["var", "run", "root", "home", "srv", "opt", "mnt", "media", "boot"]
EOF
lap wheelhouse

# 4. Build airlock, then the image (debootstrap cached in $state), twice.
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
cargo build --locked -q -p airlock-cli -p airlock-testkit --bins
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
airlock="$target_dir/debug/airlock"
store="$work/store"
lap "build airlock"
log "airlock image build (first)"
id=$("$airlock" image --store "$store" build "$work/python.toml" --cache "$state" -o "$work/python.tar")
lap "image build"
log "airlock image build (again, same inputs)"
id2=$("$airlock" image --store "$store" build "$work/python.toml" --cache "$state" 2>"$work/rebuild.log") \
  || { cat "$work/rebuild.log" >&2; exit 1; }
cat "$work/rebuild.log" >&2
lap "image rebuild"
# The rebuild took its base from the cache (its progress names the file): the debootstrap
# tree with python3, curl, apt, a setuid su and /dev nodes, a stock Debian image below.
base_tar=$(sed -n 's/^==> \[ *[0-9.]*s\] base from cache //p' "$work/rebuild.log")
[ -f "$base_tar" ] || { echo "the rebuild's progress names no cached base: $work/rebuild.log" >&2; exit 1; }
if [ "$id" != "$id2" ]; then
  echo "the rebuild gave $id2, the first build $id: not deterministic" >&2
  exit 1
fi
log "image $image_name@$id (rebuilt with the same digest)"

# 5. Into Docker (same id there; `airlock image load` finds this run's dockerd by
# DOCKER_HOST, the built-in policy's docker_socket being empty), the registry (pushed with
# skopeo, pulled by digest).
loaded=$("$airlock" image --store "$store" load "$image_name" --backend docker)
[ "$loaded" = "$id" ] || { echo "docker has $loaded, the store $id" >&2; exit 1; }
[ "$(docker image inspect "$image_name" --format '{{.Id}}')" = "$id" ]
skopeo copy --quiet --dest-tls-verify=false "oci-archive:$work/python.tar" "docker://$registry/airlock-oci-test/python:ci"
manifest=$("$airlock" image --store "$store" inspect "$id" | python3 -c 'import json,sys; print(json.load(sys.stdin)["manifest"])')
pulled=$("$airlock" image --store "$work/pulled" pull --plain-http "$registry/airlock-oci-test/python@$manifest")
[ "$pulled" = "$id" ] || { echo "pulled $pulled, pushed $id" >&2; exit 1; }
log "pulled $registry/airlock-oci-test/python@$manifest as $pulled"
# A stock image made by the real engine, no registry needed: the debootstrap tree the
# build used, docker-imported and written by docker save (suite::e2e::docker imports it,
# and its skopeo OCI layout, and builds on it).
docker image rm -f "$docker_base" >/dev/null 2>&1 || true
docker import -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin' "$base_tar" "$docker_base" >/dev/null
docker save "$docker_base" -o "$work/debian-base.docker.tar"
lap "load, push, pull, docker save"

# 6. The tests.
export AIRLOCK_REQUIRE_ALL=1
export AIRLOCK_TEST_OCI_STORE="$store" AIRLOCK_TEST_OCI_IMAGE="$image_name@$id"
export AIRLOCK_TEST_OCI_BACKENDS=native,docker,gvisor
export AIRLOCK_TEST_REGISTRY="$registry" AIRLOCK_TEST_REGISTRY_STORAGE="$work/registry"
export AIRLOCK_TEST_OCI_SPEC="$work/python.toml"
export AIRLOCK_TEST_DOCKER_SAVE="$work/debian-base.docker.tar" AIRLOCK_TEST_DOCKER_SAVE_IMAGE="$docker_base"
status=0
log "airlock-oci tests"
cargo nextest run --locked -p airlock-oci --no-fail-fast || status=1
lap "airlock-oci tests"
export AIRLOCK_TEST_IMAGE="$image_name@$id"
# The native backend runs the same image from the store (AIRLOCK_TEST_OCI_STORE above).
export AIRLOCK_TEST_NATIVE_IMAGE="$image_name@$id"
for backend in native warm zygote docker gvisor warm_docker warm_gvisor; do
  log "conformance suite on $backend with $AIRLOCK_TEST_IMAGE"
  b0=$(date +%s)
  cargo nextest run --locked -p airlock-conformance -E "test(/::$backend::/)" --no-fail-fast \
    --test-threads "${AIRLOCK_CONFORMANCE_THREADS:-4}" || status=1
  timings+=("suite $backend: $(( $(date +%s) - b0 )) s")
done
step_start=$(date +%s)

log "timings (total $(( $(date +%s) - t0 )) s):"
printf '    %s\n' "${timings[@]}" >&2
if [ "$status" != 0 ]; then
  log "images FAILED"
  exit 1
fi
log "images passed: $image_name@$id on native (fresh, warm and forked), docker and gvisor (cold and warm); pull by digest from $registry"
