#!/usr/bin/env python3
"""Start `airlock serve` with a zygote pool, wait until full, send N jobs one after another
(each `gap` s after the last, pool full), print per job: client send/recv (CLOCK_MONOTONIC ns)
and the job's own last-line timestamp. Usage: drive.py AIRLOCK N GAP OUTJSON [--perf]"""
import http.client, json, os, re, subprocess, sys, threading, time, tempfile
airlock, n, gap, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
work = tempfile.mkdtemp(prefix="speed-drive.")
os.chmod(work, 0o755)
policy = os.path.join(work, "policy.toml")
open(policy, "w").write(f'version = "bench-1"\n[native]\nwarm_pool = 4\nzygote = true\n'
                        f'[audit]\npath = "{work}/audit.jsonl"\nfsync = false\n')
env = dict(os.environ, AIRLOCK_STATE_DIR=os.path.join(work, "state"),
           AIRLOCK_LOG=os.environ.get("AIRLOCK_LOG", "warn"))
logf = open(os.path.join(work, "server.log"), "w")
proc = subprocess.Popen([airlock, "serve", "--listen", "127.0.0.1:0", "--policy", policy,
                         "--queue", "1000"], stderr=subprocess.PIPE, text=True, env=env)
addr = None
for line in proc.stderr:
    logf.write(line)
    m = re.search(r"listening on http://([0-9.]+):(\d+)", line)
    if m:
        addr = (m.group(1), int(m.group(2)))
        break
def pump():
    for line in proc.stderr:
        logf.write(line)
threading.Thread(target=pump, daemon=True).start()
def metric(series):
    c = http.client.HTTPConnection(*addr, timeout=10)
    c.request("GET", "/metrics")
    for l in c.getresponse().read().decode().splitlines():
        if l.startswith(series + " "):
            return float(l.split()[1])
    return 0.0
def ready():
    while metric("airlock_warm_pool_ready") < 4:
        time.sleep(0.02)
code = "import time\nprint(sum(range(10)))\nprint(time.monotonic_ns())\n"
body = json.dumps({"language": "python", "code": code}).encode()
conn = http.client.HTTPConnection(*addr, timeout=60)
rows = []
print("server pid", proc.pid, file=sys.stderr)
for i in range(n + 3):
    ready()
    time.sleep(gap)
    t0 = time.monotonic_ns()
    conn.request("POST", "/v1/runs", body, {"Content-Type": "application/json"})
    r = conn.getresponse(); data = r.read()
    t1 = time.monotonic_ns()
    obs = json.loads(data)
    assert obs["ok"], data[:300]
    last = int(obs["stdout"].split()[1])
    if i >= 3:
        rows.append({"t0": t0, "t1": t1, "last": last, "job_id": obs.get("job_id") or obs.get("id")})
proc.terminate(); proc.wait(timeout=60)
json.dump(rows, open(out, "w"))
import statistics as st
tot = [ (r["t1"]-r["t0"])/1e6 for r in rows]
after = [ (r["t1"]-r["last"])/1e6 for r in rows]
before = [ (r["last"]-r["t0"])/1e6 for r in rows]
print(f"n={len(rows)} total median {st.median(tot):.2f} ms; send->last line {st.median(before):.2f}; last line->reply {st.median(after):.2f}")
print("server log:", os.path.join(work, "server.log"))
