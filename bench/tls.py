#!/usr/bin/env python3
"""An HTTPS request through the proxy's TLS interception beside one through a plain tunnel,
in one run, from inside one airlock job (issue 16).

An HTTPS server on the host's 127.0.0.1 (a CA made here with the openssl CLI, which the
policy's extra_roots makes the proxy and the job trust) answers two names: `api.bench`,
which has a secret bound to it (the proxy terminates its TLS with the job's CA, verifies
the server itself, puts the secret in and scrubs the answer), and `plain.bench`, which has
none (the proxy splices the tunnel, the job's TLS goes through untouched). The job times
each request itself (`time.perf_counter` around it), so the figures are what a job sees:
  new connection   CONNECT, TLS (twice when intercepted), GET, answer, close
  kept alive       one more GET on an open connection
Rows: the median and p90 in ms for each, and intercepted over tunnel. Standard library
only (and openssl). A benchmark, not a test: it asserts only that the requests worked.

Usage: tls.py --airlock BIN --work DIR [--runs N]
"""
import argparse
import http.server
import json
import os
import socket
import ssl
import subprocess
import threading

RUNS = 40


def make_certs(work):
    """A CA and a server certificate for both names, with the openssl CLI."""
    def openssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)
    ca_key, ca = os.path.join(work, "bench-ca.key"), os.path.join(work, "bench-ca.pem")
    key, csr, cert = (os.path.join(work, f"bench-server.{e}") for e in ("key", "csr", "pem"))
    ext = os.path.join(work, "bench-server.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=DNS:api.bench,DNS:plain.bench\n")
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=airlock bench CA")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", key, "-out", csr, "-subj", "/CN=bench")
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
            "-out", cert, "-days", "1", "-extfile", ext)
    return ca, cert, key


class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # The head and the body are two writes: without this, the second waits for the
        # client's delayed ACK (40 ms) and that is all either row would measure.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self):
        body = ("auth=" + self.headers.get("Authorization", "") + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def serve(cert, key):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


JOB = r"""
import http.client, json, os, ssl, statistics, time
RUNS, PORT = {runs}, {port}
context = ssl.create_default_context()   # SSL_CERT_FILE: the job's CA bundle
token = os.environ['API_TOKEN']
def connection(host):
    c = http.client.HTTPSConnection('127.0.0.1', 3128, context=context, timeout=30)
    c.set_tunnel(host, PORT)
    return c
def get(c):
    c.request('GET', '/echo', headers={{'Authorization': 'Bearer ' + token}})
    r = c.getresponse()
    body = r.read()
    assert r.status == 200 and token.encode() in body, (r.status, body)
result = {{}}
for host in ['plain.bench', 'api.bench']:
    fresh, kept = [], []
    for _ in range(RUNS + 3):
        t0 = time.perf_counter()
        c = connection(host)
        get(c)
        t1 = time.perf_counter()
        get(c)
        t2 = time.perf_counter()
        c.close()
        fresh.append(t1 - t0)
        kept.append(t2 - t1)
    result[host] = {{'fresh': fresh[3:], 'kept': kept[3:]}}
print(json.dumps(result))
"""


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--airlock", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--runs", type=int, default=RUNS)
    args = parser.parse_args()
    ca, cert, key = make_certs(args.work)
    server, port = serve(cert, key)
    policy = os.path.join(args.work, "bench-tls.toml")
    with open(policy, "w") as f:
        f.write(
            'version = "bench-tls"\n[limits]\ntimeout = "120s"\n'
            '[network]\nmode = "proxy"\n'
            f'allow = ["api.bench:{port}", "plain.bench:{port}"]\n'
            'allow_ranges = ["127.0.0.1/32"]\n'
            'hosts = { "api.bench" = ["127.0.0.1"], "plain.bench" = ["127.0.0.1"] }\n'
            f"extra_roots = [{json.dumps(ca)}]\n"
            "[network.limits]\nconnections = 1000\n"
            "[[network.secrets]]\n"
            'env = "API_TOKEN"\nplaceholder = "airlock-placeholder-bench"\n'
            f'value_env = "BENCH_TOKEN"\nhosts = ["api.bench:{port}"]\n'
            f'[audit]\npath = "{args.work}/audit-tls.jsonl"\nfsync = false\n'
        )
    env = dict(os.environ, BENCH_TOKEN="bench-real-value",
               AIRLOCK_STATE_DIR=os.path.join(args.work, "state-tls"))
    out = subprocess.run(
        [args.airlock, "run", "--json", "--net", "proxy", "--policy", policy,
         "-c", JOB.format(runs=args.runs, port=port)],
        capture_output=True, text=True, env=env,
    )
    server.shutdown()
    obs = json.loads(out.stdout)
    if obs.get("outcome") != "exited" or obs.get("exit_code") != 0:
        raise SystemExit(f"the bench job failed: {json.dumps(obs, indent=1)}\n{out.stderr}")
    result = json.loads(obs["stdout"])
    print(f"\n## HTTPS through the egress proxy ({args.runs} requests each, timed in the job)\n")
    print("| request | tunnel median / p90 ms | intercepted median / p90 ms | × tunnel |")
    print("|---|---|---|---|")
    for kind, label in [("fresh", "new connection (CONNECT, TLS, GET)"), ("kept", "kept alive (GET)")]:
        tunnel, intercepted = result["plain.bench"][kind], result["api.bench"][kind]
        t50, i50 = percentile(tunnel, 50) * 1000, percentile(intercepted, 50) * 1000
        t90, i90 = percentile(tunnel, 90) * 1000, percentile(intercepted, 90) * 1000
        print(f"| {label} | {t50:.2f} / {t90:.2f} | {i50:.2f} / {i90:.2f} | {i50 / t50:.2f} |")


if __name__ == "__main__":
    main()
