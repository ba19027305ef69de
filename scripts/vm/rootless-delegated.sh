#!/bin/sh
# Runs in the cgroup v2 VM as root (scripts/test.sh passes it to run-v2-tests.sh): airlock
# started by an unprivileged user inside a delegated cgroup v2 subtree, laid out as systemd
# lays out user@1000.service, each run alone in a scope as `systemd-run --user --scope -p
# Delegate=yes airlock ...` would put it. Issue 3: with a delegated subtree the limits hold
# as for root, nothing is degraded, and the probe sees the whole security shape.
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
# Jobs whose subject is not wall time get a timeout only a hung sandbox reaches: the VM
# emulates its CPU and runs them 20 to 60 times slower than a host.
mkdir -p "$HOME/state"
printf 'version = "vm-1"\n[limits]\ntimeout = "120s"\nstdout = "1MiB"\nfiles = "64MiB"\n' \
  >"$HOME/state/unhurried.toml"
unhurried="$HOME/state/unhurried.toml"
run 1 -c 'import os; print(sum(range(10)), os.getuid())' \
  | check 'd["ok"] and d["stdout"] == "45 65534\n" and "degraded" not in d' "hello job as tester, full shape"
run 2 --policy "$unhurried" -c 'b = bytearray(1 << 30)' \
  | check 'd["outcome"] == "oom" and d["peak_memory_bytes"] and "degraded" not in d' "1 GiB ends as oom (cgroup memory limit)"
run 3 --policy "$unhurried" --pids 16 -c 'import os, time
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
# Two spinners under a quarter CPU: CPU time over wall time near 0.25 (2 without the quota,
# at least 1 on a loaded host). The emulated CPU enforces the quota coarsely when the host
# is busy (0.65 seen with the host's two cores compiling), hence the wide upper bound.
run 4 --timeout 4s --cpus 0.25 -c 'import os
os.fork()
while True: pass' \
  | check 'd["outcome"] == "timeout" and 0.08 <= d["cpu_ms"] / d["duration_ms"] <= 0.8' "CPU share and wall time"
# The probe inside: the security shape of the native-sandbox issue, as this user.
run 5 --policy "$unhurried" --file "probe=$AIRLOCK_PROBE" -l sh -c 'exec /work/probe report' \
  | check 'd["ok"] and "degraded" not in d and (lambda r: r["identity"]["uid"] == 65534
      and r["identity"]["gid"] == 65534 and r["identity"]["hostname"] == "airlock"
      and all(r["status"][k] == 0 for k in ("cap_eff", "cap_prm", "cap_bnd", "cap_amb", "cap_inh"))
      and r["status"]["no_new_privs"] and r["status"]["seccomp"] == 2
      and r["network"]["interfaces"] == ["lo"]
      and all(r["writes"][p] == {"errno": "EROFS"} for p in ("/", "/work", "/usr", "/etc"))
      and "ok" in r["writes"]["/tmp"]
      and not any(r["paths"]["exists"][p] for p in ("/etc/shadow", "/root", "/home", "/var", "/run"))
      and all("errno" in r["syscalls"][c] for c in ("mount", "unshare_newuser", "setns",
          "ptrace_attach", "bpf", "keyctl", "io_uring_setup", "perf_event_open",
          "userfaultfd", "kexec_load", "init_module")))(json.loads(d["stdout"]))' \
    "probe: uid 65534, no capabilities, no_new_privs, seccomp, only lo, read-only root, no host files, dangerous calls refused"
# python3, not find: the guest has no findutils, and `find | wc -l` would count 0 anyway.
leftover=$(python3 -c 'import os
print(sum(len(dirs) for top, dirs, _ in os.walk("/sys/fs/cgroup/user-1000")
          if os.path.basename(top) == "jobs"))')
[ "$leftover" = 0 ] || { echo "FAIL: $leftover job groups left" >&2; exit 1; }
echo "rootless in a delegated cgroup v2 subtree: all checks passed" >&2
EOF
exec setpriv --reuid=tester --regid=tester --init-groups \
  env -i PATH=/usr/bin:/bin HOME=/home/tester XDG_RUNTIME_DIR=/run/user/1000 \
  AIRLOCK_STATE_DIR=/home/tester/state AIRLOCK_BIN="$AIRLOCK_BIN" AIRLOCK_PROBE="$AIRLOCK_PROBE" \
  sh /tmp/rootless-run.sh
