#!/usr/bin/env python3
"""How long the Docker daemon takes to report a container stopped once its last process
is gone: what every container job waits for after its own end, warm or cold.

For each runtime (runc, runsc) and run: a container whose program sleeps a second is
started; this script opens a pidfd on the container's first host process (the job's pid 1
under runc; gVisor's sandbox process under runsc, which exits with the sandbox) and, at the
same time, asks the Engine API to wait for the container (`condition=not-running`, what
airlock's supervision waits on). The figure is the time from the pidfd turning readable
(the process, and with it the container's pid namespace, is gone) to the wait's answer.
Prints the median and the spread per runtime. Standard library only; root; the daemon of
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
    created = api(path, "POST", "/containers/create", {
        "Image": image, "Cmd": ["python3", "-c", "import time; time.sleep(1)"],
        "Labels": {"airlock.bench": "exit-latency"},
        "HostConfig": {"NetworkMode": "none", "Runtime": runtime},
    })
    cid = created["Id"]
    try:
        api(path, "POST", f"/containers/{cid}/start")
        pid = api(path, "GET", f"/containers/{cid}/json")["State"]["Pid"]
        pidfd = os.pidfd_open(pid)
        answered = {}

        def wait():
            api(path, "POST", f"/containers/{cid}/wait?condition=not-running")
            answered["at"] = time.monotonic()

        waiter = threading.Thread(target=wait)
        waiter.start()
        select.select([pidfd], [], [])
        gone = time.monotonic()
        waiter.join()
        os.close(pidfd)
        return answered["at"] - gone
    finally:
        api(path, "DELETE", f"/containers/{cid}?force=true")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("image")
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args()
    path = socket_path()
    for runtime in ("runc", "runsc"):
        times = [one(path, args.image, runtime) * 1000 for _ in range(args.runs)]
        print(f"{runtime}: the wait answered {statistics.median(times):.1f} ms (median of "
              f"{len(times)}; {min(times):.1f} to {max(times):.1f}) after the container's "
              "first process was gone")


if __name__ == "__main__":
    main()
