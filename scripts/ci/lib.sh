# What the scripts under scripts/ci/ share, sourced by each after `cd` to the repo root:
#   . scripts/ci/lib.sh
#   ci_begin NAME.sh "why root"     log(), $cache, refuses to run but as root
#   make_venv NAME REQUIREMENTS [LOCK]
#                                   a cached venv keyed on its pins; prints its path
#   ci_airlock_bin [release]        AIRLOCK_BIN: the workspace build unless already set
# Not a script of its own: it defines functions and two variables, runs nothing.

# The cache outside the clone that every script keeps its downloads and venvs in.
cache="${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}"
# The pip every venv is brought to first (part of each venv's key).
PIP_VERSION="26.3"

# ci_begin NAME WHY: names the script in log lines, refuses a non-root run (saying WHY it
# needs root), and makes the cache directory.
ci_begin() {
  ci_name=$1
  if [ "$(id -u)" != 0 ]; then
    echo "$ci_name: run as root ($2)" >&2
    exit 1
  fi
  mkdir -p "$cache"
}

log() { printf '==> %s %s: %s\n' "${ci_name:-ci}" "$(date +%T)" "$*" >&2; }

# ci_python_venv_support: Debian's python3-venv, installed when `venv`/`ensurepip` are missing.
ci_python_venv_support() {
  if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    log "installing python3-venv"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  fi
}

# make_venv NAME REQUIREMENTS [LOCK]: the path of the venv $cache/venv-NAME-KEY holding
# REQUIREMENTS (constrained by LOCK when given), created when missing. KEY hashes the pins,
# the lock, the pip version and the interpreter, so a change of any builds a fresh venv;
# venvs unused for a week are removed. A lock file serialises concurrent runs.
# AIRLOCK_CI_RELOCK=1 installs without the lock and rewrites it (its comment lines kept).
make_venv() {
  local name=$1 requirements=$2 lock=${3:-}
  local key dir
  ci_python_venv_support
  key="$( { cat "$requirements" ${lock:+"$lock"}; echo "pip $PIP_VERSION"; python3 -VV; } | sha256sum | cut -c1-16)"
  dir="$cache/venv-$name-$key"
  (
    flock 9
    if { [ -n "${AIRLOCK_CI_RELOCK:-}" ] && [ -n "$lock" ]; } || [ ! -f "$dir/.airlock-complete" ]; then
      log "creating $dir from $requirements"
      rm -rf "$dir"
      python3 -m venv "$dir"
      "$dir/bin/pip" install -q --disable-pip-version-check "pip==$PIP_VERSION"
      if [ -z "$lock" ]; then
        "$dir/bin/pip" install -q --disable-pip-version-check -r "$requirements"
      elif [ -n "${AIRLOCK_CI_RELOCK:-}" ]; then
        "$dir/bin/pip" install -q --disable-pip-version-check -r "$requirements"
        { sed -n '/^#/p' "$lock"; "$dir/bin/pip" freeze --exclude-editable; } >"$lock.new"
        mv "$lock.new" "$lock"
        log "rewrote $lock (commit it; the next run keys the venv on it)"
      else
        "$dir/bin/pip" install -q --disable-pip-version-check -r "$requirements" -c "$lock"
      fi
      touch "$dir/.airlock-complete"
    fi
    touch "$dir/.airlock-used"
    find "$cache" -maxdepth 2 -path "$cache/venv-*/.airlock-used" -mtime +7 -printf '%h\n' |
      while read -r stale; do log "removing unused $stale"; rm -rf "$stale"; done
  ) 9>"$cache/.venv-$name.lock" >&2
  echo "$dir"
}

# ci_airlock_bin [release]: unless AIRLOCK_BIN names a binary, builds airlock-cli (a no-op
# when the build is current; `release` for the benchmarks' optimised build) and sets
# AIRLOCK_BIN to the workspace's debug/airlock or release/airlock (`cargo metadata`'s
# target directory, so CARGO_TARGET_DIR is honoured). Exported, absolute.
ci_airlock_bin() {
  if [ -z "${AIRLOCK_BIN:-}" ]; then
    local profile=debug flags=()
    if [ "${1:-}" = release ]; then
      profile=release flags=(--release)
    fi
    log "cargo build ${flags[*]} -p airlock-cli"
    cargo build -q "${flags[@]}" -p airlock-cli --locked
    local target_dir
    target_dir="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
    AIRLOCK_BIN="$target_dir/$profile/airlock"
  fi
  [ -x "$AIRLOCK_BIN" ] || { echo "no airlock binary at $AIRLOCK_BIN" >&2; exit 1; }
  AIRLOCK_BIN="$(realpath "$AIRLOCK_BIN")"
  export AIRLOCK_BIN
}

# ci_install PACKAGE...: installs the Debian packages named; none named, nothing to do.
ci_install() {
  [ $# -gt 0 ] || return 0
  log "installing $*"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# lap STEP: adds "STEP: N s" to `timings`, N the seconds since the previous lap (or since
# `step_start`, which a script may reset); `t0` is when the script sourced this file.
t0=$(date +%s)
step_start=$t0
timings=()
lap() {
  local now
  now=$(date +%s)
  timings+=("$1: $((now - step_start)) s")
  step_start=$now
}
