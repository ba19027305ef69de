"""Soak: many mixed jobs through one `airlock serve` from several clients (issue 34).

Drives `--jobs` jobs from `--clients` threads: hello, output floods, timeouts, OOM,
non-zero exits, `/out` files, `sh`, workspace sessions (create, two calls, a file put and
read, delete) and, when E2B's SDK is importable, E2B sandboxes (create, commands.run,
files.write/read, kill). Reports jobs/s, the server's RSS, open fds and threads at the
start, middle and end (their slope), what is left after the server stops (processes,
cgroups, mounts, job directories, session workspaces of this run's jobs), and the audit
log's lines per job. Prints Markdown. A soak, not a test: it asserts nothing but says what
it found; `scripts/soak.sh` runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

POLICY = """version = "soak-1"
[limits]
timeout = "5s"
memory = "256MiB"
[filesystem.out]
enabled = true
[sessions]
enabled = true
mode = "workspace"
max_per_tenant = 16
[audit]
path = "audit.jsonl"
"""

# kind -> weight (per 100 jobs).
MIX = {
    "hello": 30,
    "flood": 8,
    "timeout": 4,
    "oom": 4,
    "exit": 10,
    "out_files": 10,
    "sh": 14,
    "session": 10,
    "e2b": 10,
}


class Soak:
    def __init__(self, url: str, marker: str) -> None:
        self.url = url
        self.marker = marker
        self.lock = threading.Lock()
        self.counts: dict[str, dict[str, int]] = {}
        self.executions = 0  # job executions the server answered (each should be audited)
        self.latencies: list[float] = []
        self.errors: list[str] = []

    def count(self, kind: str, result: str) -> None:
        with self.lock:
            self.counts.setdefault(kind, {}).setdefault(result, 0)
            self.counts[kind][result] += 1

    def note_error(self, text: str) -> None:
        with self.lock:
            if len(self.errors) < 20:
                self.errors.append(text)

    def request(
        self, method: str, path: str, body: object | None = None, raw: bytes | None = None
    ) -> tuple[int, bytes]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header(
                "Content-Type", "application/json" if raw is None else "application/octet-stream"
            )
        try:
            with urllib.request.urlopen(req, timeout=120) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def run(self, body: dict[str, object]) -> tuple[int, dict[str, object]]:
        body = {**body, "args": [self.marker]}
        status, text = self.request("POST", "/v1/runs", body)
        try:
            return status, json.loads(text)
        except ValueError:
            return status, {"raw": text[:200].decode(errors="replace")}

    def job(self, kind: str) -> None:
        started = time.perf_counter()
        if kind == "session":
            self.session()
        elif kind == "e2b":
            self.e2b()
        else:
            body: dict[str, object] = {
                "hello": {"language": "python", "code": "print('hello')"},
                "flood": {
                    "language": "python",
                    "code": "import sys\nfor _ in range(200): sys.stdout.write('x' * 65536)",
                },
                "timeout": {"language": "python", "code": "while True: pass", "timeout_s": 1},
                "oom": {"language": "python", "code": "b = bytearray(1 << 30)\nprint(len(b))"},
                "exit": {"language": "python", "code": "import sys; sys.exit(3)"},
                "out_files": {
                    "language": "python",
                    "return_files": True,
                    "code": "open('/out/r.txt', 'w').write('result ' * 100)",
                },
                "sh": {"language": "sh", "code": "echo hi; ls / >/dev/null"},
            }[kind]  # type: ignore[assignment]
            status, obs = self.run(body)
            if status == 200:
                with self.lock:
                    self.executions += 1
                self.count(kind, str(obs.get("outcome")))
            else:
                self.count(kind, f"http_{status}")
                if status not in (429, 503):
                    self.note_error(f"{kind}: {status} {obs}")
        with self.lock:
            self.latencies.append(time.perf_counter() - started)

    def session(self) -> None:
        status, text = self.request("POST", "/v1/sessions", {})
        if status != 201:
            self.count("session", f"create_{status}")
            if status != 429:
                self.note_error(f"session create: {status} {text[:200]!r}")
            return
        sid = json.loads(text)["id"]
        ok = True
        for code in [
            "open('/work/state.txt', 'w').write('1')",
            "print(open('/work/state.txt').read())",
        ]:
            status, text = self.request(
                "POST", f"/v1/sessions/{sid}/runs", {"language": "python", "code": code}
            )
            if status == 200:
                with self.lock:
                    self.executions += 1
            else:
                ok = False
                self.note_error(f"session run: {status} {text[:200]!r}")
        status, _ = self.request("PUT", f"/v1/sessions/{sid}/files/up.txt", raw=b"uploaded\n")
        ok = ok and status in (200, 201, 204)
        status, body = self.request("GET", f"/v1/sessions/{sid}/files/up.txt")
        ok = ok and status == 200 and body == b"uploaded\n"
        status, _ = self.request("DELETE", f"/v1/sessions/{sid}")
        ok = ok and status == 204
        self.count("session", "ok" if ok else "failed")

    def e2b(self) -> None:
        try:
            from e2b import Sandbox  # type: ignore[import-not-found]
        except ImportError:
            self.count("e2b", "skipped_no_sdk")
            return
        try:
            sandbox = Sandbox.create()
        except Exception as e:
            text = str(e)
            self.count(
                "e2b", "create_429" if "429" in text or "limit" in text.lower() else "create_failed"
            )
            if "429" not in text:
                self.note_error(f"e2b create: {type(e).__name__}: {text[:200]}")
            return
        try:
            result = sandbox.commands.run("echo e2b")
            with self.lock:
                self.executions += 1
            sandbox.files.write("/home/user/f.txt", "from e2b\n")
            read = sandbox.files.read("/home/user/f.txt")
            ok = result.stdout == "e2b\n" and read == "from e2b\n"
            self.count("e2b", "ok" if ok else "wrong_answer")
        except Exception as e:
            self.count("e2b", "failed")
            self.note_error(f"e2b: {type(e).__name__}: {str(e)[:200]}")
        finally:
            try:
                sandbox.kill()
            except Exception:
                pass


def proc_figures(pid: int) -> dict[str, int]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss_mib": rss // 1024, "fds": fds, "threads": threads}


def cgroup_names() -> set[str]:
    names: set[str] = set()
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        if root.count("/") > 10:
            dirs[:] = []
            continue
        names.update(dirs)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--airlock", required=True)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--max-in-flight", type=int, default=0, help="0: the server's default")
    args = parser.parse_args()
    marker = f"soak-{os.getpid()}"
    kinds = [k for k, w in MIX.items() for _ in range(w)]
    rng = random.Random(34)
    plan = [rng.choice(kinds) for _ in range(args.jobs)]

    with tempfile.TemporaryDirectory(prefix="airlock-soak-") as tmp:
        work = Path(tmp)
        # The session workspaces live below it: the jobs' users must reach them.
        work.chmod(0o755)
        (work / "soak.toml").write_text(POLICY)
        tokens = work / "tokens.toml"
        key = subprocess.run(
            [
                args.airlock,
                "token",
                "new",
                "--tenant",
                "soak",
                "--e2b",
                "--tokens-file",
                str(tokens),
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        log = open(work / "serve.log", "w+b")
        command = [
            args.airlock,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--policy",
            str(work / "soak.toml"),
            "--queue",
            "1000",
            "--queue-wait",
            "600s",
        ]
        if args.max_in_flight:
            command += ["--max-in-flight", str(args.max_in_flight)]
        # Unauthenticated for the plain routes (loopback), but E2B's SDK needs a key: a
        # second server would split the figures, so the one server has the key's tenant
        # and the plain routes send it too.
        command += ["--tokens", str(tokens)]
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "AIRLOCK_STATE_DIR": str(work / "state"),
                "AIRLOCK_SESSIONS_DIR": str(work / "sessions"),
            },
        )
        url = ""
        for _ in range(1200):
            log.seek(0)
            found = re.search(rb"listening on (http://127\.0\.0\.1:\d+)", log.read())
            if found:
                url = found.group(1).decode()
                break
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        if not url:
            log.seek(0)
            raise SystemExit("airlock serve did not start:\n" + log.read().decode(errors="replace"))
        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=key)
        opener = urllib.request.build_opener()
        opener.addheaders = [("Authorization", f"Bearer {key}")]
        urllib.request.install_opener(opener)

        soak = Soak(url, marker)
        samples: list[tuple[str, float, dict[str, int]]] = []
        start = time.perf_counter()
        samples.append(("start", 0.0, proc_figures(proc.pid)))
        next_index = 0
        index_lock = threading.Lock()
        middle_taken = threading.Event()

        def client() -> None:
            nonlocal next_index
            while True:
                with index_lock:
                    if next_index >= len(plan):
                        return
                    i = next_index
                    next_index += 1
                if i == len(plan) // 2 and not middle_taken.is_set():
                    middle_taken.set()
                    samples.append(("middle", time.perf_counter() - start, proc_figures(proc.pid)))
                try:
                    soak.job(plan[i])
                except Exception as e:
                    soak.count(plan[i], "client_error")
                    soak.note_error(f"{plan[i]}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=client) for _ in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        # Idle again: every sandbox removed (jobs_in_flight counts until removal).
        for _ in range(600):
            status, text = soak.request("GET", "/v1/health")
            if status == 200 and json.loads(text).get("jobs_in_flight") == 0:
                break
            time.sleep(0.1)
        samples.append(("end (idle)", time.perf_counter() - start, proc_figures(proc.pid)))

        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        audit = [
            json.loads(line)
            for line in (work / "audit.jsonl").read_text().splitlines()
            if line.strip()
        ]
        job_ids = {line["job_id"] for line in audit if line.get("event") == "job"}
        job_lines = sum(1 for line in audit if line.get("event") == "job")
        interrupted = sum(1 for line in audit if line.get("interrupted"))
        # What is left of this run's jobs: processes with the marker, cgroups, mounts and
        # job directories named after its job ids, session workspaces.
        time.sleep(1)
        leftover_procs = subprocess.run(
            ["pgrep", "-f", marker], capture_output=True, text=True
        ).stdout.split()
        cgroups = cgroup_names() & job_ids
        mountinfo = Path("/proc/self/mountinfo").read_text()
        mounts = [i for i in job_ids if i in mountinfo]
        job_dirs = [i for i in job_ids if Path("/run/airlock", i).exists()]
        sessions_dir = work / "sessions"
        sessions_left = [p.name for p in sessions_dir.glob("*")] if sessions_dir.exists() else []
        accepted_left = list((work / "audit.jsonl.accepted").glob("*.json"))

    rate = args.jobs / elapsed
    print(f"## Soak: {args.jobs} jobs from {args.clients} clients\n")
    print(
        f"binary `{args.airlock}`, {os.cpu_count()} CPUs, {elapsed:.0f} s, "
        f"**{rate:.1f} jobs/s** (mixed; a session or an E2B sandbox counts as one job)\n"
    )
    print("| when | s | server RSS MiB | open fds | threads |")
    print("|---|---|---|---|---|")
    for name, at, fig in samples:
        print(f"| {name} | {at:.0f} | {fig['rss_mib']} | {fig['fds']} | {fig['threads']} |")
    first, last = samples[0][2], samples[-1][2]
    slope = {k: last[k] - first[k] for k in first}
    print(
        f"\nslope start→end: RSS {slope['rss_mib']:+d} MiB, fds {slope['fds']:+d}, "
        f"threads {slope['threads']:+d}\n"
    )
    lat = sorted(soak.latencies)
    if lat:
        p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99)]
        print(f"client latency per job: p50 {p50:.2f} s, p99 {p99:.2f} s\n")
    print("| kind | results |")
    print("|---|---|")
    for kind in MIX:
        results = sorted(soak.counts.get(kind, {}).items())
        print(f"| {kind} | {', '.join(f'{k} {v}' for k, v in results)} |")
    per = job_lines / max(soak.executions, 1)
    print(
        f"\naudit: {job_lines} job lines for {soak.executions} executions answered "
        f"({per:.3f} per execution; {interrupted} interrupted), "
        f"{len(job_ids)} distinct job ids, {len(accepted_left)} write-ahead records left\n"
    )
    print(
        f"leftovers after the server stopped: {len(leftover_procs)} processes, "
        f"{len(cgroups)} cgroups, {len(mounts)} mounts, {len(job_dirs)} job directories, "
        f"{len(sessions_left)} session workspaces"
    )
    if soak.errors:
        print("\nfirst errors:")
        for e in soak.errors:
            print(f"- {e}")


if __name__ == "__main__":
    main()
