#!/usr/bin/env python3
"""Per-role CPU of forked jobs through `airlock serve` (zygote), by perf sampling every CPU.
Usage: cpu_roles.py AIRLOCK JOBS CLIENTS [JOB]
Prints ms of CPU per job by role: server, client (this driver), zygote, leader, mapper,
pid1, job, template (the zygote's helper/init), kernel workers, other."""
import http.client, json, os, re, subprocess, sys, threading, time, tempfile, collections
airlock, n_jobs, clients = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
job = sys.argv[4] if len(sys.argv) > 4 else "sum"
code = {"sum": "print(sum(range(10)))\n", "pass": "pass\n"}[job]
FREQ = 9999
work = tempfile.mkdtemp(prefix="speed-cpu.")
os.chmod(work, 0o755)
policy = os.path.join(work, "policy.toml")
open(policy, "w").write(f'version = "bench-1"\n[native]\nwarm_pool = 4\nzygote = true\n'
                        f'[audit]\npath = "{work}/audit.jsonl"\nfsync = false\n')
env = dict(os.environ, AIRLOCK_STATE_DIR=os.path.join(work, "state"), AIRLOCK_LOG="warn")
proc = subprocess.Popen([airlock, "serve", "--listen", "127.0.0.1:0", "--policy", policy,
                         "--queue", "1000"], stderr=subprocess.PIPE, text=True, env=env)
for line in proc.stderr:
    m = re.search(r"listening on http://([0-9.]+):(\d+)", line)
    if m:
        addr = (m.group(1), int(m.group(2))); break
threading.Thread(target=proc.stderr.read, daemon=True).start()
def metric(series):
    c = http.client.HTTPConnection(*addr, timeout=10)
    c.request("GET", "/metrics")
    for l in c.getresponse().read().decode().splitlines():
        if l.startswith(series + " "):
            return float(l.split()[1])
    return 0.0
while metric("airlock_warm_pool_ready") < 4:
    time.sleep(0.05)
time.sleep(0.5)
body = json.dumps({"language": "python", "code": code}).encode()
perf_data = os.path.join(work, "perf.data")
perf = subprocess.Popen(["perf", "record", "-q", "-a", "-F", str(FREQ), "-e", "cpu-clock",
                         "-o", perf_data], stderr=subprocess.DEVNULL)
time.sleep(1.0)
counter = iter(range(n_jobs)); lock = threading.Lock()
def worker():
    conn = http.client.HTTPConnection(*addr, timeout=60)
    while True:
        with lock:
            if next(counter, None) is None: return
        conn.request("POST", "/v1/runs", body, {"Content-Type": "application/json"})
        r = conn.getresponse(); d = r.read()
        assert json.loads(d)["ok"], d[:200]
t0 = time.monotonic()
ts = [threading.Thread(target=worker) for _ in range(clients)]
[t.start() for t in ts]; [t.join() for t in ts]
while metric("airlock_jobs_in_flight") > 0:
    time.sleep(0.002)
# let the pool refill: its forks are part of each job's cost
while metric("airlock_warm_pool_ready") < 4:
    time.sleep(0.01)
wall = time.monotonic() - t0
time.sleep(0.3)
perf.send_signal(2); perf.wait()
server = proc.pid
hits = metric('airlock_warm_pool_jobs_total{result="hit"}')
proc.terminate(); proc.wait(timeout=60)
out = subprocess.run(["perf", "script", "-i", perf_data, "--show-task-events", "-F", "comm,pid,tid"],
                     capture_output=True, text=True).stdout
parent = {}
comm_of = {}
samples = collections.Counter()
for line in out.splitlines():
    m = re.search(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)", line)
    if m:
        child, ctid, ppid, ptid = map(int, m.groups())
        if child == ctid and child not in parent:
            parent[child] = ppid
        elif child not in parent:
            parent[child] = ppid  # a thread: its pid is the process
        continue
    if "PERF_RECORD" in line:
        continue
    m = re.match(r"\s*(.*?)\s+(\d+)/(\d+)\s*$", line)
    if m:
        comm, pid, tid = m.group(1), int(m.group(2)), int(m.group(3))
        comm_of[pid] = comm
        samples[(pid, comm)] += 1
me = os.getpid()
def chain(pid):
    c = [pid]
    while pid in parent and len(c) < 64:
        pid = parent[pid]; c.append(pid)
    return c
# The zygote: the process below the server with the most children.
kids = collections.Counter(parent[p] for p in parent)
below_server = [p for p in kids if server in chain(p)[1:]]
zygotes = {p for p in below_server if kids[p] >= 3}
zygote = max(below_server, key=lambda p: kids[p]) if below_server else None
def role(pid, comm):
    if pid == 0:
        return "idle"
    if pid == server:
        return "server"
    if pid == me:
        return "client (driver)"
    c = chain(pid)
    z = next((q for q in c if q in zygotes), None)
    if z is not None:
        depth = c.index(z)
        if depth == 0: return "zygote"
        if depth == 1: return "leader"
        leader = c[depth - 1]
        if depth == 2:
            # mapper: the leader's first child; pid 1: its second
            siblings = sorted(p for p, q in parent.items() if q == leader)
            return "mapper" if len(siblings) > 1 and pid == siblings[0] else "pid 1"
        return "job"
    if server in c:
        return "template / other of the server"
    if comm.startswith("kworker") or comm.startswith("ksoftirq") or comm.startswith("rcu"):
        return "kernel workers"
    return "other (not airlock)"
by = collections.Counter()
for (pid, comm), k in samples.items():
    by[role(pid, comm)] += k
ms = 1000.0 / FREQ
print(f"{n_jobs} `{job}` jobs, {clients} in flight, wall {wall:.2f} s ({n_jobs/wall:.1f} jobs/s), pool hits {hits:.0f}; zygotes {sorted(zygotes)}")
print("| role | CPU ms per job |\n|:---|---:|")
tot = 0
for r in ["server", "client (driver)", "zygote", "leader", "mapper", "pid 1", "job", "template / other of the server", "kernel workers"]:
    v = by.get(r, 0) * ms / n_jobs
    tot += v
    print(f"| {r} | {v:.2f} |")
print(f"| **sum of the above** | **{tot:.2f}** |")
print(f"(not airlock: {by.get('other (not airlock)',0)*ms/n_jobs:.2f} ms per job; idle {by.get('idle',0)*ms/1000:.2f} s)")
