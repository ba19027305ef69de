#!/bin/sh
# Runs in the cgroup v2 VM as root (scripts/test.sh passes it to run-v2-tests.sh): airlock
# started by an unprivileged user inside a delegated cgroup v2 subtree, laid out as systemd
# lays out user@1000.service, each run alone in a scope as `systemd-run --user --scope -p
# Delegate=yes airlock ...` would put it. Issue 3: with a delegated subtree the limits hold
# as for root, and nothing is degraded.
set -eu
d=/sys/fs/cgroup/user-1000
mkdir "$d"
chown tester:tester "$d" "$d/cgroup.procs" "$d/cgroup.threads" "$d/cgroup.subtree_control"
mkdir "$d/login"
chown tester:tester "$d/login" "$d/login/cgroup.procs"
mkdir -p /run/user/1000
chown tester:tester /run/user/1000
echo $$ > "$d/login/cgroup.procs"

cat > /tmp/rootless-run.sh <<'EOF'
set -eu
# Each airlock alone in a new scope of the delegated subtree (`run N ARGS...`; pipelines
# run it in a subshell, so the scope number is an argument, not a counter).
run() {
  scope=/sys/fs/cgroup/user-1000/scope-$1
  shift
  mkdir "$scope"
  sh -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$scope" "$AIRLOCK_BIN" run --json "$@"
}
check() {
  python3 -c 'import json, sys
d = json.load(sys.stdin)
ok = eval(sys.argv[1])
print(("ok:   " if ok else "FAIL: ") + sys.argv[2], file=sys.stderr)
if not ok:
    print(json.dumps(d, indent=1), file=sys.stderr)
    sys.exit(1)' "$1" "$2"
}
run 1 -c 'import os; print(sum(range(10)), os.getuid())' \
  | check 'd["ok"] and d["stdout"] == "45 65534\n" and "degraded" not in d' "hello job as tester, full shape"
run 2 -c 'b = bytearray(1 << 30)' \
  | check 'd["outcome"] == "oom" and d["peak_memory_bytes"] and "degraded" not in d' "1 GiB ends as oom (cgroup memory limit)"
run 3 --pids 16 --timeout 3s -c 'import os, time
n = 1
try:
    while n < 1000:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)' \
  | check 'd["stdout"] == "16 11\n"' "processes held at pids.max"
run 4 --timeout 2s -c 'while True: pass' \
  | check 'd["outcome"] == "timeout" and d["cpu_ms"] <= 1400' "CPU share and wall time"
# python3, not find: the guest has no findutils, and `find | wc -l` would count 0 anyway.
leftover=$(python3 -c 'import os
print(sum(len(dirs) for top, dirs, _ in os.walk("/sys/fs/cgroup/user-1000")
          if os.path.basename(top) == "jobs"))')
[ "$leftover" = 0 ] || { echo "FAIL: $leftover job groups left" >&2; exit 1; }
echo "rootless in a delegated cgroup v2 subtree: all checks passed" >&2
EOF
exec setpriv --reuid=tester --regid=tester --init-groups \
  env -i PATH=/usr/bin:/bin HOME=/home/tester XDG_RUNTIME_DIR=/run/user/1000 \
  AIRLOCK_STATE_DIR=/home/tester/state AIRLOCK_BIN="$AIRLOCK_BIN" sh /tmp/rootless-run.sh
