#!/usr/bin/env python3
"""Tenant B's latency while tenant A saturates the server (issue 34: fairness, measured).

One `airlock serve` with a tokens file of two tenants, `flood` and `calm`, on the built-in
policy, with the zygote and a warm pool as `serve zygote` in bench.py. Three phases, each
`calm` sending `--jobs` small jobs one after another (`print(sum(range(10)))`, the next
once the previous answered):
  alone       nothing else runs
  fair        `--flooders` clients of tenant `flood` send CPU-bound jobs back to back
              (about `--flood-ms` of CPU each); a 429 from the per-tenant queue bound is
              counted and retried after a short pause, as a client would
  same tenant the same flood, but `calm`'s jobs are sent with `flood`'s token: what the
              small jobs would wait without the per-tenant admission (one tenant's queue)
Rows: calm's p50, p90, p99 and max per phase, and each over `alone`; the flood's jobs/s and
429s. Standard library only. A benchmark, not a test: it asserts only that the jobs worked.

Usage: fairness.py --airlock BIN --work DIR [--jobs N] [--flooders N] [--flood-ms MS]
"""
import argparse
import http.client
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402 - the server start, percentile and log

CALM_JOB = "print(sum(range(10)))\n"
POLICY = """version = "fairness-1"
[native]
warm_pool = 4
"""


def flood_job(ms):
    # A loop of about `ms` milliseconds of CPU, timed in the job so it does not depend on
    # the interpreter's speed.
    return (
        "import time\n"
        f"end = time.process_time() + {ms / 1000}\n"
        "n = 0\n"
        "while time.process_time() < end:\n"
        "    n += 1\n"
        "print('done')\n"
    )


def new_token(airlock, tokens, tenant):
    out = subprocess.run(
        [airlock, "token", "new", "--tenant", tenant, "--tokens-file", tokens],
        check=True, capture_output=True, text=True)
    return out.stdout.strip()


class Client:
    """One keep-alive connection sending jobs with one token."""

    def __init__(self, addr, token):
        self.addr = addr
        self.token = token
        self.conn = None

    def run(self, code):
        """(status, observation or error body, seconds)."""
        body = json.dumps({"language": "python", "code": code}).encode()
        start = time.monotonic()
        for attempt in range(2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(*self.addr, timeout=300)
            try:
                self.conn.request("POST", "/v1/runs", body, {
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {self.token}"})
                response = self.conn.getresponse()
                data = response.read()
                break
            except (http.client.HTTPException, OSError):
                # The server closed a kept-alive connection: once more on a new one.
                self.conn = None
                if attempt:
                    raise
        return response.status, json.loads(data), time.monotonic() - start


def calm_with_retries(addr, token, jobs):
    """Each job's time from its first send to its answer, 429 retries included."""
    client = Client(addr, token)
    latencies = []
    for _ in range(jobs):
        start = time.monotonic()
        while True:
            status, obs, _ = client.run(CALM_JOB)
            if status != 429:
                break
            time.sleep(0.05)
        if status != 200 or not obs.get("ok") or obs.get("stdout") != "45\n":
            raise SystemExit(f"fairness.py: a calm job failed: {status} {obs}")
        latencies.append(time.monotonic() - start)
    return latencies


class Flood:
    def __init__(self, addr, token, clients, ms):
        self.addr, self.token, self.code = addr, token, flood_job(ms)
        self.clients = clients
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done = 0
        self.refused = 0
        self.failed = []
        self.threads = []

    def client(self):
        client = Client(self.addr, self.token)
        while not self.stop.is_set():
            status, obs, _ = client.run(self.code)
            with self.lock:
                if status == 429:
                    self.refused += 1
                elif status == 200 and obs.get("ok"):
                    self.done += 1
                elif len(self.failed) < 5:
                    self.failed.append(f"{status} {obs}")
            if status == 429:
                time.sleep(0.02)

    def __enter__(self):
        self.started = time.monotonic()
        self.threads = [threading.Thread(target=self.client, daemon=True)
                        for _ in range(self.clients)]
        for t in self.threads:
            t.start()
        # Until the flood fills the server: its first jobs done.
        while self.done < self.clients and not self.failed:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()
        self.seconds = time.monotonic() - self.started
        if self.failed:
            raise SystemExit(f"fairness.py: flood jobs failed: {self.failed}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--airlock", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--flooders", type=int, default=32)
    ap.add_argument("--flood-ms", type=int, default=100)
    args = ap.parse_args()

    tokens = os.path.join(args.work, "fairness-tokens.toml")
    if os.path.exists(tokens):
        os.remove(tokens)
    flood_token = new_token(args.airlock, tokens, "flood")
    calm_token = new_token(args.airlock, tokens, "calm")
    policy = os.path.join(args.work, "fairness-policy.toml")
    with open(policy, "w") as f:
        f.write(POLICY)
    proc, addr = bench.start_server(args.airlock, policy, args.work, "fairness",
                                    extra_args=["--tokens", tokens])
    try:
        # Warm-up: the zygote and the pool ready, as in every row of bench.py.
        calm_with_retries(addr, calm_token, 10)
        rows = {}
        bench.log("fairness: calm alone")
        rows["alone"] = calm_with_retries(addr, calm_token, args.jobs)
        floods = {}
        for phase, token in (("fair", calm_token), ("same tenant", flood_token)):
            bench.log(f"fairness: calm ({phase}) beside {args.flooders} flooding clients")
            with Flood(addr, flood_token, args.flooders, args.flood_ms) as flood:
                rows[phase] = calm_with_retries(addr, token, args.jobs)
            floods[phase] = flood
    finally:
        proc.terminate()
        proc.wait(timeout=60)

    alone = {p: bench.percentile(rows["alone"], p) for p in (50, 90, 99)}
    print(f"\nFairness: {args.jobs} calm jobs per phase, {args.flooders} flooding clients, "
          f"flood jobs of {args.flood_ms} ms CPU, {os.cpu_count()} CPUs, built-in policy "
          f"with the zygote and a warm pool of 4\n")
    print("| calm's latency | p50 ms | p90 ms | p99 ms | max ms | p50 × alone | p99 × alone "
          "| flood jobs/s | flood 429s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for phase, values in rows.items():
        p = {q: bench.percentile(values, q) for q in (50, 90, 99)}
        flood = floods.get(phase)
        print(f"| {phase} | {p[50] * 1000:.1f} | {p[90] * 1000:.1f} | {p[99] * 1000:.1f} "
              f"| {max(values) * 1000:.1f} | {p[50] / alone[50]:.2f} | {p[99] / alone[99]:.2f} "
              f"| {flood.done / flood.seconds:.1f} | {flood.refused} |" if flood else
              f"| {phase} | {p[50] * 1000:.1f} | {p[90] * 1000:.1f} | {p[99] * 1000:.1f} "
              f"| {max(values) * 1000:.1f} | 1.00 | 1.00 | | |")


if __name__ == "__main__":
    main()
