"""Reads drive.py's jobs and perf's events (trace.sh) and prints, per step of a forked
job's end, its median time after the job's last line: the job's exit_group and exit,
pid 1's wait4 returning and its status write, the exits of pid 1 and the leader (the
two `init` processes, in that order), and the reply. Matching is by order in a window
from the job's last line to the reply: run it with nothing else starting python3 or
init processes, or read the counts (n) it prints."""
import json, sys, statistics as st
rows = json.load(open(sys.argv[1]))
ev = []
for line in open(sys.argv[2]):
    parts = line.split()
    # comm pid/tid time: event:
    try:
        i = next(k for k, p in enumerate(parts) if p.endswith(":") and p[:-1].replace(".", "").isdigit())
    except StopIteration:
        continue
    t = int(float(parts[i][:-1]) * 1e9)
    comm = " ".join(parts[:i-1]) if "/" in parts[i-1] else " ".join(parts[:i-2])
    pid = parts[i-1]
    ev.append((t, comm, pid, parts[i+1].rstrip(":")))
ev.sort()
cols = {}
for r in rows:
    last, t1 = r["last"], r["t1"]
    win = [(t, c, p, e) for t, c, p, e in ev if last <= t <= t1 + 3_000_000 and c in ("python3", "init")]
    # the job: first python3 exit_group after last line
    marks = {}
    for t, c, p, e in win:
        key = None
        if c == "python3" and e == "syscalls:sys_enter_exit_group" and "job_exit_group" not in marks:
            key = "job_exit_group"
        elif c == "python3" and e == "sched:sched_process_exit" and "job_exit" not in marks:
            key = "job_exit"
        elif c == "init" and e == "sched:sched_process_exit":
            key = "init_exit_1" if "init_exit_1" not in marks else ("init_exit_2" if "init_exit_2" not in marks else None)
        elif c == "init" and e == "syscalls:sys_exit_wait4" and "pid1_wait_returns" not in marks:
            key = "pid1_wait_returns"
        elif c == "init" and e == "syscalls:sys_enter_write" and "pid1_status_write" not in marks:
            key = "pid1_status_write"
        elif c == "init" and e == "syscalls:sys_enter_exit_group":
            key = "init_eg_1" if "init_eg_1" not in marks else ("init_eg_2" if "init_eg_2" not in marks else None)
        if key:
            marks[key] = (t - last) / 1e6
    marks["reply"] = (t1 - last) / 1e6
    marks["send_to_last"] = (last - r["t0"]) / 1e6
    marks["total"] = (t1 - r["t0"]) / 1e6
    for k, v in marks.items():
        cols.setdefault(k, []).append(v)
for k in ["send_to_last", "job_exit_group", "job_exit", "pid1_wait_returns", "pid1_status_write", "init_eg_1", "init_exit_1", "init_eg_2", "init_exit_2", "reply", "total"]:
    if k in cols:
        v = cols[k]
        print(f"{k:16s} n={len(v):3d} median {st.median(v):7.3f} ms  (p25 {sorted(v)[len(v)//4]:.3f}, p75 {sorted(v)[3*len(v)//4]:.3f})")
