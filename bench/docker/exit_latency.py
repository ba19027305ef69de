#!/usr/bin/env python3
"""How long the Docker daemon takes to report a container stopped once its last process
is gone: what every container job waits for after its own end, warm or cold.

For each runtime (runc, runsc) and run: a container whose program sleeps a second is
started; this script opens a pidfd on the container's first host process (the job's pid 1
under runc; gVisor's sandbox process under runsc, which exits with the sandbox) and, at the
same time, asks the Engine API to wait for the container (`condition=not-running`, what
airlock's supervision of a cold container waits on) and reads its attach stream (attached
before the start, as airlock attaches a job's output) to its end. The figures are the times
from the pidfd turning readable (the process, and with it the container's pid namespace,
is gone) to the attach stream's end and to the wait's answer: both come only after the
daemon has handled the exit. Prints the median and the spread per runtime. Standard library only; root; the daemon of
DOCKER_HOST (else /var/run/docker.sock) and an image with python3 (its id as argument).

Usage: exit_latency.py IMAGE_ID [--runs N]
"""
import argparse
import http.client
import json
import os
import select
import socket
import statistics
import threading
import time


def socket_path():
    host = os.environ.get("DOCKER_HOST", "")
    return host[len("unix://"):] if host.startswith("unix://") else "/var/run/docker.sock"


class Connection(http.client.HTTPConnection):
    def __init__(self, path):
        super().__init__("localhost", timeout=60)
        self.path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(self.path)


def api(path, method, url, body=None):
    conn = Connection(path)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, url, json.dumps(body) if body is not None else None, headers)
    response = conn.getresponse()
    data = response.read()
    if response.status >= 300:
        raise SystemExit(f"{method} {url}: {response.status} {data[:200]!r}")
    return json.loads(data) if data else None


def one(path, image, runtime):
    """(attach stream's end, wait's answer), each in seconds after the pidfd turned
    readable."""
    created = api(path, "POST", "/containers/create", {
        "Image": image, "Cmd": ["python3", "-c", "import time; time.sleep(1); print('x')"],
        "AttachStdout": True, "AttachStderr": True,
        "Labels": {"airlock.bench": "exit-latency"},
        "HostConfig": {"NetworkMode": "none", "Runtime": runtime,
                       "LogConfig": {"Type": "none"}},
    })
    cid = created["Id"]
    try:
        # Attached before the start, as airlock attaches a job's output.
        attach = socket.socket(socket.AF_UNIX)
        attach.connect(path)
        attach.sendall(f"POST /containers/{cid}/attach?stream=1&stdout=1&stderr=1 HTTP/1.1\r\n"
                       "Host: localhost\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += attach.recv(1)
        api(path, "POST", f"/containers/{cid}/start")
        pid = api(path, "GET", f"/containers/{cid}/json")["State"]["Pid"]
        pidfd = os.pidfd_open(pid)
        answered = {}

        def wait():
            api(path, "POST", f"/containers/{cid}/wait?condition=not-running")
            answered["wait"] = time.monotonic()

        def drain():
            while attach.recv(65536):
                pass
            answered["attach"] = time.monotonic()

        threads = [threading.Thread(target=wait), threading.Thread(target=drain)]
        for thread in threads:
            thread.start()
        select.select([pidfd], [], [])
        gone = time.monotonic()
        for thread in threads:
            thread.join()
        os.close(pidfd)
        attach.close()
        return answered["attach"] - gone, answered["wait"] - gone
    finally:
        api(path, "DELETE", f"/containers/{cid}?force=true")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("image")
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args()
    path = socket_path()
    for runtime in ("runc", "runsc"):
        runs = [one(path, args.image, runtime) for _ in range(args.runs)]
        for what, times in (("the attach stream ended", [r[0] * 1000 for r in runs]),
                            ("the wait answered", [r[1] * 1000 for r in runs])):
            print(f"{runtime}: {what} {statistics.median(times):.1f} ms (median of "
                  f"{len(times)}; {min(times):.1f} to {max(times):.1f}) after the "
                  "container's first process was gone")


if __name__ == "__main__":
    main()
