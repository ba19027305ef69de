#!/usr/bin/env python3
"""A data job with and without [native] warm_preload, beside bare python3, in one run.

The job imports pandas and sums a three-row DataFrame. Rows:
  python3               `/usr/bin/python3 -I` on the host, the packages on sys.path: the baseline
  serve warm            `airlock serve` with `warm_pool`, the job's import paid in the job
  serve warm preload    the same with `warm_preload = ["numpy", "pandas"]`: each warm
                        interpreter imported them before the job arrived
  serve zygote preload  the same with `zygote = true`: one interpreter imported them once,
                        and each warm sandbox is forked from it (docs/speed.md)

Then the memory each waiting sandbox costs with the preload, warm and forked (the cgroup
it is charged to, and the PSS of its processes), and the zygote's own.

Jobs run one after another, each once a warm sandbox is ready (what an agent's turns see);
the figure is the median wall time of a request (HTTP on 127.0.0.1) or process, and the
ratio to python3. Standard library only. A benchmark, not a test: it asserts only that
every job printed the right answer.

Usage: pandas.py --airlock BIN --work DIR --pylib DIR [--runs N]
  --pylib: a package directory with numpy and pandas for /usr/bin/python3
  (scripts/ci/pylib.sh makes one).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import record_pool_memory  # noqa: E402

JOB = "import pandas\nprint(int(pandas.DataFrame({'a': [1, 2, 3]}).a.sum()))\n"
EXPECT = "6\n"
WARM_POOL = 4


def serve(airlock, work, name, preload, pylib, zygote):
    policy = os.path.join(work, f"{name}.toml")
    with open(policy, "w") as f:
        f.write(
            f'version = "bench-pandas"\n[limits]\nmemory = "1GiB"\ntimeout = "60s"\n'
            f"[filesystem]\nsite_packages = [{json.dumps(pylib)}]\n"
            f"[native]\nwarm_pool = {WARM_POOL}\nwarm_preload = {json.dumps(preload)}\n"
            f"zygote = {'true' if zygote else 'false'}\n"
            f'[audit]\npath = "{work}/audit-{name}.jsonl"\nfsync = false\n'
        )
    env = dict(os.environ, AIRLOCK_STATE_DIR=os.path.join(work, f"state-{name}"))
    proc = subprocess.Popen(
        [airlock, "serve", "--listen", "127.0.0.1:0", "--policy", policy],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=env,
    )
    for line in proc.stderr:
        found = re.search(r"listening on (http://[0-9.:]+)", line)
        if found:
            # Keep draining the log so the server never blocks on it.
            import threading
            threading.Thread(target=lambda: proc.stderr.read(), daemon=True).start()
            return proc, found.group(1)
    raise SystemExit(f"airlock serve ({name}) did not start")


def warm_ready(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    found = re.search(r"^airlock_warm_pool_ready (\S+)", text, re.M)
    return float(found.group(1)) if found else 0.0


def hits(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    found = re.search(r'^airlock_warm_pool_jobs_total\{result="hit"\} (\S+)', text, re.M)
    return float(found.group(1)) if found else 0.0


def forked_hits(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    found = re.search(r'^airlock_warm_pool_zygote_total\{result="hit"\} (\S+)', text, re.M)
    return float(found.group(1)) if found else 0.0


def run_http(url):
    body = json.dumps({"language": "python", "code": JOB}).encode()
    request = urllib.request.Request(url + "/v1/runs", body, {"content-type": "application/json"})
    started = time.perf_counter()
    answer = json.loads(urllib.request.urlopen(request, timeout=120).read())
    took = time.perf_counter() - started
    if answer.get("stdout") != EXPECT:
        raise SystemExit(f"the job did not print {EXPECT!r}: {answer}")
    return took


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--airlock", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--pylib", required=True)
    p.add_argument("--runs", type=int, default=15)
    args = p.parse_args()
    rows = {}

    script = os.path.join(args.work, "pandas_job.py")
    with open(script, "w") as f:
        f.write(f"import sys\nsys.path.append({args.pylib!r})\n{JOB}")
    times = []
    for _ in range(args.runs + 2):
        started = time.perf_counter()
        out = subprocess.run(["/usr/bin/python3", "-I", script], check=True,
                             capture_output=True, text=True).stdout
        times.append(time.perf_counter() - started)
        assert out == EXPECT, out
    rows["python3"] = times[2:]

    memory = {}
    for name, preload, zygote in [("serve warm", [], False),
                                  ("serve warm preload", ["numpy", "pandas"], False),
                                  ("serve zygote preload", ["numpy", "pandas"], True)]:
        proc, url = serve(args.airlock, args.work, name.replace(" ", "-"), preload, args.pylib,
                          zygote)
        try:
            if preload:
                deadline = time.monotonic() + 120
                while warm_ready(url) < WARM_POOL:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{name}: the warm pool never filled")
                    time.sleep(0.05)
                time.sleep(0.5)
                record_pool_memory(memory, name, proc.pid)
            times = []
            for _ in range(args.runs + 2):
                deadline = time.monotonic() + 120
                while warm_ready(url) < WARM_POOL:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{name}: the warm pool never filled")
                    time.sleep(0.05)
                before = hits(url)
                forked_before = forked_hits(url)
                times.append(run_http(url))
                if hits(url) != before + 1:
                    raise SystemExit(f"{name}: a job did not run warm")
                if zygote and forked_hits(url) != forked_before + 1:
                    raise SystemExit(f"{name}: a job did not run in a forked sandbox")
            rows[name] = times[2:]
        finally:
            proc.terminate()
            proc.wait(timeout=60)

    base = statistics.median(rows["python3"])
    print(f"\n### A pandas job, {args.runs} runs one after another (median)\n")
    print("| contender | ms | × python3 |")
    print("|:---|---:|---:|")
    for name, times in rows.items():
        median = statistics.median(times)
        print(f"| {name} | {median * 1000:.1f} | {median / base:.2f} |")
    if memory:
        print(f"\n| memory, {WARM_POOL} sandboxes waiting, with the preload | KiB |\n|:---|---:|")
        for key, value in memory.items():
            print(f"| {key} | {value} |")


if __name__ == "__main__":
    main()
