//! A job trying to hurt the host (issue 19): host-wide kernel budgets it must not be able
//! to exhaust and devices it must not create.

use pretty_assertions::assert_eq;

use super::common::Target;

/// `io_setup(65536, &ctx)` through libc's `syscall`, printing the result and errno.
const AIO_SETUP: &str = "import ctypes\n\
                         libc = ctypes.CDLL(None, use_errno=True)\n\
                         ctx = ctypes.c_ulong(0)\n\
                         r = libc.syscall(206, 65536, ctypes.byref(ctx))\n\
                         print(r, ctypes.get_errno())";

/// Tries a character and a block device node in /tmp, then a FIFO.
const MKNOD_DEVICES: &str = "import os, stat\n\
                             out = []\n\
                             for kind, name in ((stat.S_IFCHR, 'c'), (stat.S_IFBLK, 'b')):\n\
                             \x20   try:\n\
                             \x20       os.mknod('/tmp/' + name, 0o600 | kind, os.makedev(1, 3))\n\
                             \x20       out.append(name + ' made')\n\
                             \x20   except OSError as e:\n\
                             \x20       out.append(name + ' ' + str(e.errno))\n\
                             os.mkfifo('/tmp/f')\n\
                             out.append('fifo made')\n\
                             print(' '.join(out))";

conformance! {
    fn aio_contexts_are_refused(t: &Target) {
        let run = t.run(&["-c", AIO_SETUP]);
        assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
        assert_eq!(run.obs["stdout"], "-1 1\n", "io_setup refused with EPERM");
    }

    fn device_nodes_cannot_be_created(t: &Target) {
        let run = t.run(&["-c", MKNOD_DEVICES]);
        assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
        assert_eq!(run.obs["stdout"], "c 1 b 1 fifo made\n");
    }
}

/// The shape of /dev: checked where every backend's answer is known (kube's nodes give
/// their runtime's /dev).
mod dev {
    use pretty_assertions::assert_eq;

    use super::super::common::Target;

    /// Every character and block device under /dev (links not followed), as `PATH cMAJ:MIN`,
    /// then whether /dev/fuse and /dev/net/tun open for reading and writing.
    const DEV_DEVICES: &str = "import os, stat\n\
                               found = []\n\
                               for root, dirs, files in os.walk('/dev'):\n\
                               \x20   for name in dirs + files:\n\
                               \x20       path = os.path.join(root, name)\n\
                               \x20       st = os.lstat(path)\n\
                               \x20       if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):\n\
                               \x20           kind = 'c' if stat.S_ISCHR(st.st_mode) else 'b'\n\
                               \x20           found.append('%s %s%d:%d' % (path, kind, os.major(st.st_rdev), os.minor(st.st_rdev)))\n\
                               print(' '.join(sorted(found)))\n\
                               for path in ('/dev/fuse', '/dev/net/tun'):\n\
                               \x20   try:\n\
                               \x20       os.close(os.open(path, os.O_RDWR))\n\
                               \x20       print(path, 'opened')\n\
                               \x20   except OSError:\n\
                               \x20       print(path, 'refused')";

    /// The devices of the native backend's /dev.
    const MINIMAL_DEVICES: [&str; 5] = [
        "/dev/full c1:7",
        "/dev/null c1:3",
        "/dev/random c1:8",
        "/dev/urandom c1:9",
        "/dev/zero c1:5",
    ];
    /// What containers have besides: the runtime's /dev/tty (the alias of the controlling
    /// terminal; a job has none, so it opens nothing) and the devpts instance's ptmx, for
    /// openpty.
    const CONTAINER_TERMINAL_DEVICES: [&str; 2] = ["/dev/pts/ptmx c5:2", "/dev/tty c5:0"];

    conformance_on! {
        [native: Native, warm: Warm, zygote: Zygote, docker: Docker, gvisor: Gvisor,
         podman: Podman, warm_docker: WarmDocker, warm_gvisor: WarmGvisor,
         warm_podman: WarmPodman]

        fn dev_holds_only_the_minimal_devices(t: &Target) {
            let run = t.run(&["-c", DEV_DEVICES]);
            assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
            let mut expected = MINIMAL_DEVICES.to_vec();
            if t.kind.is_container() {
                expected.extend(CONTAINER_TERMINAL_DEVICES);
            }
            expected.sort_unstable();
            assert_eq!(
                run.obs["stdout"],
                format!("{}\n/dev/fuse refused\n/dev/net/tun refused\n", expected.join(" ")),
            );
        }
    }
}

/// What a job reads of its own mount table (issue 34): no path of the host's layout. Checked
/// on the native backend and its warm kinds, whose mounts airlock makes itself; a container
/// engine's show its storage driver's paths (docs/docker.md).
mod mount_table {
    use super::super::common::Target;

    /// The mount table, as the job reads it.
    const MOUNTINFO: &str = "print(open('/proc/self/mountinfo').read(), end='')";

    /// One line of `/proc/self/mountinfo`: the mount's root in its filesystem, its mount
    /// point, its filesystem type and source, and the superblock's options.
    struct Line<'a> {
        text: &'a str,
        root: &'a str,
        mount_point: &'a str,
        fs_type: &'a str,
        super_options: &'a str,
    }

    fn parse(text: &str) -> Line<'_> {
        let (left, right) = text.split_once(" - ").expect("a mountinfo line has ' - '");
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        Line {
            text,
            root: left[3],
            mount_point: left[4],
            fs_type: right[0],
            super_options: right.get(2).copied().unwrap_or(""),
        }
    }

    conformance_on! {
        [native: Native, warm: Warm, zygote: Zygote]

        fn the_mount_table_names_no_host_path(t: &Target) {
            let run = t.run(&["-c", MOUNTINFO]);
            assert_eq!(run.obs["outcome"], "exited", "{:#}", run.obs);
            let table = run.obs["stdout"].as_str().unwrap().to_owned();
            let job_id = run.obs["job_id"].as_str().unwrap();
            let state_dir = t.path().display().to_string();
            // Under an image rootfs (scripts/ci/images.sh), the root's entries are bound
            // from the unpacked tree in the store: their root is that path, the exception
            // docs/native.md names. Everything else holds as on the minimal root.
            let image_entry = |line: &Line<'_>| {
                super::super::common::native_image().is_some()
                    && line.root.contains("/rootfs/")
                    && line.root.ends_with(line.mount_point)
            };
            let mut problems = Vec::new();
            for line in table.lines().map(parse) {
                // A bind's root is its path in the filesystem it comes from: only the
                // sandbox's own procfs and the host's device nodes (whose names are the
                // same inside) may be bound from below their root.
                if line.root != "/"
                    && !matches!(line.fs_type, "proc" | "devtmpfs")
                    && !image_entry(&line)
                {
                    problems.push(format!("a mount's root is a host path: {}", line.text));
                }
                for option in line.super_options.split(',') {
                    if let Some((key, value)) = option.split_once('=')
                        && matches!(key, "lowerdir" | "upperdir" | "workdir" | "datadir")
                        && value.split(':').any(|layer| layer.starts_with('/'))
                    {
                        problems.push(format!("an overlay names a host path: {}", line.text));
                    }
                }
                for marker in [job_id, state_dir.as_str(), "/run/airlock", "/var/cache/airlock"] {
                    if line.text.contains(marker) {
                        problems.push(format!("{marker:?} in: {}", line.text));
                    }
                }
            }
            assert!(problems.is_empty(), "{}\n\nthe table:\n{table}", problems.join("\n"));
            // /work is a filesystem of its own, read-only as the policy says.
            let work: Vec<Line<'_>> = table
                .lines()
                .map(parse)
                .filter(|line| line.mount_point == "/work")
                .collect();
            let seen = work.last().expect("a /work mount");
            assert_eq!((seen.fs_type, seen.root), ("tmpfs", "/"), "{}", seen.text);
            assert!(seen.text.split(' ').nth(5).unwrap().starts_with("ro,"), "{}", seen.text);
        }
    }
}
