def _airlock_zygote_preload(names):
    # The preload, with the native thread pools that libraries size at import (OpenBLAS,
    # OpenMP, MKL, numexpr, BLIS, Accelerate) pinned to one thread: the zygote must stay a
    # single thread to fork. The job's own environment is back in place afterwards.
    if not names:
        return
    import os
    pinned = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS",
              "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS", "NUMEXPR_MAX_THREADS",
              "VECLIB_MAXIMUM_THREADS", "BLIS_NUM_THREADS")
    saved = {name: os.environ.get(name) for name in pinned}
    os.environ.update({name: "1" for name in pinned})
    try:
        _airlock_preload(names)
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _airlock_zygote():
    # airlock's zygote (crates/airlock-native/src/zygote.rs, docs/speed.md): it never runs
    # job code. It reads its children's plan from the host, then forks one child per
    # request. A child builds its own sandbox (cgroup, user namespace, namespaces, mounts,
    # pid 1, then the job process: rlimits, no capability, uid 65534, no_new_privs, both
    # seccomp filters), and only the job process returns from here, to _airlock_run().
    # Every step is checked; a failure is reported on the child's status pipe, naming the
    # step, and ends that process.
    import os, sys
    keep = frozenset(sys.modules)
    # What a kernel session's driver imports (zygote.rs KERNEL_MODULES): a child forked
    # for a kernel keeps them, as a fresh kernel has them once started.
    for name in {KERNEL_MODULES}:
        __import__(name)
    kernel_keep = frozenset(sys.modules)
    import gc
    import ctypes, fcntl, json, resource, select, socket, struct, time

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]
    libc.unshare.argtypes = [ctypes.c_int]

    control = 6
    new = {"user": 0x10000000, "mount": 0x20000, "cgroup": 0x02000000, "uts": 0x04000000,
           "ipc": 0x08000000, "pid": 0x20000000, "net": 0x40000000}
    ms_rdonly, ms_nosuid, ms_nodev, ms_noexec = 1, 2, 4, 8
    ms_remount, ms_bind, ms_rec, ms_private = 32, 4096, 16384, 1 << 18
    # statvfs flags and the mount flags a bind remount must repeat.
    st_to_ms = [(1, 1), (2, 2), (4, 4), (8, 8), (1024, 1024), (2048, 2048), (4096, 1 << 21)]
    pr_set_pdeathsig, pr_set_dumpable, pr_set_seccomp, pr_capbset_drop = 1, 4, 22, 24
    pr_set_no_new_privs, pr_cap_ambient, pr_cap_ambient_clear_all = 38, 47, 4
    seccomp_mode_filter = 2
    sys_capset, sys_move_mount = 126, 429
    move_mount_f_empty_path, at_fdcwd = 4, -100
    rlimits = {"Nofile": resource.RLIMIT_NOFILE, "Fsize": resource.RLIMIT_FSIZE,
               "Core": resource.RLIMIT_CORE, "Cpu": resource.RLIMIT_CPU,
               "As": resource.RLIMIT_AS, "Nproc": resource.RLIMIT_NPROC,
               "Msgqueue": resource.RLIMIT_MSGQUEUE, "Sigpending": resource.RLIMIT_SIGPENDING}

    class Failure(Exception):
        def __init__(self, step, errno, detail):
            super().__init__(step)
            self.step, self.errno, self.detail = step, errno, detail

    def fail(step, detail, errno=None):
        raise Failure(step, errno, detail)

    def checked(rc, step):
        if rc < 0:
            e = ctypes.get_errno()
            raise Failure(step, e, os.strerror(e))
        return rc

    def step(name, fn, *args):
        try:
            return fn(*args)
        except Failure:
            raise
        except OSError as e:
            raise Failure(name, e.errno, e.strerror or str(e))
        except Exception as e:
            raise Failure(name, None, repr(e))

    def report(status, event):
        line = (json.dumps(event) + "\n").encode()
        try:
            os.write(status, line[:2047] if len(line) < 2048 else line[:2046] + b"\n")
        except OSError:
            pass

    def failed(status, e):
        if not isinstance(e, Failure):
            e = Failure("zygote child", None, repr(e))
        report(status, {"event": "failed", "step": e.step, "errno": e.errno,
                        "detail": str(e.detail)[:1000]})

    def run(status, fn, *args):
        # Runs one process's part; only the job process returns (True), every other one
        # ends here.
        try:
            if fn(*args) is True:
                return True
        except BaseException as e:
            failed(status, e)
            os._exit(1)
        os._exit(0)

    def unshare(what):
        flags = 0
        for name in what:
            flags |= new[name]
        checked(libc.unshare(flags), "unshare " + "/".join(what) + " namespaces")

    def mount(source, target, fstype, flags, data, name):
        enc = lambda v: None if v is None else v.encode()
        checked(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), name)

    def flags_of(options):
        f = 0
        for key, bit in (("readonly", ms_rdonly), ("nosuid", ms_nosuid), ("nodev", ms_nodev),
                         ("noexec", ms_noexec)):
            if options[key]:
                f |= bit
        return f

    def remount_bind(path, options):
        existing = step("statvfs " + path, os.statvfs, path).f_flag
        kept = 0
        for st, ms in st_to_ms:
            if existing & st:
                kept |= ms
        mount(None, path, None, ms_remount | ms_bind | kept | flags_of(options), None,
              "remount " + path)

    def apply_mount(s):
        op, target = s["op"], "/" + s["target"]
        if op == "tmpfs":
            data = "size=%d,mode=%o" % (s["size_bytes"], s["mode"])
            if s.get("inodes") is not None:
                data += ",nr_inodes=%d" % s["inodes"]
            if s.get("owner") is not None:
                data += ",uid=%d,gid=%d" % (s["owner"], s["owner"])
            mount("tmpfs", target, "tmpfs", flags_of(s["options"]), data, "mount tmpfs " + target)
        elif op == "proc":
            mount("proc", target, "proc", ms_nosuid | ms_nodev | ms_noexec, None,
                  "mount proc " + target)
        elif op == "mask":
            try:
                mode = os.lstat(target).st_mode
            except FileNotFoundError:
                return
            except OSError as e:
                raise Failure("stat " + target, e.errno, e.strerror)
            if mode & 0o170000 == 0o040000:
                mount("tmpfs", target, "tmpfs", ms_rdonly | ms_nosuid | ms_nodev | ms_noexec,
                      "size=4k,mode=0555", "mask " + target)
            else:
                mount("/dev/null", target, None, ms_bind, None, "mask " + target)
                remount_bind(target, {"readonly": True, "nosuid": True, "nodev": True,
                                      "noexec": True})
        elif op == "readonly_bind":
            if not os.path.lexists(target):
                return
            mount(target, target, None, ms_bind | ms_rec, None, "bind " + target)
            remount_bind(target, {"readonly": True, "nosuid": True, "nodev": True,
                                  "noexec": True})
        else:
            fail("mount plan", "a child cannot apply a %r step" % op)

    def bring_up_loopback():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            got = fcntl.ioctl(s, 0x8913, struct.pack("16sh22x", b"lo", 0))
            current = struct.unpack("16sh22x", got)[1]
            fcntl.ioctl(s, 0x8914, struct.pack("16sh22x", b"lo", current | 0x1 | 0x40))
        finally:
            s.close()

    def status_fields():
        fields = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        return fields

    def thread_count():
        return len(os.listdir("/proc/self/task"))

    # The children's plan (SandboxPlan's part for them, zygote.rs ChildPlan), then ready.
    # What a job process removes from sys.modules: listed here, once, rather than by
    # looking at every entry in each child (which would copy the pages of them all).
    machinery = tuple(name for name in sys.modules if name not in keep)
    kernel_machinery = tuple(name for name in machinery if name not in kernel_keep)
    sock = socket.socket(fileno=control)
    # The plan, and the sandbox init's executable (a sealed memfd) if the host has one.
    data, init_program, flags, _ = socket.recv_fds(sock, 1 << 20, 1, socket.MSG_CMSG_CLOEXEC)
    if not data or flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        os._exit(2)
    plan = json.loads(data)
    seccomp = [bytes.fromhex(program) for program in plan["seccomp"]]
    fds_per_child = 7 + plan["cgroup_procs"]
    threads = thread_count()
    if threads != 1:
        sock.send(b"error: the zygote has %d threads after its imports" % threads)
        os._exit(3)
    # Every child then finds the built-in compile()'s AST types made (run_job.py).
    compile("", "<airlock>", "exec", dont_inherit=True)
    sock.send(b"ready")

    # The init's executable in a child (its descriptor there), once child() moved it.
    reaper = []
    # A fork for a session's job (zygote.rs SessionMounts): the session's /tmp (its
    # descriptor in the child) and the job's CPU-time limit, set in the child only.
    session = {}

    def child(fds, mapping, threads_at_fork, own):
        # The sandbox leader, in the template's namespaces, as the template's root.
        # Descriptors: [stdin, stdout, stderr, status, control, handoff, work, *procs], and
        # the two ends of its id mapping with the zygote: [ask, done]; for a session's job,
        # its /tmp's mount (or None) and CPU-time limit in `own`.
        floor = 1 + max(int(n) for n in os.listdir("/proc/self/fd"))
        fds = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in fds]
        mapping = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in mapping]
        if own is not None:
            session["cpu"] = own["cpu"]
            session["kernel"] = own["kernel"]
            if own["tmp"] is not None:
                session["tmp"] = fcntl.fcntl(own["tmp"], fcntl.F_DUPFD_CLOEXEC, floor)
        reaper[:] = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, floor) for fd in init_program]
        os.closerange(0, floor)
        for number, fd in enumerate(fds[:3]):
            os.dup2(fd, number)
            os.close(fd)
        status, job_control, handoff, work = fds[3:7]
        return run(status, leader, status, job_control, handoff, work, fds[7:], mapping,
                   threads_at_fork)

    def become_reaper(child, report, ready=None):
        # Once the sandbox is built, the leader and pid 1 only wait: as the sandbox init
        # (`init reap`, init.rs) rather than as forks of this interpreter, so that their
        # exits, between the job's and its reply, do not free the interpreter's whole
        # address space. Where that cannot be executed, this process waits as it is.
        if not reaper:
            return
        argv = ["init", "reap", str(child), "report" if report else "quiet"]
        if ready is not None:
            argv.append(str(ready))
        try:
            os.execve(reaper[0], argv, {})
        except OSError:
            pass

    def leader(status, job_control, handoff, work, procs, mapping, threads_at_fork):
        if threads_at_fork != 1:
            fail("check the zygote's threads",
                 "the zygote had %d threads when it forked" % threads_at_fork)
        # 1. Into the job's cgroup, first thing, so every later process is counted. (How
        #    long the move took goes to the host's debug log: docs/speed.md.)
        moving = time.monotonic_ns()
        for fd in procs:
            step("join the job's cgroup", os.write, fd, b"0")
            os.close(fd)
        moved_us = (time.monotonic_ns() - moving) // 1000
        # 2. The host holds a pidfd of this process from here on.
        register = socket.socket(fileno=handoff)
        pidfd = step("open a pidfd", os.pidfd_open, os.getpid())
        step("register with the host", socket.send_fds, register, [b"p%d" % moved_us],
             [pidfd])
        os.close(pidfd)
        # 3. A user namespace of its own, mapped by the zygote, which is still in the
        #    template's (a namespace's ids are written from its parent), so that the
        #    per-user counts of the job's uid are this sandbox's alone. The zygote writes
        #    them when asked, rather than a fork of this process doing it: one fork of the
        #    interpreter less per sandbox (its copied pages, its exit).
        ask, done = mapping
        step("unshare user namespace", unshare, ["user"])
        os.write(ask, b"m")
        os.close(ask)
        answer = os.read(done, 256)
        os.close(done)
        if answer != b"k":
            fail("map the user namespace's ids",
                 "the zygote could not write them: %s" % answer.decode(errors="replace"))
        # 4. The other namespaces, owned by it; the pid namespace is pid 1's, below.
        unshare(["mount", "cgroup", "net", "ipc", "uts", "pid"])
        # 5. A fresh /tmp, /dev/shm and /out over the template's, and the job's /work
        #    (and a session's own /tmp in place of the fresh one).
        mount(None, "/", None, ms_rec | ms_private, None, "make mounts private")
        session_tmp = session.pop("tmp", None)
        work_options = plan["session_work"] if "cpu" in session else plan["work"]
        for s in plan["mounts"]:
            if session_tmp is not None and s["op"] == "tmpfs" and s["target"] == "tmp":
                continue
            apply_mount(s)
        attached = [(work, "/work", work_options)]
        if session_tmp is not None:
            attached.append((session_tmp, "/tmp", plan["session_tmp"]))
        for fd, target, options in attached:
            checked(libc.syscall(sys_move_mount, fd, b"", at_fdcwd, target.encode(),
                                 move_mount_f_empty_path), "mount the job's " + target)
            os.close(fd)
            # The job's view is a bind of it: a read-only /work leaves the host's
            # descriptor of the job's tmpfs writable (the job is written through it after
            # this fork).
            mount(target, target, None, ms_bind, None, "bind %s onto itself" % target)
            remount_bind(target, options)
        step("sethostname", socket.sethostname, plan["hostname"])
        if plan["loopback_up"]:
            step("bring up lo", bring_up_loopback)
        # 6. pid 1 of the new pid namespace, which dies with this process.
        alive_read, alive_write = os.pipe()
        init = os.fork()
        if init == 0:
            os.close(alive_write)
            return run(status, pid1, status, alive_read, register, job_control)
        os.close(alive_read)
        register.close()
        for fd in (status, job_control):
            os.close(fd)
        null = os.open(os.devnull, os.O_RDWR)
        for number in (0, 1, 2):
            os.dup2(null, number)
        os.close(null)
        # pid 1 knows this process gone when the pipe hangs up: kept across the exec.
        os.set_inheritable(alive_write, True)
        become_reaper(init, False)
        os.waitpid(init, 0)
        os.close(alive_write)

    def map_ids(leader_pid, ask, done):
        # A child's leader asked (it has entered its user namespace) or ended: the ids of
        # its namespace, 1:1 onto the template's. Its answer: "k", or why not.
        try:
            if os.read(ask, 1) != b"m":
                return
            try:
                for name in ("uid_map", "gid_map"):
                    with open("/proc/%d/%s" % (leader_pid, name), "w") as f:
                        f.write(plan[name])
                answer = b"k"
            except OSError as e:
                answer = ("write %s: %s" % (name, e.strerror or e)).encode()[:200]
            os.write(done, answer)
        except OSError:
            pass
        finally:
            os.close(ask)
            os.close(done)

    def pid1(status, alive, register, job_control):
        checked(libc.prctl(pr_set_pdeathsig, 9, 0, 0, 0), "set parent death signal")
        if select.select([alive], [], [], 0)[0]:
            fail("check the sandbox leader", "the leader is gone")
        os.close(alive)
        # The namespace's own /proc, its per-user counts, then the masks.
        proc_steps = plan["proc"]
        apply_mount(proc_steps[0])
        for name, value in plan["user_namespace_limits"]:
            path = "/proc/sys/user/" + name
            try:
                with open(path, "w") as f:
                    f.write(str(value))
            except FileNotFoundError:
                pass
            except OSError as e:
                raise Failure("write " + path, e.errno, e.strerror)
        for s in proc_steps[1:]:
            apply_mount(s)
        # The host holds a pidfd of this process too, and takes its end for the job's: the
        # kernel reports pid 1 of a namespace gone only once it has killed and reaped every
        # other process in it, so nothing of the job runs then, and the leader's exit (the
        # namespaces torn down) is left off the reply's path.
        pidfd = step("open a pidfd", os.pidfd_open, os.getpid())
        step("register with the host", socket.send_fds, register, [b"p0"], [pidfd])
        os.close(pidfd)
        if plan["send_out_dir"]:
            out = step("open /out", os.open, "/out",
                       os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            step("hand over /out", socket.send_fds, register, [b"h"], [out])
            os.close(out)
        register.close()
        ready_read, ready_write = os.pipe()
        job = os.fork()
        if job == 0:
            os.close(ready_read)
            return job_process(status, ready_write, job_control)
        os.close(ready_write)
        os.close(job_control)
        null = os.open(os.devnull, os.O_RDWR)
        for number in (0, 1, 2):
            os.dup2(null, number)
        os.close(null)
        if reaper:
            # The reaper reports on the status descriptor's usual number (plan.rs
            # STATUS_FD), and says the sandbox started once the job process is ready: the
            # exec is done before the sandbox counts as ready.
            status, ready_read = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
                                  for fd in (status, ready_read)]
            os.dup2(status, {STATUS_FD})
            os.dup2(ready_read, {STATUS_FD} + 1)
            os.close(ready_read)
            os.close(status)
            status, ready_read = {STATUS_FD}, {STATUS_FD} + 1
            become_reaper(job, True, ready_read)
        if not os.read(ready_read, 1):
            report(status, {"event": "started"})
        os.close(ready_read)
        while True:
            pid, code = os.wait()
            if pid != job:
                continue
            used = resource.getrusage(resource.RUSAGE_CHILDREN)
            usage = {"cpu_ms": int((used.ru_utime + used.ru_stime) * 1000),
                     "max_rss_bytes": used.ru_maxrss * 1024}
            if os.WIFEXITED(code):
                report(status, {"event": "exited", "code": os.WEXITSTATUS(code), "usage": usage})
            elif os.WIFSIGNALED(code):
                report(status, {"event": "signaled", "signal": os.WTERMSIG(code),
                                "usage": usage})
            else:
                continue
            # At once: unwinding this program's frames would write to shared pages.
            os._exit(0)

    def job_process(status, ready, job_control):
        try:
            # Above the control pipe's number (6), which the job gets.
            status, ready = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, control + 1)
                             for fd in (status, ready)]
            drop_everything(job_control, (status, ready))
        except BaseException as e:
            failed(status, e)
            os.write(ready, b"F")
            os._exit(127)
        os.close(status)
        os.close(ready)
        return True

    def drop_everything(job_control, ours):
        os.setsid()
        for setting in plan["rlimits"]:
            value = setting["value"]
            if setting["resource"] == "Cpu" and "cpu" in session:
                value = session["cpu"]
            step("setrlimit %s %d" % (setting["resource"], value), resource.setrlimit,
                 rlimits[setting["resource"]], (value, value))
        # Capabilities: the bounding set, ambient, the identity, then every set emptied
        # and the result read back.
        for cap in range(64):
            if libc.prctl(pr_capbset_drop, cap, 0, 0, 0) < 0:
                if ctypes.get_errno() == 22:
                    break
                checked(-1, "drop bounding set")
        checked(libc.prctl(pr_cap_ambient, pr_cap_ambient_clear_all, 0, 0, 0),
                "clear ambient capabilities")
        job_id = plan["job_id"]
        step("setresgid %d" % job_id, os.setresgid, job_id, job_id, job_id)
        step("setgroups []", os.setgroups, [])
        step("setresuid %d" % job_id, os.setresuid, job_id, job_id, job_id)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        sets = (ctypes.c_uint32 * 6)()
        checked(libc.syscall(sys_capset, header, sets), "clear capabilities")
        # Changing uid made the process non-dumpable, which the exec of a fresh sandbox's
        # job undoes: its /proc/self files are then its own again (environ, mem, ...).
        checked(libc.prctl(pr_set_dumpable, 1, 0, 0, 0), "set dumpable")
        checked(libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0), "set no_new_privs")
        held = status_fields()
        for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            if int(held.get(key, "1"), 16) != 0:
                fail("clear capabilities", "%s is %s" % (key, held.get(key)))
        if held.get("NoNewPrivs") != "1":
            fail("set no_new_privs", "NoNewPrivs is %s" % held.get("NoNewPrivs"))
        step("chdir " + plan["cwd"], os.chdir, plan["cwd"])
        # The job's environment, random state of its own, and the modules of a fresh
        # interpreter plus the preloaded ones.
        os.environ.clear()
        os.environ.update(dict(plan["env"]))
        random = sys.modules.get("random")
        if random is not None:
            random.seed()
        numpy_random = sys.modules.get("numpy.random")
        if numpy_random is not None:
            numpy_random.seed()
        tempfile = sys.modules.get("tempfile")
        if tempfile is not None:
            tempfile._name_sequence = None
        for name in kernel_machinery if session.get("kernel") else machinery:
            sys.modules.pop(name, None)
        # Descriptors: stdio, and the control pipe as 6; nothing else of anyone's.
        os.dup2(job_control, control)
        os.close(job_control)
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2 and fd != control and fd not in ours:
                try:
                    os.close(fd)
                except OSError:
                    pass
        threads = thread_count()
        if threads != 1:
            fail("install seccomp", "the job process has %d threads" % threads)
        # Last: both filters, allow then deny; from here on, only what they allow.
        programs = [ctypes.create_string_buffer(p, len(p)) for p in seccomp]
        fprogs = [struct.pack("HxxxxxxP", len(p) // 8, ctypes.addressof(b))
                  for p, b in zip(seccomp, programs)]
        fprog_buffers = [ctypes.create_string_buffer(f, len(f)) for f in fprogs]
        for name, fprog in zip(("allow", "deny"), fprog_buffers):
            checked(libc.prctl(pr_set_seccomp, seccomp_mode_filter, ctypes.addressof(fprog), 0, 0),
                    "install seccomp %s filter" % name)

    def session_request(data):
        # b"fork-session cpu=<seconds> tmp=<0|1> kernel=<0|1>" (zygote.rs fork_with),
        # else None.
        words = data.split()
        if len(words) != 4 or words[0] != b"fork-session":
            return None
        flag = {b"0": False, b"1": True}
        try:
            fields = dict(w.split(b"=", 1) for w in words[1:])
            cpu = int(fields[b"cpu"])
            tmp = flag[fields[b"tmp"]]
            kernel = flag[fields[b"kernel"]]
        except (KeyError, ValueError):
            return None
        if cpu <= 0:
            return None
        return {"cpu": cpu, "tmp": tmp, "kernel": kernel}

    poller = select.poll()
    poller.register(control, select.POLLIN)
    leaders = {}
    mappings = {}
    while True:
        for fd, _ in poller.poll():
            if fd in mappings:
                poller.unregister(fd)
                pid, done = mappings.pop(fd)
                map_ids(pid, fd, done)
                continue
            if fd != control:
                poller.unregister(fd)
                pid = leaders.pop(fd)
                os.close(fd)
                os.waitpid(pid, 0)
                continue
            try:
                data, fds, flags, _ = socket.recv_fds(sock, 4096, fds_per_child + 2)
            except OSError:
                os._exit(0)
            if not data:
                # The host closed its end: this zygote is retired. Children alive go on,
                # reaped by the template's init.
                os._exit(0)
            own = session_request(data)
            expected = fds_per_child + (1 if own is not None and own["tmp"] else 0)
            if (data != b"fork" and own is None) or len(fds) != expected or flags & (
                    socket.MSG_TRUNC | socket.MSG_CTRUNC):
                for f in fds:
                    os.close(f)
                sock.send(b"refused: a malformed request")
                continue
            threads = thread_count()
            if threads != 1:
                for f in fds:
                    os.close(f)
                sock.send(b"refused: the zygote has %d threads" % threads)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            # Everything the child inherits is frozen, this program's objects too: its
            # collector then never writes a shared page, and what is left of this program
            # in the job is garbage that stays shared (and is never finalized).
            ask_read, ask_write = os.pipe()
            done_read, done_write = os.pipe()
            gc.freeze()
            pid = os.fork()
            if pid == 0:
                # The zygote's socket object must not close descriptor 6 (the job's) when
                # the frame holding it goes.
                sock.detach()
                if own is not None:
                    own["tmp"] = fds.pop() if own["tmp"] else None
                if child(fds, (ask_write, done_read), threads, own) is True:
                    return True
                os._exit(1)
            for f in fds + [ask_write, done_read]:
                os.close(f)
            mappings[ask_read] = (pid, done_write)
            poller.register(ask_read, select.POLLIN)
            pidfd = os.pidfd_open(pid)
            leaders[pidfd] = pid
            poller.register(pidfd, select.POLLIN)
            sock.send(b"forked %d" % pid)


_airlock_zygote_preload({MODULES})
del _airlock_zygote_preload, _airlock_preload
if _airlock_zygote():
    del _airlock_zygote
    _airlock_run(True)
