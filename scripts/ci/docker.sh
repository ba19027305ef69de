#!/usr/bin/env bash
# The conformance suite against every backend: native, docker (runc), gvisor (runsc),
# podman (runc), and each one's warm path (a job delivered to a sandbox or container
# started before it: native warm, zygote (native, forked from a zygote), warm_docker,
# warm_gvisor, warm_podman), then the warm
# containers through `airlock serve` (airlock-server's tests that need the engines). As
# root on Debian 12. Installs Docker, gVisor and Podman from Debian,
# starts a dockerd and `podman system service`s of its own, on their own sockets with
# their own configuration (scripts/ci/engines.sh: whatever daemon the host runs is neither
# used nor touched), builds a small Python image with debootstrap (no registry needed;
# cached in AIRLOCK_CI_CACHE), runs the suite with AIRLOCK_REQUIRE_ALL=1, checks that no
# container of airlock is left, and stops the daemons it started.
#
# Idempotent: a second run reuses the packages, the cached image and the daemons' image
# stores (under AIRLOCK_CI_CACHE).
set -euo pipefail
cd "$(dirname "$0")/../.."

. scripts/ci/lib.sh
ci_begin docker.sh "it starts dockerd and mounts /out tmpfs"
state="$cache/docker"
mkdir -p "$state"

# 1. Packages. docker.io brings containerd, runc and tini; podman brings conmon (and crun
# or runc: the services below run runc whichever is installed).
need=()
for pair in dockerd:docker.io runc:runc runsc:runsc podman:podman debootstrap:debootstrap python3:python3 curl:curl node:nodejs; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
# The native backend's TLS checks (suite::tls) run the host's requests; every backend's pip
# check hands the job the host's pip wheel.
/usr/bin/python3 -c 'import requests' 2>/dev/null || need+=(python3-requests)
compgen -G '/usr/share/python-wheels/pip-*.whl' >/dev/null || need+=(python3-pip-whl)
ci_install "${need[@]}"
lap packages

# 2. Daemons: a dockerd and two Podman services of this run's own, on sockets of their own
# with configurations of their own (scripts/ci/engines.sh), whatever the host already runs.
# dockerd's runtimes (scripts/ci/dockerd.json, shared with images.sh and kube.sh): runsc
# with no network stack of its own (the container has none), the default platform (kvm
# hangs on this kind of host), and the OCI seccomp profile loaded inside the sandbox
# (without it the job would run with no seccomp filter). For the suite's
# container-fails-to-start check, runtimes that fail when a container starts:
# airlock-broken (/bin/false, for --backend docker) and airlock-broken-runsc (runsc asked
# for a platform that does not exist, for --backend gvisor); for --backend podman, a second
# service whose default runtime is /bin/false.
# shellcheck source=scripts/ci/engines.sh
. scripts/ci/engines.sh
trap ci_engines_stop EXIT
ci_dockerd_up
ci_podman_up
docker_sock=$ci_docker_sock
podman_sock=$ci_podman_sock
lap daemons

# 3. The test image: a debootstrap minbase with python3, curl, requests and node, trimmed (no /var, /home,
# /root, shadow files: nothing a job should see), imported once and saved as an image
# archive, which loads with the same id into Docker and Podman on every later run.
image_ref=airlock-test:bookworm
archive="$state/image.tar"
# python3 (with its standard library: urllib, json, re) and curl, for the proxy-mode tests;
# ca-certificates, requests and node for the TLS interception tests (suite::tls: the job's
# clients trust its CA bundle; pip comes from the host as an input file).
packages=python3,curl,ca-certificates,python3-requests,nodejs
if [ "$(cat "$state/packages" 2>/dev/null)" != "$packages" ]; then
  rm -f "$state/rootfs.tar" "$archive"
fi
if [ ! -s "$archive" ]; then
  rootfs="$state/rootfs"
  if [ ! -s "$state/rootfs.tar" ]; then
    log "building the test rootfs with debootstrap (about 40 s)"
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" \
      http://deb.debian.org/debian >"$state/debootstrap.log" 2>&1 \
      || { tail -20 "$state/debootstrap.log" >&2; exit 1; }
    rm -rf "$rootfs"/{var,run,root,home,srv,opt,mnt,media,boot} "$rootfs"/etc/{shadow,gshadow}* \
      "$rootfs"/usr/share/{doc,man,locale,info}
    tar --numeric-owner -C "$rootfs" -c . >"$state/rootfs.tar.tmp"
    mv "$state/rootfs.tar.tmp" "$state/rootfs.tar"
    echo "$packages" >"$state/packages"
    rm -rf "$rootfs"
  fi
  log "importing the test image"
  docker image rm -f "$image_ref" >/dev/null 2>&1 || true
  docker import -c 'ENV PATH=/usr/local/bin:/usr/bin:/bin' "$state/rootfs.tar" "$image_ref" >/dev/null
  docker save "$image_ref" -o "$archive.tmp"
  mv "$archive.tmp" "$archive"
fi
docker image inspect "$image_ref" >/dev/null 2>&1 || docker load -q -i "$archive" >/dev/null
ci_podman image exists "$image_ref" || ci_podman load -q -i "$archive" >/dev/null
image_id=$(docker image inspect "$image_ref" --format '{{.Id}}')
podman_id="sha256:$(ci_podman image inspect "$image_ref" --format '{{.Id}}')"
if [ "$image_id" != "$podman_id" ]; then
  echo "docker has $image_ref as $image_id, podman as $podman_id; reloading podman's" >&2
  ci_podman rmi -f "$image_ref" >/dev/null
  ci_podman load -q -i "$archive" >/dev/null
fi
export AIRLOCK_TEST_IMAGE="$image_ref@$image_id"
log "test image $AIRLOCK_TEST_IMAGE"
lap image

# 4. The native backend's dir: rootfs tests want a minbase tree; the suite needs only the
# image and the host. Build and run the suite for every backend.
# (AIRLOCK_DOCKER_SOCKET, AIRLOCK_PODMAN_SOCKET and AIRLOCK_PODMAN_BROKEN_SOCKET name the
# daemons above.)
export AIRLOCK_REQUIRE_ALL=1
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
log "building airlock, the probe, the conformance suite and the server's tests"
cargo build --locked -q -p airlock-cli -p airlock-testkit --bins
cargo nextest run --locked --no-run -p airlock-conformance -p airlock-server >/dev/null 2>&1 \
  || cargo nextest run --locked --no-run -p airlock-conformance -p airlock-server
lap build
status=0
for backend in native warm zygote docker gvisor podman warm_docker warm_gvisor warm_podman; do
  log "conformance suite: $backend"
  b0=$(date +%s)
  cargo nextest run --locked -p airlock-conformance -E "test(/::$backend::/)" \
    --no-fail-fast --test-threads "${AIRLOCK_CONFORMANCE_THREADS:-4}" || status=1
  timings+=("suite $backend: $(( $(date +%s) - b0 )) s")
done
step_start=$(date +%s)

# Warm containers through a real `airlock serve` on each engine: the same view as a
# fresh container's, one job per container, the CPU share, replacement, shutdown and the
# sweep of a killed server's (ignored in a plain `cargo nextest run`: they need the
# engines above).
log "warm containers through airlock serve"
cargo nextest run --locked -p airlock-server --run-ignored only -E 'test(/::warm_containers::/)' \
  --no-fail-fast --test-threads 2 || status=1
lap "warm containers (server)"

# 5. Nothing of airlock's is left in either daemon.
for sock in "$docker_sock" "$podman_sock"; do
  left=$(DOCKER_HOST="unix://$sock" docker ps -aq --filter label=airlock.managed)
  if [ -n "$left" ]; then
    echo "containers of airlock left behind on $sock:" >&2
    DOCKER_HOST="unix://$sock" docker ps -a --filter label=airlock.managed >&2
    status=1
  fi
done
lap "leak check"

log "timings (total $(( $(date +%s) - t0 )) s):"
printf '    %s\n' "${timings[@]}" >&2
if [ "$status" != 0 ]; then
  log "conformance FAILED"
  exit 1
fi
log "conformance passed on native (fresh, warm with airlock run --warm, and forked from a zygote), docker, gvisor and podman (cold and warm), and warm containers through airlock serve"
