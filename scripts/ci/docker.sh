#!/usr/bin/env bash
# The conformance suite against every backend: native, docker (runc), gvisor (runsc),
# podman. As root on Debian 12. Installs Docker, gVisor and Podman from Debian, registers
# runsc as a Docker runtime, starts dockerd and `podman system service` only if none is
# running (and stops only what it started, by pid), builds a small Python image with
# debootstrap (no registry needed; cached in AIRLOCK_CI_CACHE), runs the suite with
# AIRLOCK_REQUIRE_ALL=1, and checks that no container of airlock is left.
#
# Idempotent: a second run reuses the packages, the cached image and running daemons.
set -euo pipefail
cd "$(dirname "$0")/../.."

cache="${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}"
state="$cache/docker"
mkdir -p "$state"
t0=$(date +%s)
declare -a timings=()
step_start=$t0
log() { printf '==> %s\n' "$*" >&2; }
lap() { local now; now=$(date +%s); timings+=("$1: $((now - step_start)) s"); step_start=$now; }

if [ "$(id -u)" != 0 ]; then
  echo "scripts/ci/docker.sh: run as root (it starts dockerd and mounts /out tmpfs)" >&2
  exit 1
fi

# 1. Packages. docker.io brings containerd, runc and tini; podman brings conmon and crun.
need=()
for pair in dockerd:docker.io runsc:runsc podman:podman debootstrap:debootstrap python3:python3 curl:curl; do
  command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
lap packages

# 2. Daemons: start each only if none answers; remember what we started.
started_pids=()
cleanup() {
  local pid
  for pid in "${started_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${started_pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
}
trap cleanup EXIT

wait_for() { # SOCKET WHAT
  for _ in $(seq 1 300); do
    if curl -sf --unix-socket "$1" http://localhost/_ping >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "$2 did not answer on $1" >&2
  return 1
}

docker_sock=/var/run/docker.sock
# The daemon's runtimes (scripts/ci/dockerd.json, shared with images.sh and kube.sh): runsc
# with no network stack of its own (the container has none), the default platform (kvm
# hangs on this kind of host), and the OCI seccomp profile loaded inside the sandbox
# (without it the job would run with no seccomp filter). For the suite's
# container-fails-to-start check, runtimes that fail when a container starts:
# airlock-broken (/bin/false, for --backend docker) and airlock-broken-runsc (runsc asked
# for a platform that does not exist, for --backend gvisor).
daemon_json="$PWD/scripts/ci/dockerd.json"
if curl -sf --unix-socket "$docker_sock" http://localhost/_ping >/dev/null 2>&1; then
  log "dockerd already running; using it"
  runtimes=$(docker info --format '{{json .Runtimes}}')
  for runtime in runsc airlock-broken airlock-broken-runsc; do
    if ! grep -q "\"$runtime\"" <<<"$runtimes"; then
      echo "the running dockerd has no $runtime runtime; add to its daemon.json: $(cat "$daemon_json")" >&2
    fi
  done
else
  log "starting dockerd"
  dockerd --config-file "$daemon_json" >"$state/dockerd.log" 2>&1 &
  started_pids+=($!)
  wait_for "$docker_sock" dockerd
fi
podman_sock=/run/podman/podman.sock
if curl -sf --unix-socket "$podman_sock" http://localhost/_ping >/dev/null 2>&1; then
  log "podman service already running; using it"
else
  log "starting podman system service"
  mkdir -p /run/podman
  # From a scratch directory: conmon writes a file named `oom` into its working directory
  # when a container is OOM-killed (the suite's OOM check does that), which would otherwise
  # land in the clone.
  (cd "$state" && exec podman system service --time=0 "unix://$podman_sock") >"$state/podman.log" 2>&1 &
  started_pids+=($!)
  wait_for "$podman_sock" "podman system service"
fi
# A second Podman service whose default runtime fails when a container starts (/bin/false),
# for the suite's container-fails-to-start check: Podman's Docker-compatible API ignores the
# runtime a request names, so only a service's default can be broken. Only this service
# reads the file (CONTAINERS_CONF): the distribution's containers.conf plus that runtime.
podman_broken_sock=/run/podman/airlock-broken.sock
if curl -sf --unix-socket "$podman_broken_sock" http://localhost/_ping >/dev/null 2>&1; then
  log "broken podman service already running; using it"
else
  podman_conf="$state/containers-broken.conf"
  sed -e 's|^\[engine\.runtimes\]$|&\nairlock-broken = ["/bin/false"]|' \
    -e 's|^\[engine\]$|&\nruntime = "airlock-broken"|' \
    /usr/share/containers/containers.conf >"$podman_conf"
  [ "$(grep -c '^airlock-broken = \|^runtime = "airlock-broken"' "$podman_conf")" = 2 ] \
    || { echo "no [engine] and [engine.runtimes] tables in /usr/share/containers/containers.conf" >&2; exit 1; }
  log "starting a podman system service with a broken default runtime"
  (cd "$state" && CONTAINERS_CONF="$podman_conf" \
    exec podman system service --time=0 "unix://$podman_broken_sock") >"$state/podman-broken.log" 2>&1 &
  started_pids+=($!)
  wait_for "$podman_broken_sock" "the broken podman system service"
fi
lap daemons

# 3. The test image: a debootstrap minbase with python3 and curl, trimmed (no /var, /home,
# /root, shadow files: nothing a job should see), imported once and saved as an image
# archive, which loads with the same id into Docker and Podman on every later run.
image_ref=airlock-test:bookworm
archive="$state/image.tar"
# python3 (with its standard library: urllib, json, re) and curl, for the proxy-mode tests.
packages=python3,curl
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
podman image exists "$image_ref" || podman load -q -i "$archive" >/dev/null
image_id=$(docker image inspect "$image_ref" --format '{{.Id}}')
podman_id="sha256:$(podman image inspect "$image_ref" --format '{{.Id}}')"
if [ "$image_id" != "$podman_id" ]; then
  echo "docker has $image_ref as $image_id, podman as $podman_id; reloading podman's" >&2
  podman rmi -f "$image_ref" >/dev/null
  podman load -q -i "$archive" >/dev/null
fi
export AIRLOCK_TEST_IMAGE="$image_ref@$image_id"
log "test image $AIRLOCK_TEST_IMAGE"
lap image

# 4. The native backend's dir: rootfs tests want a minbase tree; the suite needs only the
# image and the host. Build and run the suite for every backend.
export AIRLOCK_REQUIRE_ALL=1
export AIRLOCK_DOCKER_SOCKET="$docker_sock" AIRLOCK_PODMAN_SOCKET="$podman_sock"
export AIRLOCK_PODMAN_BROKEN_SOCKET="$podman_broken_sock"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
log "building airlock, the probe and the conformance suite"
cargo build --locked -q -p airlock-cli -p airlock-testkit --bins
cargo nextest run --locked --no-run -p airlock-conformance >/dev/null 2>&1 \
  || cargo nextest run --locked --no-run -p airlock-conformance
lap build
status=0
for backend in native warm docker gvisor podman; do
  log "conformance suite: $backend"
  b0=$(date +%s)
  cargo nextest run --locked -p airlock-conformance -E "test(/::$backend::/)" \
    --no-fail-fast --test-threads "${AIRLOCK_CONFORMANCE_THREADS:-4}" || status=1
  timings+=("suite $backend: $(( $(date +%s) - b0 )) s")
done
step_start=$(date +%s)

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
log "conformance passed on native, native warm (airlock run --warm), docker, gvisor and podman"
