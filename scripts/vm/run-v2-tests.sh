#!/usr/bin/env bash
# Runs airlock's cgroup tests on a real cgroup v2 kernel: builds the test binaries, boots
# Debian's cloud kernel under qemu (TCG) with a pure cgroup v2 hierarchy (vm-run.sh), and
# runs there, as root, one process per test: every test of the airlock-cgroup integration
# binary, and the airlock-cli end-to-end tests of issue 3's "Done means" for v2. Prints the
# tests' output and exits 0 only when every one passed. See scripts/vm/README.md.
#
#   scripts/vm/run-v2-tests.sh [--target-dir DIR] [--no-build] [--shell-cmd CMD]
#                              [vm-run.sh options: --verbose --keep --timeout S ...]
#                              [-- CLI_TEST...]
#
#   --target-dir DIR  cargo's target directory (default: $CARGO_TARGET_DIR, else cargo
#                     metadata's); the tests find airlock there by its absolute path, so the
#                     guest gets the binaries at the same paths
#   --no-build        use the binaries already built in the target directory
#   --shell-cmd CMD   run CMD (sh) in the VM instead of the tests, with the same binaries
#                     and $AIRLOCK_BIN, $AIRLOCK_PROBE, $AIRLOCK_CLI_TESTS and
#                     $AIRLOCK_CGROUP_TESTS naming them (e.g. for rootless runs as `tester`)
#   CLI_TEST...       airlock-cli tests to run instead of the default list (exact names)
set -euo pipefail

script_dir=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$script_dir/../.." && pwd)

# The end-to-end tests of issue 3's "Done means" on a cgroup v2 host.
cli_tests=(
  suite::limits::allocating_a_gigabyte_ends_as_oom
  suite::limits::fork_bomb_is_held_at_the_pids_limit
  suite::limits::cpu_quota_is_applied
  suite::limits::double_forked_setsid_sleeper_is_gone_when_the_job_ends
  suite::limits::wall_time_kills_the_whole_tree
  suite::cleanup::two_hundred_jobs_leave_nothing_behind
  suite::probe::probe_sees_a_locked_down_sandbox
  suite::basics::readme_hello_job_prints_45
  suite::basics::on_cgroup_v2_the_sandbox_is_created_inside_its_cgroup
  suite::cold::the_sandbox_is_built_by_the_static_init_from_a_memfd_all_of_it_in_the_job_cgroup
  suite::cold::the_observation_is_printed_before_the_sandbox_is_removed_and_the_removal_still_ends
  suite::zygote::a_forked_job_is_held_by_its_own_cgroup
  suite::zygote::a_forked_job_runs_locked_down_in_namespaces_of_its_own
)

target_dir="${CARGO_TARGET_DIR:-}"
build=1
shell_cmd=""
vm_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --target-dir) target_dir=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --shell-cmd) shell_cmd=$2; shift 2 ;;
    --verbose|--keep) vm_args+=("$1"); shift ;;
    --timeout|--cpus|--memory|--with|--env) vm_args+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
    --) shift; cli_tests=("$@"); break ;;
    *) echo "run-v2-tests.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
log() { printf '==> %s\n' "$*" >&2; }
now() { date +%s.%N | cut -c1-14; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
started=$(now)

cd "$repo"
if [ -z "$target_dir" ]; then
  target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
fi
mkdir -p "$target_dir"
target_dir=$(cd "$target_dir" && pwd)
export CARGO_TARGET_DIR="$target_dir"
case "$target_dir/" in
  /tmp/*|/run/*|/dev/*)
    # The guest mounts its own tmpfs there (guest-init.sh), hiding the binaries.
    echo "run-v2-tests.sh: the target directory $target_dir is under /tmp, /run or /dev, which the VM mounts afresh; clone elsewhere or pass --target-dir" >&2
    exit 2 ;;
esac

# The test executables, from cargo's own report (their file names carry a hash). The same
# build as scripts/test.sh's `cargo nextest run --workspace --locked` (same packages, same
# features), so after it nothing is compiled again; it also builds airlock and the probe.
artifacts="$target_dir/vm-test-artifacts.json"
if [ "$build" = 1 ] || [ ! -s "$artifacts" ]; then
  cargo_args=(--locked --workspace --no-run --message-format=json-render-diagnostics)
  [ "$build" = 1 ] || cargo_args+=(--offline)
  log "building the workspace's test binaries in $target_dir"
  cargo test "${cargo_args[@]}" >"$artifacts.tmp"
  mv "$artifacts.tmp" "$artifacts"
fi
# Prints the executable of the target $2 of kind $3 (test: the test build; bin: the
# binary itself) of the package $1.
find_artifact() {
  python3 - "$artifacts" "$@" <<'PY'
import json, sys
path, package, name, kind = sys.argv[1:]
found = None
for line in open(path):
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    t = m["target"]
    # package_id: "path+file:///.../airlock-cli#0.1.0", ".../dir#airlock-cli@0.1.0" or,
    # before cargo 1.77, "airlock-cli 0.1.0 (path+file:///...)".
    pid = m["package_id"]
    ours = f"/{package}#" in pid or f"#{package}@" in pid or pid.startswith(f"{package} ")
    if ours and t["name"] == name and kind in t["kind"] and m["profile"]["test"] == (kind == "test"):
        found = m["executable"]
if not found:
    sys.exit(f"no {kind} {name} of {package} in {path}")
print(found)
PY
}
cli_bin=$(find_artifact airlock-cli all test)
cgroup_bin=$(find_artifact airlock-cgroup all test)
airlock_bin=$(find_artifact airlock-cli airlock bin)
probe_bin=$(find_artifact airlock-testkit airlock-probe bin)
for f in "$cli_bin" "$cgroup_bin" "$airlock_bin" "$probe_bin"; do
  [ -x "$f" ] || { echo "run-v2-tests.sh: $f is not built" >&2; exit 1; }
done
log "binaries ready in $(since "$started") s"

env_args=(
  --env "AIRLOCK_BIN=$airlock_bin"
  --env "AIRLOCK_PROBE=$probe_bin"
  --env "AIRLOCK_CLI_TESTS=$cli_bin"
  --env "AIRLOCK_CGROUP_TESTS=$cgroup_bin"
  --env "AIRLOCK_REQUIRE_ALL=1"
  --env "RUST_BACKTRACE=1"
)
with_args=(--with "$airlock_bin" --with "$probe_bin" --with "$cli_bin" --with "$cgroup_bin")

if [ -n "$shell_cmd" ]; then
  exec "$script_dir/vm-run.sh" "${with_args[@]}" "${env_args[@]}" "${vm_args[@]}" -- "$shell_cmd"
fi

# The guest side: one process per test (as nextest runs them), each timed; a summary line.
guest_script=$(cat <<EOF
cgroup_tests=\$("\$AIRLOCK_CGROUP_TESTS" --list --format terse | sed -n 's/: test\$//p')
cli_tests='${cli_tests[*]}'
EOF
)
guest_script+=$(cat <<'EOF'

passed=0 failed=0 failures=""
cd /tmp || exit 1
run_test() {
  bin=$1 name=$2
  echo "---- $name"
  t0=$(date +%s%N)
  { "$bin" --exact "$name" --test-threads=1 --color never --nocapture; echo $? >/tmp/test.rc; } 2>&1 \
    | tee /tmp/test.out
  rc=$(cat /tmp/test.rc)
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  # A name that matches no test runs nothing and exits 0: that is no pass.
  if [ "$rc" = 0 ] && ! grep -q '^test result: ok\. 1 passed' /tmp/test.out; then
    echo "no test named $name ran"
    rc=no-test
  fi
  if [ "$rc" = 0 ]; then
    passed=$((passed + 1)); echo "PASS $name (${ms} ms)"
  else
    failed=$((failed + 1)); failures="$failures $name"; echo "FAIL $name (${ms} ms, exit $rc)"
  fi
}
if [ -z "$cgroup_tests" ]; then
  failed=$((failed + 1)); failures="$failures (no-airlock-cgroup-tests-listed)"
fi
for t in $cgroup_tests; do run_test "$AIRLOCK_CGROUP_TESTS" "$t"; done
for t in $cli_tests; do run_test "$AIRLOCK_CLI_TESTS" "$t"; done
# Only airlock's own parent (ParentSpec::Auto in the root cgroup) may stay, and empty.
leftover=$(find /sys/fs/cgroup -mindepth 1 -type d ! -path /sys/fs/cgroup/airlock)
if [ -n "$leftover" ]; then
  echo "cgroups left behind after the tests:"; echo "$leftover"
  failed=$((failed + 1)); failures="$failures (cgroups-left-behind)"
fi
[ -z "$failures" ] || echo "failed:$failures"
echo "cgroup-v2: $passed passed, $failed failed"
[ "$failed" = 0 ]
EOF
)

set +e
"$script_dir/vm-run.sh" "${with_args[@]}" "${env_args[@]}" "${vm_args[@]}" -- "$guest_script"
status=$?
set -e
log "cgroup v2 VM tests: exit $status, $(since "$started") s in all"
exit "$status"
