#!/usr/bin/env python3
"""Warm jobs with OpenTelemetry export on beside off, in one run (issue 33: within 5%).

Two `airlock serve` processes on the same policy (`[native] warm_pool = 4`, the zygote on,
as `serve zygote` in bench.py): one exporting traces, metrics and logs over OTLP/HTTP to
a receiver on 127.0.0.1 that accepts everything (reads each request whole and answers
200), one with export off. Every request carries a `traceparent`, so the exporting one
builds the whole span tree of each job in the caller's trace. The two are measured in
alternation, round after round, so that the machine's drift falls on both alike:
  p50 ms      sequential `sum` jobs, each sent once the pool is full again (as bench.py's
              warm rows), median over all rounds
  jobs/s @N   N clients sending jobs back to back, total jobs over total wall time
Rows: each figure on and off, and on over off (latency: lower is better; throughput:
higher is better). The last line says what the receiver got, so that "on" provably
exported. Standard library only. A benchmark, not a test: it asserts only that the jobs
worked and that export happened.

Usage: otel.py --airlock BIN --work DIR [--rounds N] [--runs N] [--jobs N] [--clients N]
"""
import argparse
import http.server
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402 - the same job, client and warm-pool wait as the main table

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
WARM_POOL = 4


class Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that accepts everything and keeps only counts."""

    requests = {}
    received_bytes = [0]
    lock = threading.Lock()

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.lock:
            self.requests[self.path] = self.requests.get(self.path, 0) + 1
            self.received_bytes[0] += len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def start_serve(airlock, policy, work, name, otel_endpoint):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    if otel_endpoint:
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=otel_endpoint, OTEL_SERVICE_NAME="airlock-bench")
    return bench.start_server(airlock, policy, work, f"otel-{name}", environ=env)


class Traced(bench.Contender):
    """bench.py's HTTP contender, each request with the caller's traceparent."""

    def one(self, job):
        body = bench.json.dumps({"language": "python", "code": bench.JOBS[job]}).encode()
        host, port = self.server

        def run(state):
            conn = state.get("conn")
            if conn is None:
                conn = state["conn"] = bench.http.client.HTTPConnection(host, port, timeout=120)
            conn.request("POST", "/v1/runs", body,
                         {"Content-Type": "application/json", "traceparent": TRACEPARENT})
            response = conn.getresponse()
            data = response.read()
            obs = bench.json.loads(data)
            if response.status != 200 or not obs["ok"] or not obs["stdout"].encode().startswith(
                    bench.EXPECT[job]):
                raise RuntimeError(f"{self.name}: HTTP {response.status}: {data[:300]!r}")

        return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--airlock", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--rounds", type=int, default=6, help="alternations of on and off")
    p.add_argument("--runs", type=int, default=20, help="sequential jobs per round")
    p.add_argument("--jobs", type=int, default=60, help="throughput jobs per round")
    p.add_argument("--clients", type=int, default=2, help="jobs in flight for throughput")
    args = p.parse_args()

    receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{receiver.server_address[1]}"
    policy = os.path.join(args.work, "policy-otel.toml")
    with open(policy, "w") as f:
        f.write(f'version = "bench-otel"\n[native]\nwarm_pool = {WARM_POOL}\n')
    servers = {}
    try:
        for name, otel in (("on", endpoint), ("off", None)):
            proc, addr = start_serve(args.airlock, policy, args.work, name, otel)
            servers[name] = (proc, Traced(f"export {name}", server=addr))
        latencies = {"on": [], "off": []}
        done = {"on": [0, 0.0], "off": [0, 0.0]}
        for name, (_, contender) in servers.items():
            bench.latency_http(contender, "sum", 0, 3, want_ready=WARM_POOL)
        for r in range(args.rounds):
            # on, off, then off, on: neither always goes first.
            order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
            for name in order:
                contender = servers[name][1]
                latencies[name] += bench.latency_http(contender, "sum", args.runs, 0,
                                                      want_ready=WARM_POOL)
            for name in order:
                contender = servers[name][1]
                bench.wait_ready(contender.server, WARM_POOL)
                started = time.perf_counter()
                rate, _ = bench.throughput(contender, "sum", args.jobs, args.clients)
                done[name][0] += args.jobs
                done[name][1] += time.perf_counter() - started
            bench.log(f"round {r + 1}/{args.rounds} done")
        # The last batches go out within the SDK's schedule delay (5 s by default).
        time.sleep(6)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            proc.wait(timeout=60)
    p50 = {n: statistics.median(v) * 1000 for n, v in latencies.items()}
    rate = {n: d[0] / d[1] for n, d in done.items()}
    print(f"\n## OpenTelemetry export on vs off (warm jobs, `sum`, {args.rounds} alternating rounds)\n")
    print(f"| | export on | export off | on / off |")
    print(f"|:---|---:|---:|---:|")
    print(f"| p50 ms ({len(latencies['on'])} sequential jobs each) | {p50['on']:.1f} | "
          f"{p50['off']:.1f} | {p50['on'] / p50['off']:.3f} |")
    print(f"| jobs/s @{args.clients} ({done['on'][0]} jobs each) | {rate['on']:.1f} | "
          f"{rate['off']:.1f} | {rate['on'] / rate['off']:.3f} |")
    with Receiver.lock:
        got = dict(Receiver.requests)
        size = Receiver.received_bytes[0]
    print(f"\nThe receiver got {got} ({size} bytes).")
    if not got.get("/v1/traces"):
        raise SystemExit("export on exported no traces: the comparison proves nothing")


if __name__ == "__main__":
    main()
