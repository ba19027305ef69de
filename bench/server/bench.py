#!/usr/bin/env python3
"""Requests per second and p50/p99 latency of a trivial job through `airlock serve`
(POST /v1/runs over keep-alive connections) and through the bare CLI (`airlock run
--json`, one process per job), at 1, 2 and 8 concurrent clients. Standard library only.

Usage: bench.py AIRLOCK_BIN [--jobs N] [--levels 1,2,8] [--max-in-flight N]
Prints a Markdown table. A benchmark, not a test: it asserts only that every job ran.
"""
import argparse
import http.client
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

CODE = "pass"  # the trivial job: start python3 in a fresh sandbox, do nothing, exit 0


def percentile(values, p):
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))
    return values[k]


def run_level(n_jobs, clients, one_job):
    """Runs n_jobs with `clients` threads; returns (rps, latencies in ms)."""
    latencies = []
    lock = threading.Lock()
    counter = iter(range(n_jobs))
    errors = []

    def worker():
        state = {}
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            start = time.perf_counter()
            try:
                one_job(state)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(repr(e))
                state.clear()
                continue
            elapsed = (time.perf_counter() - start) * 1000
            with lock:
                latencies.append(elapsed)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    wall = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall
    if len(errors) > n_jobs // 20 or not latencies:
        raise SystemExit(f"{len(errors)} errors, {len(latencies)}/{n_jobs} done: {errors[:3]}")
    for e in errors:
        print(f"job failed (counted, not timed): {e}", file=sys.stderr)
    return len(latencies) / wall, latencies, len(errors)


def server_job(host, port):
    body = json.dumps({"language": "python", "code": CODE}).encode()

    def one(state):
        conn = state.get("conn")
        if conn is None:
            conn = state["conn"] = http.client.HTTPConnection(host, port, timeout=60)
        conn.request("POST", "/v1/runs", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        if response.status != 200 or not json.loads(data)["ok"]:
            raise RuntimeError(f"{response.status}: {data[:200]!r}")

    return one


def cli_job(airlock, env):
    def one(_state):
        out = subprocess.run([airlock, "run", "--json", "-c", CODE], capture_output=True, env=env, check=False)
        if out.returncode != 0 or not json.loads(out.stdout)["ok"]:
            raise RuntimeError(f"exit {out.returncode}: {out.stdout[-400:]!r} {out.stderr[-400:]!r}")

    return one


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("airlock")
    parser.add_argument("--jobs", type=int, default=100, help="jobs per level")
    parser.add_argument("--levels", default="1,2,8")
    parser.add_argument("--max-in-flight", type=int, default=os.cpu_count())
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    state = tempfile.mkdtemp(prefix="airlock-bench-")
    env = dict(os.environ, AIRLOCK_STATE_DIR=state)
    server = subprocess.Popen(
        [args.airlock, "serve", "--listen", "127.0.0.1:0", "--max-in-flight", str(args.max_in_flight),
         "--queue", "1000"],
        stderr=subprocess.PIPE, text=True, env=dict(env, AIRLOCK_LOG="warn"))
    try:
        addr = None
        for line in server.stderr:
            m = re.search(r"listening on http://([0-9.]+):(\d+)", line)
            if m:
                addr = (m.group(1), int(m.group(2)))
                break
        if addr is None:
            raise SystemExit("airlock serve did not start")
        threading.Thread(target=lambda: server.stderr.read(), daemon=True).start()
        # Warm up (page cache, first sandbox).
        run_level(5, 1, server_job(*addr))[0]
        rows = []
        for clients in levels:
            s_rps, s_lat, s_err = run_level(args.jobs, clients, server_job(*addr))
            c_rps, c_lat, c_err = run_level(args.jobs, clients, cli_job(args.airlock, env))
            rows.append((clients, s_rps, percentile(s_lat, 50), percentile(s_lat, 99), s_err,
                         c_rps, percentile(c_lat, 50), percentile(c_lat, 99), c_err))
    finally:
        server.terminate()
        server.wait(timeout=60)

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"Machine: {os.cpu_count()} CPUs ({cpu}), {platform.system()} {platform.release()}; "
          f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; binary {args.airlock}; "
          f"{args.jobs} jobs per level; job: python3 `{CODE}`; server --max-in-flight {args.max_in_flight}\n")
    print("| clients | serve req/s | serve p50 ms | serve p99 ms | serve failed | CLI jobs/s | CLI p50 ms | CLI p99 ms | CLI failed |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for clients, s_rps, s50, s99, s_err, c_rps, c50, c99, c_err in rows:
        print(f"| {clients} | {s_rps:.1f} | {s50:.0f} | {s99:.0f} | {s_err} | {c_rps:.1f} | {c50:.0f} | {c99:.0f} | {c_err} |")


if __name__ == "__main__":
    main()
