# The container engines the CI scripts test against, each an instance of their own with
# their own configuration. Sourced (not run) by docker.sh, images.sh and kube.sh, after
# `set -euo pipefail`, with $cache (AIRLOCK_CI_CACHE) set and log() defined.
#
# A host may already run dockerd or Podman with a configuration of its own (another
# daemon.json, crun as Podman's default runtime, the systemd cgroup manager, userns-remap):
# the tests must not inherit it, and must not disturb it. So nothing here talks to the
# default sockets (/var/run/docker.sock, /run/podman/podman.sock), reads the host's
# /etc/docker/daemon.json or /etc/containers/*.conf, or stops, restarts or reconfigures a
# daemon these scripts did not start:
#   - dockerd: its own socket, --data-root under the cache (images stay cached between
#     runs), --exec-root, --pidfile, containerd namespaces, and --config-file
#     scripts/ci/dockerd.json (runtimes runsc, airlock-broken, airlock-broken-runsc; the
#     cgroupfs driver; no bridge, no iptables or ip_forward changes: jobs have no network);
#   - Podman: `podman system service` on its own socket, with CONTAINERS_CONF and
#     CONTAINERS_STORAGE_CONF written here (the only files Podman then reads): runtime
#     runc by path, cgroupfs, its own storage under the cache, its own tmp dir, file locks
#     in it (the default shm segment is shared by every Podman of the host, and a fresh
#     tmp dir makes Podman free all its locks).
# Both are started when a script needs them and stopped, by the pid they were started
# with, when it exits. A daemon a killed earlier run left behind (its pidfile here names a
# live process whose command line names this instance's socket) is stopped and started
# afresh, so its configuration is the current one. Two runs at once would share these
# instances: an owner file makes the second fail at once instead.
#
# The scripts point the tests and the CLIs at the instances: AIRLOCK_DOCKER_SOCKET,
# AIRLOCK_PODMAN_SOCKET and AIRLOCK_PODMAN_BROKEN_SOCKET for the tests, DOCKER_HOST for
# the docker CLI and airlock itself, ci_podman (a function) for the podman CLI.

ci_run="${AIRLOCK_CI_RUN:-/run/airlock-ci}"
ci_docker_sock="$ci_run/docker.sock"
ci_podman_sock="$ci_run/podman.sock"
ci_podman_broken_sock="$ci_run/podman-broken.sock"
ci_engines_dir="$cache/engines"
ci_podman_conf="$ci_engines_dir/podman/containers.conf"
ci_podman_broken_conf="$ci_engines_dir/podman/containers-broken.conf"
ci_podman_storage_conf="$ci_engines_dir/podman/storage.conf"
# The pids this script started (each with its pidfile); ci_engines_stop ends these and
# nothing else.
ci_engine_pids=()
ci_engine_pidfiles=()
mkdir -p "$ci_run" "$ci_engines_dir"
chmod 711 "$ci_run"

# Whatever the caller's environment says about another daemon does not apply here.
unset DOCKER_CONTEXT DOCKER_TLS_VERIFY DOCKER_CERT_PATH CONTAINER_HOST CONTAINER_CONNECTION

# One run at a time per run directory: the owner file names the script's pid until
# ci_engines_stop. Not flock: every process the script starts would inherit the open lock,
# so a daemon or registry a killed run left behind would hold it for good.
ci_owner="$ci_run/engines.owner"
ci_owner_pid=$(cat "$ci_owner" 2>/dev/null || true)
if [ -n "$ci_owner_pid" ] && [ "$ci_owner_pid" != "$$" ] && [ -r "/proc/$ci_owner_pid/cmdline" ] \
  && tr '\0' ' ' <"/proc/$ci_owner_pid/cmdline" | grep -q 'scripts/ci/'; then
  echo "another run of the CI scripts (pid $ci_owner_pid: $(tr '\0' ' ' <"/proc/$ci_owner_pid/cmdline")) is using the engines of $ci_run; wait for it, or set AIRLOCK_CI_RUN to a directory of its own" >&2
  exit 1
fi
echo "$$" >"$ci_owner"

ci_ping() { curl -sf --max-time 5 --unix-socket "$1" http://localhost/_ping >/dev/null 2>&1; }

# ci_wait_for SOCKET PID LOG WHAT: until SOCKET answers (30 s), or PID has exited.
ci_wait_for() {
  local _
  for _ in $(seq 1 300); do
    ci_ping "$1" && return 0
    if ! kill -0 "$2" 2>/dev/null; then
      tail -20 "$3" >&2
      echo "$4 exited before it answered on $1 (its log: $3)" >&2
      return 1
    fi
    sleep 0.1
  done
  tail -20 "$3" >&2
  echo "$4 did not answer on $1 within 30 s (its log: $3)" >&2
  return 1
}

# ci_stop_pid PID: TERM, up to 30 s (dockerd stops its containers and containerd first),
# then KILL.
ci_stop_pid() {
  local _
  kill -TERM "$1" 2>/dev/null || return 0
  for _ in $(seq 1 300); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "pid $1 did not stop on SIGTERM within 30 s; killing it" >&2
  kill -KILL "$1" 2>/dev/null || true
}

# ci_leftover PIDFILE SOCKET: stops the process PIDFILE names if it is still alive and its
# command line names SOCKET (a daemon of an earlier run of these scripts, left behind when
# it was killed); anything else the pidfile might name now is left alone.
ci_leftover() {
  local pid
  pid=$(cat "$1" 2>/dev/null || true)
  if [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] \
    && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2"; then
    log "stopping pid $pid, left behind on $2 by an earlier run"
    ci_stop_pid "$pid"
  fi
  rm -f "$1"
  if ci_ping "$2"; then
    echo "something this script did not start answers on $2; stop it or set AIRLOCK_CI_RUN to another directory" >&2
    return 1
  fi
}

# ci_dockerd_up: this run's dockerd on $ci_docker_sock; exports DOCKER_HOST and
# AIRLOCK_DOCKER_SOCKET.
ci_dockerd_up() {
  local pidfile="$ci_run/dockerd.pid" log_file="$ci_engines_dir/dockerd.log" pid
  ci_leftover "$pidfile" "$ci_docker_sock"
  rm -f "$ci_docker_sock"
  mkdir -p "$ci_engines_dir/dockerd-root" "$ci_run/dockerd"
  log "starting dockerd on $ci_docker_sock (data root $ci_engines_dir/dockerd-root)"
  # --pidfile is dockerd's own (it refuses to start over a live one); the pid we stop is $!.
  dockerd --config-file "$PWD/scripts/ci/dockerd.json" \
    --host "unix://$ci_docker_sock" \
    --data-root "$ci_engines_dir/dockerd-root" \
    --exec-root "$ci_run/dockerd" \
    --pidfile "$pidfile" \
    --containerd-namespace airlock-ci \
    --containerd-plugins-namespace airlock-ci-plugins \
    >"$log_file" 2>&1 &
  pid=$!
  ci_engine_pids+=("$pid")
  ci_engine_pidfiles+=("$pidfile")
  ci_wait_for "$ci_docker_sock" "$pid" "$log_file" dockerd
  export DOCKER_HOST="unix://$ci_docker_sock" AIRLOCK_DOCKER_SOCKET="$ci_docker_sock"
}

# ci_podman ARGS...: the podman CLI on this run's storage and configuration.
ci_podman() {
  CONTAINERS_CONF="$ci_podman_conf" CONTAINERS_STORAGE_CONF="$ci_podman_storage_conf" podman "$@"
}

# ci_podman_confs: the storage.conf and the two containers.conf the services read.
ci_podman_confs() {
  local dir="$ci_engines_dir/podman" runc
  runc=$(command -v runc) || { echo "no runc on PATH (Debian's runc package)" >&2; return 1; }
  mkdir -p "$dir/storage" "$dir/networks" "$ci_run/podman"
  cat >"$ci_podman_storage_conf" <<EOF
# Written by scripts/ci/engines.sh: the CI's Podman storage, not the host's.
[storage]
driver = "overlay"
graphroot = "$dir/storage"
runroot = "$ci_run/podman/storage"
EOF
  # Both services share the storage and libpod's database, so every path is the same;
  # only the default runtime differs.
  local common
  common=$(cat <<EOF
# Written by scripts/ci/engines.sh: the only containers.conf this Podman reads
# (CONTAINERS_CONF), so the host's cannot change what the tests run.
[containers]
log_driver = "k8s-file"

[network]
network_config_dir = "$dir/networks"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$ci_run/podman/libpod"
lock_type = "file"
EOF
)
  {
    echo "$common"
    echo 'runtime = "runc"'
    echo
    echo '[engine.runtimes]'
    echo "runc = [\"$runc\"]"
  } >"$ci_podman_conf"
  # For the suite's container-fails-to-start check: Podman's Docker-compatible API ignores
  # the runtime a request names, so only a service's default can be broken.
  {
    echo "$common"
    echo 'runtime = "airlock-broken"'
    echo
    echo '[engine.runtimes]'
    echo "runc = [\"$runc\"]"
    echo 'airlock-broken = ["/bin/false"]'
  } >"$ci_podman_broken_conf"
}

# ci_podman_service SOCKET CONF NAME: a `podman system service` of this run.
ci_podman_service() {
  local sock=$1 conf=$2 name=$3 pidfile="$ci_run/$3.pid" log_file="$ci_engines_dir/$3.log" pid
  ci_leftover "$pidfile" "$sock"
  rm -f "$sock"
  log "starting $name (podman system service) on $sock"
  # From a scratch directory: conmon writes a file named `oom` into its working directory
  # when a container is OOM-killed (the suite's OOM check does that), which would otherwise
  # land in the clone.
  (cd "$ci_run/podman" && CONTAINERS_CONF="$conf" CONTAINERS_STORAGE_CONF="$ci_podman_storage_conf" \
    exec podman system service --time=0 "unix://$sock") >"$log_file" 2>&1 &
  pid=$!
  echo "$pid" >"$pidfile"
  ci_engine_pids+=("$pid")
  ci_engine_pidfiles+=("$pidfile")
  ci_wait_for "$sock" "$pid" "$log_file" "$name"
}

# ci_podman_up: this run's Podman service on $ci_podman_sock and the one whose default
# runtime fails on $ci_podman_broken_sock; exports AIRLOCK_PODMAN_SOCKET and
# AIRLOCK_PODMAN_BROKEN_SOCKET, and checks the service runs runc with cgroupfs.
ci_podman_up() {
  ci_podman_confs
  ci_podman_service "$ci_podman_sock" "$ci_podman_conf" podman
  ci_podman_service "$ci_podman_broken_sock" "$ci_podman_broken_conf" podman-broken
  local info
  info=$(curl -sf --unix-socket "$ci_podman_sock" http://localhost/v4.0.0/libpod/info)
  python3 - "$info" <<'PY'
import json, sys
host = json.loads(sys.argv[1])["host"]
runtime, manager = host["ociRuntime"]["name"], host["cgroupManager"]
if (runtime, manager) != ("runc", "cgroupfs"):
    sys.exit(f"the CI's Podman service runs {runtime} with {manager}, not runc with cgroupfs")
PY
  export AIRLOCK_PODMAN_SOCKET="$ci_podman_sock" AIRLOCK_PODMAN_BROKEN_SOCKET="$ci_podman_broken_sock"
}

# ci_engines_stop: ends what this script started (and only that), newest first.
ci_engines_stop() {
  local i
  for ((i = ${#ci_engine_pids[@]} - 1; i >= 0; i--)); do
    ci_stop_pid "${ci_engine_pids[$i]}"
    rm -f "${ci_engine_pidfiles[$i]}"
  done
  ci_engine_pids=()
  ci_engine_pidfiles=()
  if [ "$(cat "$ci_owner" 2>/dev/null)" = "$$" ]; then
    rm -f "$ci_owner"
  fi
}
