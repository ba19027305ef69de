#!/usr/bin/env bash
# Prints the path of a package directory holding crates/airlock-server/tests/py/
# requirements-charts.txt (matplotlib, pandas and what they need) for the host's
# /usr/bin/python3, the interpreter native jobs run; installs it first when missing.
#
# It lives in the CI cache (AIRLOCK_CI_CACHE, default /var/cache/airlock-ci), keyed on the
# pins and the interpreter's version, and is a plain `pip install --target` directory: the
# sessions test names it in its policy's [filesystem] site_packages, so the minimal root
# copies it in and jobs import it through PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/../.."

cache="${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}"
requirements="crates/airlock-server/tests/py/requirements-charts.txt"
log() { printf '==> pylib.sh %s: %s\n' "$(date +%T)" "$*" >&2; }

if [ ! -x /usr/bin/python3 ]; then
  echo "scripts/ci/pylib.sh: no /usr/bin/python3, the interpreter native jobs run" >&2
  exit 1
fi
version="$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
key="$( { cat "$requirements"; echo "python $version"; } | sha256sum | cut -c1-16)"
dir="$cache/pylib-charts-$key"
mkdir -p "$cache"
(
  flock 9
  if [ ! -f "$dir/.airlock-complete" ]; then
    # Any pip will do: the wheels are chosen for /usr/bin/python3's version, not its own.
    pip=()
    if python3 -m pip --version >/dev/null 2>&1; then
      pip=(python3 -m pip)
    elif /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
      pip=(/usr/bin/python3 -m pip)
    else
      log "installing python3-pip"
      DEBIAN_FRONTEND=noninteractive apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null
      pip=(/usr/bin/python3 -m pip)
    fi
    log "installing $requirements for python $version into $dir"
    rm -rf "$dir.tmp"
    # --no-deps: the file pins every package; a missing one fails the imports, never
    # pulls an unpinned version.
    PIP_BREAK_SYSTEM_PACKAGES=1 "${pip[@]}" install -q --disable-pip-version-check \
      --no-deps --only-binary=:all: --python-version "$version" \
      --target "$dir.tmp" -r "$requirements" >&2
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
    touch "$dir/.airlock-complete"
  fi
  touch "$dir/.airlock-used"
  find "$cache" -maxdepth 2 -path "$cache/pylib-charts-*/.airlock-used" -mtime +7 -printf '%h\n' |
    while read -r stale; do [ "$stale" = "$dir" ] || { log "removing unused $stale"; rm -rf "$stale"; }; done
) 9>"$cache/.pylib-charts.lock"
echo "$dir"
