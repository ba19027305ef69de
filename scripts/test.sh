#!/usr/bin/env bash
# The whole test suite of airlock, on a fresh Debian 12 machine, as root.
#
# Installs and prepares what the tests need, caching downloads outside the clone
# (AIRLOCK_CI_CACHE, default /var/cache/airlock-ci), then runs every test of the
# workspace with cargo-nextest. Under AIRLOCK_REQUIRE_ALL=1 (set here) a test whose
# requirement is missing fails instead of being skipped: nothing is counted as passed
# that did not run. The container engines the tests need (dockerd, Podman) are started by
# scripts/ci/docker.sh, images.sh and kube.sh as instances of their own, with their own
# sockets, storage and configuration (scripts/ci/engines.sh): a daemon the host already
# runs, and its configuration, is neither used nor touched.
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}"
mkdir -p "$cache"
log() { printf '==> %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh: run as root: the native sandbox's tests create cgroups and user namespaces" >&2
  exit 1
fi

# A run on a fresh machine took 8.7 GiB of disk at its peak (the build, Debian packages,
# Docker's images, the VM's kernel and base tree, caches); with warm caches it takes less,
# but never under the floor below, the build alone. Short of it the run would fail much
# later with ENOSPC in the middle of a build: say so now.
min_free_gib="${AIRLOCK_CI_MIN_FREE_GIB:-4}"
for dir in . "$cache"; do
  free_gib=$(( $(df -Pk "$dir" | awk 'NR == 2 { print $4 }') / 1024 / 1024 ))
  if [ "$free_gib" -lt "$min_free_gib" ]; then
    echo "scripts/test.sh: only $free_gib GiB free on the filesystem of $(cd "$dir" && pwd);" \
      "the suite needs at least $min_free_gib (about 9 with empty caches)." \
      "Free some space (cargo clean in other checkouts, docker image prune) and run again;" \
      "AIRLOCK_CI_MIN_FREE_GIB changes the floor." >&2
    exit 1
  fi
done

# A clean clone gains nothing from incremental compilation, which would add about 1.7 GiB
# of session data to the target directory. The scripts below inherit this, so what they
# build reuses this build.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# The cgroup v2 VM mounts its own /tmp, /run and /dev, hiding a target directory there
# (scripts/vm/run-v2-tests.sh refuses one). A clone under them builds into the cache
# instead, one directory per clone path; the scripts below find it with `cargo metadata`.
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
  case "$(pwd)/" in
    /tmp/*|/run/*|/dev/*)
      CARGO_TARGET_DIR="$cache/target-$(pwd | sha256sum | cut -c1-16)"
      export CARGO_TARGET_DIR
      log "the clone is under /tmp, /run or /dev, which the cgroup v2 VM mounts afresh: building in $CARGO_TARGET_DIR" ;;
  esac
fi

# Debian packages the tests use.
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v python3 >/dev/null || need+=(python3)
command -v curl >/dev/null || need+=(curl)
# The node language test runs /usr/bin/node in the host rootfs (machines of this kind have
# it; Debian's nodejs where not).
[ -x /usr/bin/node ] || need+=(nodejs)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

# A minimal Debian rootfs for the dir: rootfs tests (about 30 s the first time).
rootfs="$cache/rootfs-bookworm"
if [ ! -f "$rootfs/.airlock-complete" ]; then
  log "building a minbase rootfs in $rootfs with debootstrap"
  rm -rf "$rootfs.tmp"
  debootstrap --variant=minbase bookworm "$rootfs.tmp" http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
  rm -rf "$rootfs"
  mv "$rootfs.tmp" "$rootfs"
  touch "$rootfs/.airlock-complete"
fi
export AIRLOCK_TEST_ROOTFS="$rootfs"

# matplotlib and pandas for /usr/bin/python3, for the sessions' charts-and-tables test
# (pinned, cached; about 250 MiB and 15 s the first time).
log "python packages for the charts test (scripts/ci/pylib.sh)"
AIRLOCK_TEST_PYLIB="$(scripts/ci/pylib.sh)"
export AIRLOCK_TEST_PYLIB

export AIRLOCK_REQUIRE_ALL=1
export AIRLOCK_SKIP_LOG="$cache/skipped.txt"
rm -f "$AIRLOCK_SKIP_LOG"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
log "crate graph: no backend depends on another"
scripts/ci/crate-graph.sh
log "cargo nextest run --workspace (as root)"
# The conformance suite runs per backend from scripts/ci/docker.sh, once the daemons are up;
# airlock-oci's image and registry tests from scripts/ci/images.sh, which builds the image
# and starts the registry they need.
cargo nextest run --workspace --locked --no-fail-fast \
  -E 'not test(/::rootless::/) and not package(airlock-conformance) and not (package(airlock-oci) and test(/^suite::(e2e|registry)::/))'

# The rootless tests, as an unprivileged user this script creates. The clone may live
# where that user cannot reach (/root), so the binaries they need are copied out.
log "rootless tests (as the unprivileged user airlock-ci)"
id airlock-ci >/dev/null 2>&1 || useradd --create-home --shell /usr/sbin/nologin airlock-ci
target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
e2e_bin="$(cargo test -p airlock-cli --locked --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for line in sys.stdin:
    d = json.loads(line)
    if d.get("reason") == "compiler-artifact" and d.get("executable") and d["target"]["name"] == "all":
        print(d["executable"])')"
rootless_dir="$(mktemp -d /tmp/airlock-rootless.XXXXXX)"
trap 'rm -rf "$rootless_dir"' EXIT
cp "$e2e_bin" "$rootless_dir/e2e"
cp "$target_dir/debug/airlock" "$target_dir/debug/airlock-probe" "$rootless_dir/"
chmod 755 "$rootless_dir" "$rootless_dir"/*
(cd "$rootless_dir" && runuser -u airlock-ci -- env -i PATH=/usr/local/bin:/usr/bin:/bin \
  HOME=/home/airlock-ci AIRLOCK_REQUIRE_ALL=1 AIRLOCK_BIN="$rootless_dir/airlock" \
  AIRLOCK_PROBE="$rootless_dir/airlock-probe" "$rootless_dir/e2e" ::rootless:: --test-threads=2)
log "cgroup v2 tests in a VM (scripts/vm/run-v2-tests.sh)"
./scripts/vm/run-v2-tests.sh
log "rootless airlock in a delegated cgroup v2 subtree, in the VM"
# From the cache: the guest mounts its own /tmp, where a clone may live.
cp scripts/vm/rootless-delegated.sh "$cache/vm-rootless-delegated.sh"
./scripts/vm/run-v2-tests.sh --no-build --with "$cache/vm-rootless-delegated.sh" \
  --shell-cmd "sh $cache/vm-rootless-delegated.sh"

log "conformance suite on every backend (scripts/ci/docker.sh)"
./scripts/ci/docker.sh

log "OCI images: build twice, load, registry push and pull, the suite on the image (scripts/ci/images.sh)"
./scripts/ci/images.sh
log "the code-interpreter-v1 image: built from its pinned wheels, a kernel session on it (scripts/ci/code-interpreter.sh)"
./scripts/ci/code-interpreter.sh

log "Kubernetes backend: golden manifests, the kube feature, the fake cluster (scripts/ci/kube.sh)"
./scripts/ci/kube.sh

log "E2B SDKs (Python pairs, Node) against a live airlock serve (scripts/ci/e2b.sh)"
./scripts/ci/e2b.sh

log "server: MCP client, OpenAPI validation, schemathesis (scripts/ci/server.sh)"
./scripts/ci/server.sh
log "OpenTelemetry: OTLP export received and decoded with opentelemetry-proto (scripts/ci/otel.sh)" && ./scripts/ci/otel.sh

./scripts/ci/js.sh  # the TypeScript package (js/): npm ci, lint, tsc --strict, tests with the AI SDK and MCP SDK, npm pack
log "Python package: the wheel with the binary, ruff, mypy --strict, pytest with the frameworks (python/ci.sh)"
./python/ci.sh
log "docs: every code block of README.md and docs/, run or checked (scripts/ci/docs.sh, after python/ci.sh: it uses that venv)" && ./scripts/ci/docs.sh

if [ -s "$AIRLOCK_SKIP_LOG" ]; then
  echo "skipped tests:" >&2
  cat "$AIRLOCK_SKIP_LOG" >&2
  exit 1
fi
log "all tests passed"
