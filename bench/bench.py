#!/usr/bin/env python3
"""airlock beside the alternatives, on the same two jobs, in one run.

Contenders (each where this host has it; a missing one is listed with the reason):
  python3            the bare interpreter on the host (`/usr/bin/python3 -I`): the baseline
  bwrap              bubblewrap with the closest shape it can give (namespaces, read-only
                     /usr, uid 65534, no capabilities, no network; no cgroup limits, no seccomp)
  docker run         `docker run --rm` with DESIGN §5's reference flags (runc)
  docker run runsc   the same with `--runtime runsc` (gVisor)
  airlock native     `airlock run --backend native` (a fresh sandbox per job, no daemon),
                     in the default minimal root (rootfs = "host")
  airlock native host-full   the same with rootfs = "host-full" (the host's whole /usr)
  airlock docker     `airlock run --backend docker`, and gvisor, podman alike
  serve cold         `airlock serve`, POST /v1/runs over a keep-alive connection
  serve warm         the same with `[native] warm_pool`: the sandbox and interpreter are
                     started before the job arrives, one sandbox per job
  serve zygote       the same with `[native] zygote = true`: each warm sandbox forked from
                     one interpreter that started once (docs/speed.md)
  airlock docker warm   `airlock serve --backend docker` with `[docker] warm_pool`: a
                     container created and started before the job, its interpreter
                     waiting; and `airlock gvisor warm` alike (`gvisor_warm_pool`). Their
                     latency rows send each job once a warm container is ready (the wait
                     is not counted); in the throughput runs a job that finds none ready
                     runs in a fresh container, as it would in production

Jobs: `print(sum(range(10)))`, and one that imports json and re and prints 1 MB (airlock
keeps the first 8 KB: its default stdout cap; the others write to /dev/null or a pipe that
the driver drains).

Latency (median, p90) of jobs one after another comes from hyperfine (`-N`, no shell) for
the process contenders and from this driver for HTTP; throughput (jobs per second with 1,
2 and 8 in flight) and each job's latency under that load (p50, p99) from this driver's
threads for all. Prints Markdown. Standard library
only. A benchmark, not a test: it asserts only that every job ran and printed the right
thing.

Usage: bench.py --airlock BIN --work DIR [--runs N] [--jobs N] [--levels 1,2,8]
                [--image REF@sha256:...] [--only NAME,...]

The container rows use the Docker daemon the docker CLI uses (DOCKER_HOST), and the
Podman service at $AIRLOCK_PODMAN_SOCKET (default /run/podman/podman.sock).
"""
import argparse
import http.client
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time

JOBS = {
    "sum": "print(sum(range(10)))\n",
    "1mb": (
        "import json, re\n"
        "line = json.dumps({'k': 'v' * 90}) + '\\n'\n"
        "print(re.sub('v', 'w', line) * (1_000_000 // len(line)), end='')\n"
    ),
}
EXPECT = {"sum": b"45\n", "1mb": b'{"k": "www', "pass": b""}
# The job of the sandboxes-per-second table: an interpreter that starts and ends.
SANDBOX_JOBS = {"pass": "pass\n"}
PYTHON = "/usr/bin/python3"


def percentile(values, p):
    values = sorted(values)
    k = max(0, min(len(values) - 1, round(p / 100 * (len(values) - 1))))
    return values[k]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Contender:
    """One way of running a job: a command per job, or an HTTP server."""

    def __init__(self, name, argv_for=None, server=None, note="", backend=None, warm_key=None):
        self.name = name
        self.argv_for = argv_for  # job name -> argv
        self.server = server  # (host, port) when over HTTP
        self.note = note
        self.missing = None  # why it cannot run here
        # A warm container row: `airlock serve --backend BACKEND` with `[docker] WARM_KEY`;
        # its sequential jobs are sent once a warm container is ready.
        self.backend = backend
        self.warm_key = warm_key

    def one(self, job):
        """A callable running one job, with per-thread state (a connection)."""
        if self.server:
            code = JOBS[job] if job in JOBS else SANDBOX_JOBS[job]
            body = json.dumps({"language": "python", "code": code}).encode()
            host, port = self.server

            def run(state):
                conn = state.get("conn")
                if conn is None:
                    conn = state["conn"] = http.client.HTTPConnection(host, port, timeout=120)
                conn.request("POST", "/v1/runs", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read()
                if response.status != 200:
                    raise RuntimeError(f"{self.name}: HTTP {response.status}: {data[:300]!r}")
                obs = json.loads(data)
                if not obs["ok"] or not obs["stdout"].encode().startswith(EXPECT[job]):
                    raise RuntimeError(f"{self.name}: {data[:300]!r}")

            return run
        argv = self.argv_for(job)

        def run(_state):
            out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
            text = out.stdout
            if argv[0].endswith("airlock"):
                obs = json.loads(out.stdout)
                text = obs["stdout"].encode() if obs["ok"] else b""
            if out.returncode != 0 or not text.startswith(EXPECT[job]):
                raise RuntimeError(f"{self.name}: exit {out.returncode}: {out.stdout[:300]!r} {out.stderr[-300:]!r}")

        return run


def throughput(contender, job, n_jobs, clients):
    """Jobs per second with `clients` jobs in flight, and each job's latency (seconds)."""
    lock = threading.Lock()
    counter = iter(range(n_jobs))
    errors = []
    done = [0]
    latencies = []
    one = contender.one(job)

    def worker():
        state = {}
        while True:
            with lock:
                if next(counter, None) is None:
                    return
            start = time.perf_counter()
            try:
                one(state)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(str(e))
                state.clear()
                continue
            elapsed = time.perf_counter() - start
            with lock:
                done[0] += 1
                latencies.append(elapsed)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise SystemExit(f"{contender.name} ({job}, {clients} in flight): {len(errors)} failed: {errors[:2]}")
    return done[0] / wall, latencies


def sandboxes_per_second(contender, n_jobs, clients, rounds, warm_pool):
    """Sandboxes made, run (`pass`) and ended per second with `clients` jobs in flight,
    the median of `rounds` runs of `n_jobs`. For a server each round starts with its warm
    pool full and ends once it has no job in flight: it holds a job's slot until that
    job's sandbox is removed, so every sandbox counted is gone by then."""
    rates = []
    for _ in range(rounds):
        if contender.server:
            wait_ready(contender.server, warm_pool)
        start = time.perf_counter()
        throughput(contender, "pass", n_jobs, clients)
        if contender.server:
            while metric(contender.server, "airlock_jobs_in_flight") > 0:
                time.sleep(0.002)
        rates.append(n_jobs / (time.perf_counter() - start))
    return statistics.median(rates)


def latency_http(contender, job, runs, warmup, want_ready=0):
    """Sequential jobs' times. With `want_ready`, each job is sent once the server's warm
    pool has that many ready (the wait is not part of the job's time)."""
    one = contender.one(job)
    state = {}

    def ready():
        if want_ready:
            wait_ready(contender.server, want_ready)

    for _ in range(warmup):
        ready()
        one(state)
    times = []
    for _ in range(runs):
        ready()
        start = time.perf_counter()
        one(state)
        times.append(time.perf_counter() - start)
    return times


def wait_ready(addr, want, limit=120):
    deadline = time.time() + limit
    while metric(addr, "airlock_warm_pool_ready") < want:
        if time.time() > deadline:
            raise SystemExit(f"the warm pool at {addr} never had {want} ready")
        time.sleep(0.02)


def latency_hyperfine(contenders, job, runs, warmup, work):
    """One hyperfine run over every process contender: {name: [seconds]}."""
    export = os.path.join(work, f"hyperfine-{job}.json")
    cmd = ["hyperfine", "-N", "--style", "basic", "--warmup", str(warmup), "--runs", str(runs),
           "--export-json", export]
    for c in contenders:
        # hyperfine -N splits on whitespace with shell-like quoting.
        cmd += ["-n", c.name, " ".join(shell_quote(a) for a in c.argv_for(job))]
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    with open(export) as f:
        results = json.load(f)["results"]
    return {r["command"]: r["times"] for r in results}


def shell_quote(arg):
    if re.fullmatch(r"[A-Za-z0-9_./:=@,+-]+", arg):
        return arg
    return "'" + arg.replace("'", "'\"'\"'") + "'"


COLD_RUNS = 3
HIT_SERIES = 'airlock_warm_pool_jobs_total{result="hit"}'
MISS_SERIES = 'airlock_warm_pool_jobs_total{result="miss"}'


def cold_start(airlock, policy, work, name):
    """Wall time of the `sum` job, each run with a cache directory of its own."""
    times = []
    for i in range(COLD_RUNS):
        cache = os.path.join(work, f"cache-{name.replace(' ', '-')}-{i}")
        env = dict(os.environ, AIRLOCK_CACHE_DIR=cache, AIRLOCK_LOG="error",
                   AIRLOCK_STATE_DIR=os.path.join(work, "state-cold"))
        started = time.monotonic()
        out = subprocess.run([airlock, "run", "--json", "--policy", policy,
                              os.path.join(work, "sum.py")], capture_output=True, text=True, env=env)
        times.append(time.monotonic() - started)
        try:
            ok = json.loads(out.stdout)["stdout"] == "45\n"
        except (ValueError, KeyError):
            ok = False
        if not ok:
            raise SystemExit(f"cold {name}: {out.stdout} {out.stderr}")
        shutil.rmtree(cache, ignore_errors=True)
    return times


def observation_then_exit(airlock, policy, work, runs):
    """`airlock run --json` on the `sum` job: when its stdout ends (the observation is
    complete; the sandbox's removal runs after it) and when the process exits, per run."""
    read, exited = [], []
    env = dict(os.environ, AIRLOCK_LOG="error", AIRLOCK_STATE_DIR=os.path.join(work, "state-obs"))
    for i in range(runs + 3):
        started = time.monotonic()
        proc = subprocess.Popen([airlock, "run", "--json", "--policy", policy,
                                 os.path.join(work, "sum.py")],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        out = proc.stdout.read()
        got = time.monotonic()
        proc.wait()
        done = time.monotonic()
        if json.loads(out)["stdout"] != "45\n":
            raise SystemExit(f"observation: {out!r}")
        if i >= 3:
            read.append(got - started)
            exited.append(done - started)
    return read, exited


def start_server(airlock, policy, work, name, backend="native", environ=None, extra_args=()):
    """`airlock serve` on a free port of 127.0.0.1, in `environ` (default: ours), with
    `extra_args` after ours; its process and address."""
    env = dict(os.environ if environ is None else environ,
               AIRLOCK_STATE_DIR=os.path.join(work, f"state-{name}"), AIRLOCK_LOG="warn")
    proc = subprocess.Popen(
        [airlock, "serve", "--listen", "127.0.0.1:0", "--policy", policy, "--queue", "1000",
         "--backend", backend, *extra_args],
        stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stderr:
        m = re.search(r"listening on http://([0-9.]+):(\d+)", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, (m.group(1), int(m.group(2)))
    proc.wait()
    raise SystemExit(f"airlock serve ({name}) did not start")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def metric(addr, series):
    conn = http.client.HTTPConnection(*addr, timeout=10)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[1])
    return 0.0


def memory_of_pid(pid):
    """Memory charged to the cgroup of `pid` (v1 or v2), in KiB, or None."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        candidates = []
        if "memory" in controllers.split(","):
            candidates.append(f"/sys/fs/cgroup/memory{path}/memory.usage_in_bytes")
        elif controllers == "":
            candidates.append(f"/sys/fs/cgroup{path}/memory.current")
        for candidate in candidates:
            if os.path.exists(candidate):
                with open(candidate) as f:
                    return int(f.read()) // 1024
    return None


def warm_containers(backend):
    """Memory charged to the cgroup of each waiting warm container of `backend`, in KiB
    (on the docker CLI's daemon)."""
    ids = subprocess.run(["docker", "ps", "-q", "--filter", "label=airlock.warm=true",
                          "--filter", f"label=airlock.backend={backend}"],
                         capture_output=True, text=True).stdout.split()
    found = []
    for cid in ids:
        pid = subprocess.run(["docker", "inspect", "-f", "{{.State.Pid}}", cid],
                             capture_output=True, text=True).stdout.strip()
        kib = memory_of_pid(pid) if pid.isdigit() else None
        if kib is not None:
            found.append(kib)
    return found


def parent_pid(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def below(pid, ancestor):
    for _ in range(64):
        pid = parent_pid(pid)
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def pool_memory(server_pid):
    """The sandboxes of one server's warm pool: {cgroup name: (memory charged to the
    cgroup, PSS of its processes)}, in KiB, for every `warm-*` and `zygote-*` group of a
    process below the server (cgroup v1 or v2)."""
    groups = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not below(int(entry), server_pid):
            continue
        try:
            with open(f"/proc/{entry}/cgroup") as f:
                lines = f.read().splitlines()
            with open(f"/proc/{entry}/smaps_rollup") as f:
                pss = next(int(l.split()[1]) for l in f if l.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
        for line in lines:
            _, controllers, path = line.split(":", 2)
            name = path.rsplit("/", 1)[-1]
            if not (name.startswith("warm-") or name.startswith("zygote-")):
                continue
            if controllers == "" or "memory" in controllers.split(","):
                root = "/sys/fs/cgroup" if controllers == "" else "/sys/fs/cgroup/memory"
                group = groups.setdefault(name, [root + path, 0])
                group[1] += pss
    out = {}
    for name, (path, pss) in groups.items():
        for file in ("memory.usage_in_bytes", "memory.current"):
            try:
                with open(os.path.join(path, file)) as f:
                    out[name] = (int(f.read()) // 1024, pss)
                break
            except OSError:
                continue
    return out


def mean(values):
    return sum(values) // len(values) if values else 0


def record_pool_memory(memory, name, server_pid):
    """Adds the memory rows of one server's waiting sandboxes (and zygote) to `memory`."""
    groups = pool_memory(server_pid)
    waiting = [v for k, v in groups.items() if k.startswith("warm-")]
    zygotes = [v for k, v in groups.items() if k.startswith("zygote-")]
    if waiting:
        memory[f"{name}: memory charged per waiting sandbox (cgroup, mean)"] = mean([c for c, _ in waiting])
        memory[f"{name}: PSS per waiting sandbox (its processes, mean)"] = mean([p for _, p in waiting])
    if zygotes:
        memory[f"{name}: the zygote's own sandbox (cgroup)"] = mean([c for c, _ in zygotes])
        memory[f"{name}: the zygote's own sandbox (PSS)"] = mean([p for _, p in zygotes])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--airlock", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--runs", type=int, default=30, help="sequential runs per contender and job")
    p.add_argument("--jobs", type=int, default=40, help="jobs per throughput level")
    p.add_argument("--levels", default="1,2,8")
    p.add_argument("--image", default="", help="the container backends' image, REF@sha256:...")
    p.add_argument("--warm-pool", type=int, default=4)
    p.add_argument("--only", default="", help="comma-separated contender names")
    p.add_argument("--sandboxes", type=int, default=300,
                   help="jobs per round of the sandboxes-per-second table (0: no table)")
    args = p.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    work = args.work
    for job, code in {**JOBS, **SANDBOX_JOBS}.items():
        with open(os.path.join(work, f"{job}.py"), "w") as f:
            f.write(code)
    os.chmod(work, 0o755)

    airlock = args.airlock
    policy_plain = os.path.join(work, "policy.toml")
    image_line = f'rootfs = "image:{args.image}"' if args.image else ""
    with open(policy_plain, "w") as f:
        f.write(f'version = "bench-1"\n[audit]\npath = "{work}/audit.jsonl"\nfsync = false\n')
    policy_image = os.path.join(work, "policy-image.toml")
    with open(policy_image, "w") as f:
        f.write(f'version = "bench-1"\n[filesystem]\n{image_line}\n[audit]\npath = "{work}/audit.jsonl"\nfsync = false\n')
    policy_full = os.path.join(work, "policy-host-full.toml")
    with open(policy_full, "w") as f:
        f.write(f'version = "bench-1"\n[filesystem]\nrootfs = "host-full"\n'
                f'[audit]\npath = "{work}/audit.jsonl"\nfsync = false\n')
    podman_socket = os.environ.get("AIRLOCK_PODMAN_SOCKET", "/run/podman/podman.sock")
    with open(policy_image, "a") as f:
        f.write(f'[docker]\npodman_socket = "{podman_socket}"\n')

    def policy_warm_containers(key):
        path = os.path.join(work, f"policy-{key}.toml")
        with open(path, "w") as f:
            f.write(f'version = "bench-1"\n[filesystem]\n{image_line}\n'
                    f'[docker]\npodman_socket = "{podman_socket}"\n{key} = {args.warm_pool}\n'
                    f'[audit]\npath = "{work}/audit.jsonl"\nfsync = false\n')
        return path

    policy_warm = os.path.join(work, "policy-warm.toml")
    with open(policy_warm, "w") as f:
        f.write(f'version = "bench-1"\n[native]\nwarm_pool = {args.warm_pool}\nzygote = false\n'
                f'[audit]\npath = "{work}/audit.jsonl"\nfsync = false\n')
    policy_zygote = os.path.join(work, "policy-zygote.toml")
    with open(policy_zygote, "w") as f:
        f.write(f'version = "bench-1"\n[native]\nwarm_pool = {args.warm_pool}\nzygote = true\n'
                f'[audit]\npath = "{work}/audit.jsonl"\nfsync = false\n')

    def py(job):
        return [PYTHON, "-I", os.path.join(work, f"{job}.py")]

    def bwrap_running(*program):
        return ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
                "--setenv", "PATH", "/usr/bin:/bin", "--ro-bind", "/usr", "/usr",
                "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev",
                "--tmpfs", "/tmp", "--ro-bind", work, "/work", "--chdir", "/work",
                "--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL",
                *program]

    def bwrap(job):
        return bwrap_running(PYTHON, "-I", f"/work/{job}.py")

    ref = ["--network", "none", "--read-only", "--tmpfs", "/tmp:rw,noexec,nosuid,size=16m",
           "--user", "65534:65534", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
           "--memory", "256m", "--memory-swap", "256m", "--cpus", "1", "--pids-limit", "64",
           "-v", f"{work}:/work:ro", "-w", "/work"]
    image_id = args.image.split("@", 1)[1] if "@" in args.image else ""

    def docker(runtime):
        def argv(job):
            extra = ["--runtime", runtime] if runtime else []
            return ["docker", "run", "--rm", *extra, *ref, image_id, "python3", "-I", f"/work/{job}.py"]
        return argv

    def airlock_run(backend, policy):
        def argv(job):
            return [airlock, "run", "--json", "--backend", backend, "--policy", policy,
                    os.path.join(work, f"{job}.py")]
        return argv

    contenders = [
        Contender("python3", py, note="the bare interpreter on the host: the baseline"),
        Contender("bwrap", bwrap, note="no cgroup limits, no seccomp"),
        Contender("docker run", docker(None)),
        Contender("docker run runsc", docker("runsc")),
        Contender("airlock native", airlock_run("native", policy_plain),
                  note="the minimal root"),
        Contender("airlock native host-full", airlock_run("native", policy_full)),
        Contender("airlock docker", airlock_run("docker", policy_image)),
        Contender("airlock gvisor", airlock_run("gvisor", policy_image)),
        Contender("airlock podman", airlock_run("podman", policy_image)),
        Contender("serve cold", note="HTTP, a fresh sandbox per job"),
        Contender("serve warm", note=f"HTTP, warm_pool = {args.warm_pool}"),
        Contender("serve zygote", note=f"HTTP, warm_pool = {args.warm_pool}, zygote = true"),
        Contender("airlock docker warm", backend="docker", warm_key="warm_pool",
                  note=f"HTTP, [docker] warm_pool = {args.warm_pool}"),
        Contender("airlock gvisor warm", backend="gvisor", warm_key="gvisor_warm_pool",
                  note=f"HTTP, [docker] gvisor_warm_pool = {args.warm_pool}"),
    ]
    if not shutil.which("bwrap"):
        contenders[1].missing = "bwrap is not installed"
    docker_ok = subprocess.run(["docker", "version"], capture_output=True).returncode == 0
    runtimes = ""
    if docker_ok:
        runtimes = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"],
                                  capture_output=True, text=True).stdout
    for c in contenders:
        if c.name in ("docker run", "docker run runsc", "airlock docker", "airlock gvisor",
                      "airlock docker warm", "airlock gvisor warm"):
            if not docker_ok:
                c.missing = "no Docker daemon"
            elif not image_id:
                c.missing = "no image (--image; scripts/ci/docker.sh builds airlock-test:bookworm)"
            elif "runsc" in c.name or "gvisor" in c.name:
                if "runsc" not in runtimes:
                    c.missing = "Docker has no runsc runtime"
        if c.name == "airlock podman":
            if not os.path.exists(podman_socket):
                c.missing = f"no Podman service socket at {podman_socket}"
            elif not image_id:
                c.missing = "no image"
    if args.only:
        wanted = set(args.only.split(","))
        for c in contenders:
            if c.name not in wanted and c.name != "python3" and not c.missing:
                c.missing = "not selected (--only)"

    cold = {}
    for name, policy in (("airlock native", policy_plain), ("airlock native host-full", policy_full)):
        if name in {c.name for c in contenders if c.missing}:
            continue
        log(f"== cold start: {name}, {COLD_RUNS} runs, each with an empty cache directory")
        cold[name] = cold_start(airlock, policy, work, name)

    observation = None
    if "airlock native" not in {c.name for c in contenders if c.missing}:
        log(f"== the observation before the removal: airlock native, {args.runs} runs")
        observation = observation_then_exit(airlock, policy_plain, work, args.runs)

    servers = []
    memory = {}
    sandbox_rates = {}
    pool_totals = {}
    try:
        by_name = {c.name: c for c in contenders}
        if not by_name["serve cold"].missing:
            proc, addr = start_server(airlock, policy_plain, work, "cold")
            servers.append(proc)
            by_name["serve cold"].server = addr
            time.sleep(0.5)
            memory["server idle RSS (no pool)"] = rss_kib(proc.pid)
            by_name["serve cold"].pid = proc.pid
        for name, policy, kind in (("serve warm", policy_warm, "warm"),
                                   ("serve zygote", policy_zygote, "zygote")):
            if by_name[name].missing:
                continue
            proc, addr = start_server(airlock, policy, work, kind)
            servers.append(proc)
            by_name[name].server = addr
            deadline = time.time() + 60
            while metric(addr, "airlock_warm_pool_ready") < args.warm_pool:
                if time.time() > deadline:
                    raise SystemExit(f"{name}: the warm pool never filled")
                time.sleep(0.1)
            time.sleep(0.5)
            memory[f"{name}: server RSS with {args.warm_pool} sandboxes waiting"] = rss_kib(proc.pid)
            record_pool_memory(memory, name, proc.pid)
        for c in contenders:
            if not c.warm_key or c.missing:
                continue
            proc, addr = start_server(airlock, policy_warm_containers(c.warm_key), work,
                                      c.backend + "-warm", backend=c.backend)
            servers.append(proc)
            c.server = addr
            wait_ready(addr, args.warm_pool)
            time.sleep(0.5)
            per = warm_containers(c.backend)
            if per:
                memory[f"memory charged per waiting {c.backend} container (cgroup, mean of {len(per)})"] = sum(per) // len(per)

        runnable = [c for c in contenders if not c.missing]
        processes = [c for c in runnable if c.argv_for]
        http_ones = [c for c in runnable if c.server]
        lat = {}
        rates = {}
        loaded = {}
        warm_hits = {}
        lat_b2b = {}
        for job in JOBS:
            log(f"== latency, job {job}: hyperfine over {len(processes)} commands, {args.runs} runs each")
            for name, times in latency_hyperfine(processes, job, args.runs, 3, work).items():
                lat[(name, job)] = times
            for c in http_ones:
                log(f"== latency, job {job}: {c.name}")
                if not c.warm_key:
                    lat[(c.name, job)] = latency_http(c, job, args.runs, 3)
                    continue
                # A warm container row: each job once the pool is full again, as an agent's
                # turns seconds apart find it (its refills done); then back to back, each
                # job as soon as one container is ready, while the daemon still creates
                # and starts the replacements of the ones before.
                before = metric(c.server, HIT_SERIES)
                lat[(c.name, job)] = latency_http(c, job, args.runs, 3, args.warm_pool)
                lat_b2b[(c.name, job)] = latency_http(c, job, args.runs, 3, 1)
                warm_hits[(c.name, job)] = (metric(c.server, HIT_SERIES) - before, 2 * (args.runs + 3))
            for c in runnable:
                for n in levels:
                    jobs = args.jobs if "docker" not in c.name and "gvisor" not in c.name and "podman" not in c.name else max(n * 2, args.jobs // 2)
                    log(f"== throughput, job {job}: {c.name}, {n} in flight, {jobs} jobs")
                    if c.name == "serve cold" and job == "sum" and n == max(levels):
                        peak = [0]
                        stop = threading.Event()

                        def sample(pid=c.pid):
                            while not stop.is_set():
                                peak[0] = max(peak[0], rss_kib(pid))
                                time.sleep(0.005)
                        t = threading.Thread(target=sample)
                        t.start()
                        rates[(c.name, job, n)], loaded[(c.name, job, n)] = throughput(c, job, jobs, n)
                        stop.set()
                        t.join()
                        memory[f"server peak RSS with {n} clients (cold, at most {os.cpu_count()} jobs in flight)"] = peak[0]
                    else:
                        rates[(c.name, job, n)], loaded[(c.name, job, n)] = throughput(c, job, jobs, n)
        for c in runnable:
            if c.warm_key:
                pool_totals[c.name] = (metric(c.server, HIT_SERIES), metric(c.server, MISS_SERIES))
        # Sandboxes per second the way peers publish it (issue 35): each a fresh sandbox
        # that runs `python3 -c pass` and is destroyed, at saturation.
        sandbox_clients = 4 * (os.cpu_count() or 1)
        if args.sandboxes and not by_name["serve zygote"].missing:
            sandbox_rows = [Contender("python3 -c pass", lambda _job: [PYTHON, "-I", "-c", "pass"])]
            if not by_name["bwrap"].missing:
                sandbox_rows.append(Contender("bwrap --unshare-all python3 -c pass",
                                              lambda _job: bwrap_running(PYTHON, "-I", "-c", "pass")))
            sandbox_rows.append(by_name["serve zygote"])
            for c in sandbox_rows:
                log(f"== sandboxes per second: {c.name}, {sandbox_clients} in flight, "
                    f"3 rounds of {args.sandboxes}")
                sandbox_rates[c.name] = sandboxes_per_second(c, args.sandboxes, sandbox_clients,
                                                             3, args.warm_pool)
    finally:
        for proc in servers:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()

    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPUs ({cpu}); "
          f"{platform.system()} {platform.release()}; load average at the end {load[0]:.2f}; "
          f"{args.runs} sequential runs per row after 3 warm-ups; throughput over {args.jobs} jobs "
          f"per level (containers: half as many, at least two per slot)\n")
    for job in JOBS:
        base = lat.get(("python3", job))
        base_rate = {n: rates.get(("python3", job, n)) for n in levels}
        print(f"### Job `{job}`\n")
        head = "| contender | median ms | p90 ms | × python3 (median) |"
        rule = "|:---|---:|---:|---:|"
        for n in levels:
            head += f" jobs/s @{n} | × python3 @{n} |"
            rule += "---:|---:|"
        print(head)
        print(rule)
        for c in contenders:
            if c.missing:
                continue
            times = lat[(c.name, job)]
            med = statistics.median(times) * 1000
            row = f"| {c.name} | {med:.1f} | {percentile(times, 90) * 1000:.1f} | {med / (statistics.median(base) * 1000):.2f} |"
            for n in levels:
                r = rates[(c.name, job, n)]
                row += f" {r:.1f} | {r / base_rate[n]:.2f} |"
            print(row)
        print()
        print(f"Latency under load, job `{job}`: each job's time, from the throughput runs above "
              "(p99 of a few dozen jobs is close to their maximum)\n")
        head = "| contender |"
        rule = "|:---|"
        for n in levels:
            head += f" p50 ms @{n} | p99 ms @{n} |"
            rule += "---:|---:|"
        print(head)
        print(rule)
        for c in contenders:
            if c.missing:
                continue
            row = f"| {c.name} |"
            for n in levels:
                t = loaded[(c.name, job, n)]
                row += f" {statistics.median(t) * 1000:.1f} | {percentile(t, 99) * 1000:.1f} |"
            print(row)
        print()
    if cold:
        print("Cold and warm start, job `sum`: cold is the first job with an empty cache "
              "directory (the minimal root is copied from the host then; host-full has nothing "
              f"to prepare), median of {COLD_RUNS}; warm is the median above, the copy in place\n")
        print("| root | cold ms | warm ms |\n|:---|---:|---:|")
        for name, times in cold.items():
            warm = statistics.median(lat[(name, "sum")]) * 1000 if (name, "sum") in lat else float("nan")
            print(f"| {name} | {statistics.median(times) * 1000:.0f} | {warm:.1f} |")
        print()
    if pool_totals:
        print("Warm containers: the rows above send each job once the pool is full again (its "
              "refills done, as an agent's turns seconds apart find it). Back to back, each job "
              "as soon as one container is ready while the daemon creates and starts the "
              "replacements (its work is not in any container's cgroup, so it competes):\n")
        print("| contender | job | median ms (pool full) | median ms (back to back) | p90 ms (back to back) |")
        print("|:---|:---|---:|---:|---:|")
        for (name, job), times in lat_b2b.items():
            print(f"| {name} | `{job}` | {statistics.median(lat[(name, job)]) * 1000:.1f} | "
                  f"{statistics.median(times) * 1000:.1f} | {percentile(times, 90) * 1000:.1f} |")
        print()
        for name, (hit, miss) in pool_totals.items():
            seq = "; ".join(f"`{job}` {int(h)} of {n}" for (n_, job), (h, n) in warm_hits.items() if n_ == name)
            print(f"- {name}: sequential jobs run warm: {seq}; over every run {int(hit)} warm, "
                  f"{int(miss)} in a fresh container (throughput runs: none ready)")
        print()
        for warm, rival in (("airlock docker warm", "docker run"), ("airlock gvisor warm", "docker run runsc")):
            for job in JOBS:
                if (warm, job) in lat and (rival, job) in lat:
                    ratio = statistics.median(lat[(warm, job)]) / statistics.median(lat[(rival, job)])
                    print(f"- `{job}`: {warm} median / {rival} median = {ratio:.2f} (issue 18's target: 0.2 or less)")
        print()
    if sandbox_rates:
        base = sandbox_rates["python3 -c pass"]
        print(f"Sandboxes per second (issue 35): each job `pass` in a sandbox of its own, made, "
              f"run and destroyed, {4 * (os.cpu_count() or 1)} in flight, median of 3 rounds of "
              f"{args.sandboxes}; `serve zygote` forks each from the zygote, with fresh "
              "namespaces, cgroup, root and filters, and a round ends once every sandbox is "
              "removed; python3 has no sandbox at all, bwrap no cgroup and no seccomp\n")
        print("| contender | sandboxes/s | × python3 |\n|:---|---:|---:|")
        for name, rate in sandbox_rates.items():
            print(f"| {name} | {rate:.1f} | {rate / base:.2f} |")
        print()
    if observation:
        read, exited = observation
        gap = [e - r for r, e in zip(read, exited)]
        print("`airlock run --json`, job `sum`: when the observation is read (stdout ends once it "
              "is printed) and when the process exits (after the sandbox's removal), median of "
              f"{len(read)}\n")
        print("| contender | observation ms | exit ms | exit − observation ms |\n|:---|---:|---:|---:|")
        print(f"| airlock native | {statistics.median(read) * 1000:.1f} | "
              f"{statistics.median(exited) * 1000:.1f} | {statistics.median(gap) * 1000:.1f} |")
        print()
    skipped = [c for c in contenders if c.missing]
    if skipped:
        print("Not run: " + "; ".join(f"{c.name} ({c.missing})" for c in skipped) + "\n")
    if memory:
        print("| memory | KiB |\n|:---|---:|")
        for k, v in memory.items():
            print(f"| {k} | {v} |")
        print()


if __name__ == "__main__":
    main()
