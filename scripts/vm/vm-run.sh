#!/usr/bin/env bash
# Runs one shell command as root inside a cgroup v2 VM (Debian's cloud kernel under qemu
# TCG), prints its output and exits with its status. The guest root is a copy of this
# host's Python, coreutils and dash (merged /usr) plus the host paths given with --with,
# at the same absolute paths. Everything downloaded or built is cached in
# ${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}/vm. See scripts/vm/README.md.
#
#   scripts/vm/vm-run.sh [--with PATH]... [--env NAME=VALUE]... [--verbose] [--keep]
#                        [--timeout SECONDS] [--cpus N] [--memory MIB] [--] COMMAND
#
# Exit status: COMMAND's; 124 when the VM outlived the timeout; 125 when the guest
# reported nothing (a failed boot: the console log's path is printed).
set -euo pipefail

script_dir=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/vm/lib.sh
. "$script_dir/lib.sh"

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

VM_WITH=()
VM_ENV=()
VM_VERBOSE=0
keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --with) VM_WITH+=("$2"); shift 2 ;;
    --env) VM_ENV+=("$2"); shift 2 ;;
    --verbose) VM_VERBOSE=1; shift ;;
    --keep) keep=1; shift ;;
    --timeout) VM_TIMEOUT_S=$2; shift 2 ;;
    --cpus) VM_CPUS=$2; shift 2 ;;
    --memory) VM_MEMORY_MIB=$2; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "vm-run.sh: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -eq 1 ] || usage
command=$1

[ "$(id -u)" = 0 ] || vm_die "run as root (the image keeps the guest's root-owned files)"
vm_install_host_tools
mkdir -p "$VM_CACHE/runs"
started=$(vm_now)
{
  flock 9
  vm_ensure_kernel
  vm_ensure_base
} 9>"$VM_CACHE/lock"
vm_log "kernel and base tree ready in $(vm_since "$started") s"

run_dir=$(mktemp -d "$VM_CACHE/runs/run.XXXXXX")
if [ "$keep" = 1 ]; then
  vm_log "keeping $run_dir (image and console log)"
else
  trap 'rm -rf "$run_dir"' EXIT
fi
VM_TOKEN=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
{
  # Shared: another run may not rebuild (and prune) the base tree while it is copied.
  flock -s 9
  vm_build_image "$run_dir/root.img" "$command"
} 9>"$VM_CACHE/lock"
set +e
vm_boot "$run_dir/root.img" "$run_dir/console.log"
status=$?
set -e
if [ "$status" = 125 ] && [ "$keep" = 0 ]; then
  # Keep the evidence of a failed boot.
  cp "$run_dir/console.log" "$VM_CACHE/last-failed-console.log"
  echo "vm: console log copied to $VM_CACHE/last-failed-console.log" >&2
fi
vm_log "total $(vm_since "$started") s, guest status $status"
exit "$status"
