//! The mount plan: what the job's filesystem is made of (DESIGN S2, S4).
//!
//! The new root is an empty tmpfs. Into it go read-only binds of the rootfs's system
//! directories, a synthesized `/etc`, a fresh `/proc` with sensitive files masked, a
//! minimal `/dev`, the size-capped `/tmp` and the job's `/work`. Nothing else of the host
//! exists in the sandbox. Deciding the plan is pure ([`build_mount_plan`]) so it is
//! snapshot-tested; reading the host ([`RootfsLayout::probe`]) is separate.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use airlock_core::policy::WorkdirMode;

use crate::plan::{MountOptions, MountStep};

/// Top-level directories of a host rootfs that are shown read-only (when present).
pub const HOST_SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Host `/etc` entries the sandbox needs and that hold no secrets, each with its reason.
pub const HOST_ETC_EXTRAS: &[(&str, &str)] = &[
    (
        "etc/ld.so.cache",
        "the dynamic loader's index of /usr libraries",
    ),
    (
        "etc/alternatives",
        "Debian's command symlinks (node, awk, ...) point through it",
    ),
    (
        "etc/ssl/certs",
        "CA certificates for TLS through the egress proxy",
    ),
    (
        "etc/ssl/openssl.cnf",
        "OpenSSL's configuration, read by Python's ssl module",
    ),
    ("etc/pki/tls/certs", "CA certificates on RHEL-family hosts"),
    (
        "etc/pki/ca-trust/extracted",
        "CA certificates on RHEL-family hosts",
    ),
];

/// Top-level entries of a `dir:` rootfs that airlock provides itself and never binds.
pub const DIR_ROOTFS_SKIPPED: &[&str] = &["proc", "dev", "sys", "tmp", "work", "out", "run"];

/// `/proc` files hidden behind `/dev/null` (kernel memory, keys, timing side channels).
pub const PROC_MASKED: &[&str] = &[
    "proc/kcore",
    "proc/keys",
    "proc/key-users",
    "proc/timer_list",
    "proc/sched_debug",
    "proc/latency_stats",
    "proc/kallsyms",
    "proc/acpi",
    "proc/scsi",
    "proc/asound",
    "proc/sysrq-trigger",
];

/// `/proc` subtrees made read-only (kernel tunables).
pub const PROC_READONLY: &[&str] = &["proc/sys", "proc/irq", "proc/bus", "proc/fs"];

/// Device nodes bound from the host into the minimal `/dev`.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom"];

/// Size of the tmpfs that holds `/dev`'s mount points and links.
pub const DEV_TMPFS_BYTES: u64 = 64 * 1024;

/// Size of the new root's tmpfs (mount points and the synthesized `/etc`).
pub const ROOT_TMPFS_BYTES: u64 = 1024 * 1024;

/// The sandbox's host name.
pub const HOSTNAME: &str = "airlock";

/// One top-level entry of a rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootEntry {
    /// A directory, bound read-only.
    Dir(String),
    /// A symbolic link, recreated with the same target.
    Symlink(String, String),
    /// A regular file, bound read-only.
    File(String),
}

/// What a rootfs holds at its top level, read once per rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootfsLayout {
    /// The rootfs's path on the host (`/` for the host profile).
    pub root: PathBuf,
    /// Whether `/etc` is synthesized (host profile) or taken from the rootfs (`dir:`).
    pub synthesize_etc: bool,
    /// Entries to bind or recreate, sorted by name.
    pub entries: Vec<RootEntry>,
    /// Host `/etc` extras that exist (host profile only), as relative paths.
    pub etc_extras: Vec<String>,
    /// When set, each directory entry is mounted as a read-only overlayfs of its own (this
    /// empty directory its second layer) rather than bound: the job then sees its own
    /// superblock and inodes, so neither inotify nor file locks reach the source's.
    pub overlay_spare: Option<PathBuf>,
}

impl RootfsLayout {
    /// Reads the host profile: the system directories of `/` and the `/etc` extras.
    pub fn probe_host() -> io::Result<Self> {
        Self::probe_host_at(Path::new("/"))
    }

    /// Like [`RootfsLayout::probe_host`] for a host tree rooted elsewhere (tests).
    pub fn probe_host_at(root: &Path) -> io::Result<Self> {
        let mut entries = Vec::new();
        for name in HOST_SYSTEM_DIRS {
            if let Some(entry) = classify(root, name)? {
                entries.push(entry);
            }
        }
        let etc_extras = HOST_ETC_EXTRAS
            .iter()
            .map(|(path, _)| (*path).to_owned())
            .filter(|path| root.join(path).symlink_metadata().is_ok())
            .collect();
        Ok(Self {
            root: root.to_owned(),
            synthesize_etc: true,
            entries,
            etc_extras,
            overlay_spare: None,
        })
    }

    /// Checks that the job's root has a regular file at
    /// [`airlock_core::job::TRUST_BUNDLE_PATH`], reached through directories only (no
    /// symbolic link on the way, so the bind lands where it is shown), for the job's CA
    /// bundle to be bound over: a read-only root cannot take a new file. The error says
    /// what is missing.
    pub fn check_trust_bundle_target(&self) -> Result<(), String> {
        let target = trust_bundle_target();
        let shown = |reason: &str| {
            format!(
                "the job's root has no {reason} at /{target} for the job's CA bundle \
                 (the proxy intercepts TLS): install ca-certificates in it"
            )
        };
        let first = target.split('/').next().unwrap_or_default();
        let from_root = if self.synthesize_etc {
            // The synthesized /etc shows the host's certificate directory.
            self.etc_extras
                .iter()
                .any(|e| target.starts_with(&format!("{e}/")))
        } else {
            self.entries
                .iter()
                .any(|e| matches!(e, RootEntry::Dir(name) if name == first))
        };
        if !from_root {
            return Err(shown("directory"));
        }
        let mut path = self.root.clone();
        let parts: Vec<&str> = target.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            path.push(part);
            let meta = fs::symlink_metadata(&path).map_err(|_| shown("file"))?;
            let last = i + 1 == parts.len();
            if meta.file_type().is_symlink() {
                return Err(shown("regular file (a symbolic link is in the way)"));
            }
            if (last && !meta.is_file()) || (!last && !meta.is_dir()) {
                return Err(shown("regular file"));
            }
        }
        Ok(())
    }

    /// Reads a prepared minimal root (crate::minimal_root): its top-level entries, each
    /// directory an overlay with `spare` as the second layer; `/etc` is in the tree.
    pub fn probe_prepared(tree: &Path, spare: &Path) -> io::Result<Self> {
        let mut layout = Self::probe_dir(tree)?;
        layout.overlay_spare = Some(spare.to_owned());
        Ok(layout)
    }

    /// Reads a `dir:` rootfs: every top-level entry but those airlock provides.
    pub fn probe_dir(root: &Path) -> io::Result<Self> {
        if !root.join("usr").is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{} has no usr/ directory: not a root filesystem",
                    root.display()
                ),
            ));
        }
        let mut names: Vec<String> = fs::read_dir(root)?
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| !DIR_ROOTFS_SKIPPED.contains(&name.as_str()))
            .collect();
        names.sort();
        let mut entries = Vec::new();
        for name in names {
            if let Some(entry) = classify(root, &name)? {
                entries.push(entry);
            }
        }
        Ok(Self {
            root: root.to_owned(),
            synthesize_etc: false,
            entries,
            etc_extras: Vec::new(),
            overlay_spare: None,
        })
    }
}

fn classify(root: &Path, name: &str) -> io::Result<Option<RootEntry>> {
    let path = root.join(name);
    let meta = match path.symlink_metadata() {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(if meta.file_type().is_symlink() {
        let target = fs::read_link(&path)?;
        Some(RootEntry::Symlink(
            name.to_owned(),
            target.to_string_lossy().into_owned(),
        ))
    } else if meta.is_dir() {
        Some(RootEntry::Dir(name.to_owned()))
    } else if meta.is_file() {
        Some(RootEntry::File(name.to_owned()))
    } else {
        None
    })
}

/// What the plan needs from the job.
#[derive(Debug, Clone)]
pub struct JobMounts {
    /// Where the job's `/work` comes from.
    pub workdir: WorkdirSource,
    /// Whether `/work` is writable.
    pub workdir_mode: WorkdirMode,
    /// Size of `/tmp` (and of `/dev/shm`).
    pub tmp_bytes: u64,
    /// A session's own `/tmp` on the host (its size capped there), bound instead of a
    /// fresh tmpfs, with `/work`'s options (a session's `/work` is writable and
    /// executable already, so this one adds nothing a job could not do there).
    pub session_tmp: Option<PathBuf>,
    /// `/out`, when the job has one.
    pub out: Option<OutMount>,
    /// The job's CA bundle on the host, bound read-only over the root's own bundle at
    /// [`airlock_core::job::TRUST_BUNDLE_PATH`] when the proxy intercepts TLS
    /// ([`RootfsLayout::check_trust_bundle_target`] first).
    pub trust_bundle: Option<PathBuf>,
}

/// The options of `/work` in `mode`.
pub fn workdir_options(mode: WorkdirMode) -> MountOptions {
    match mode {
        WorkdirMode::Ro => MountOptions::RO,
        WorkdirMode::Rw => MountOptions::RW,
    }
}

/// The options of a session's own `/tmp` ([`SandboxMounts::session_tmp`]), in a fresh
/// sandbox and in one forked for the session alike.
pub const SESSION_TMP_OPTIONS: MountOptions = MountOptions::RW;

/// Where a job's `/work` comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkdirSource {
    /// A host directory, bound by its path (a session's workspace, or a job directory's
    /// `work/` where no detached tmpfs could be made).
    Directory(PathBuf),
    /// The job directory's detached tmpfs, handed to the init on
    /// [`crate::plan::WORK_MOUNT_FD`] and attached there.
    DetachedMount,
}

/// [`airlock_core::job::TRUST_BUNDLE_PATH`] relative to the new root.
pub fn trust_bundle_target() -> &'static str {
    airlock_core::job::TRUST_BUNDLE_PATH.trim_start_matches('/')
}

/// The job's `/out`: a tmpfs whose size and inode count are the caps, owned by the job.
#[derive(Debug, Clone, Copy)]
pub struct OutMount {
    /// Size cap.
    pub size_bytes: u64,
    /// Cap on files plus directories.
    pub inodes: u64,
}

/// The synthesized `/etc/passwd`.
pub const ETC_PASSWD: &str = "root:x:0:0:root:/root:/usr/sbin/nologin\n\
nobody:x:65534:65534:nobody:/tmp:/usr/sbin/nologin\n";
/// The synthesized `/etc/group`.
pub const ETC_GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";
/// The synthesized `/etc/hosts`.
pub const ETC_HOSTS: &str =
    "127.0.0.1\tlocalhost airlock\n::1\tlocalhost ip6-localhost ip6-loopback\n";
/// The synthesized `/etc/nsswitch.conf`: files only, there is no directory service.
pub const ETC_NSSWITCH: &str = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n";

/// The synthesized `/etc` files (beside the `mtab` link to `/proc/self/mounts`).
pub fn synthesized_etc() -> [(&'static str, &'static str); 6] {
    [
        ("passwd", ETC_PASSWD),
        ("group", ETC_GROUP),
        ("hosts", ETC_HOSTS),
        ("hostname", "airlock\n"),
        ("resolv.conf", ""),
        ("nsswitch.conf", ETC_NSSWITCH),
    ]
}

/// Builds the plan. Pure: every host fact comes in through `layout`.
pub fn build_mount_plan(layout: &RootfsLayout, job: &JobMounts) -> Vec<MountStep> {
    let mut steps = Vec::new();
    for dir in ["proc", "dev", "tmp", "work"] {
        steps.push(MountStep::Mkdir {
            target: dir.to_owned(),
            mode: 0o755,
        });
    }

    // The rootfs's system directories, read-only; links recreated as they are.
    for entry in &layout.entries {
        steps.push(match entry {
            RootEntry::Dir(name) if layout.overlay_spare.is_some() => MountStep::Overlay {
                lower: layout.root.join(name),
                spare: layout.overlay_spare.clone().unwrap_or_default(),
                target: name.clone(),
                options: MountOptions::RO,
            },
            RootEntry::Dir(name) | RootEntry::File(name) => MountStep::Bind {
                source: layout.root.join(name),
                target: name.clone(),
                options: MountOptions::RO,
                optional: false,
            },
            RootEntry::Symlink(name, to) => MountStep::Symlink {
                target: name.clone(),
                points_to: to.clone(),
            },
        });
    }

    if layout.synthesize_etc {
        steps.push(MountStep::Mkdir {
            target: "etc".to_owned(),
            mode: 0o755,
        });
        for (name, content) in synthesized_etc() {
            steps.push(MountStep::File {
                target: format!("etc/{name}"),
                content: content.to_owned(),
                mode: 0o644,
            });
        }
        steps.push(MountStep::Symlink {
            target: "etc/mtab".to_owned(),
            points_to: "../proc/self/mounts".to_owned(),
        });
        for extra in &layout.etc_extras {
            steps.push(MountStep::Bind {
                source: layout.root.join(extra),
                target: extra.clone(),
                options: MountOptions::RO,
                optional: true,
            });
        }
    }

    // The job's CA bundle over the root's own (an overlay or a bind of /etc by now).
    if let Some(bundle) = &job.trust_bundle {
        steps.push(MountStep::FileCopy {
            source: bundle.clone(),
            target: trust_bundle_target().to_owned(),
            options: MountOptions::RO_NOEXEC,
        });
    }

    // A minimal /dev: a small tmpfs with five device nodes, the usual links and a /dev/shm.
    steps.push(MountStep::Tmpfs {
        target: "dev".to_owned(),
        size_bytes: DEV_TMPFS_BYTES,
        mode: 0o755,
        options: MountOptions::RW_NOEXEC,
        inodes: None,
        owner: None,
    });
    for node in DEV_NODES {
        steps.push(MountStep::Bind {
            source: PathBuf::from("/dev").join(node),
            target: format!("dev/{node}"),
            options: MountOptions {
                readonly: false,
                nosuid: true,
                nodev: false,
                noexec: true,
            },
            optional: false,
        });
    }
    for (link, to) in [
        ("dev/fd", "/proc/self/fd"),
        ("dev/stdin", "/proc/self/fd/0"),
        ("dev/stdout", "/proc/self/fd/1"),
        ("dev/stderr", "/proc/self/fd/2"),
    ] {
        steps.push(MountStep::Symlink {
            target: link.to_owned(),
            points_to: to.to_owned(),
        });
    }
    steps.push(MountStep::Tmpfs {
        target: "dev/shm".to_owned(),
        size_bytes: job.tmp_bytes,
        mode: 0o1777,
        options: MountOptions::RW_NOEXEC,
        inodes: None,
        owner: None,
    });
    steps.push(MountStep::RemountReadonly {
        target: "dev".to_owned(),
        options: MountOptions::RO_NOEXEC,
    });

    // A procfs of the job's own pid namespace, with kernel internals masked.
    steps.push(MountStep::Proc {
        target: "proc".to_owned(),
    });
    for path in PROC_MASKED {
        steps.push(MountStep::Mask {
            target: (*path).to_owned(),
        });
    }
    for path in PROC_READONLY {
        steps.push(MountStep::ReadonlyBind {
            target: (*path).to_owned(),
        });
    }

    steps.push(match &job.session_tmp {
        Some(source) => MountStep::Bind {
            source: source.clone(),
            target: "tmp".to_owned(),
            options: SESSION_TMP_OPTIONS,
            optional: false,
        },
        None => MountStep::Tmpfs {
            target: "tmp".to_owned(),
            size_bytes: job.tmp_bytes,
            mode: 0o1777,
            options: MountOptions::RW_NOEXEC,
            inodes: None,
            owner: None,
        },
    });
    if let Some(out) = job.out {
        steps.push(MountStep::Tmpfs {
            target: "out".to_owned(),
            size_bytes: out.size_bytes,
            mode: 0o700,
            options: MountOptions::RW_NOEXEC,
            inodes: Some(out.inodes),
            owner: Some(crate::plan::JOB_ID_IN_SANDBOX),
        });
    }
    let options = workdir_options(job.workdir_mode);
    steps.push(match &job.workdir {
        WorkdirSource::Directory(source) => MountStep::Bind {
            source: source.clone(),
            target: "work".to_owned(),
            options,
            optional: false,
        },
        WorkdirSource::DetachedMount => MountStep::AttachWork {
            target: "work".to_owned(),
            options,
        },
    });
    steps
}

/// Renders a plan as one line per step, for the snapshot tests.
#[cfg(test)]
pub fn render_plan(steps: &[MountStep]) -> String {
    fn opts(o: &MountOptions) -> String {
        let mut parts = vec![if o.readonly { "ro" } else { "rw" }];
        if o.nosuid {
            parts.push("nosuid");
        }
        if o.nodev {
            parts.push("nodev");
        }
        if o.noexec {
            parts.push("noexec");
        }
        parts.join(",")
    }
    let mut out = String::new();
    for step in steps {
        let line = match step {
            MountStep::Mkdir { target, mode } => format!("mkdir   /{target} {mode:o}"),
            MountStep::Symlink { target, points_to } => format!("symlink /{target} -> {points_to}"),
            MountStep::File {
                target,
                content,
                mode,
            } => format!("file    /{target} {mode:o} ({} bytes)", content.len()),
            MountStep::Tmpfs {
                target,
                size_bytes,
                mode,
                options,
                inodes,
                owner,
            } => format!(
                "tmpfs   /{target} size={size_bytes} mode={mode:o}{}{} {}",
                inodes
                    .map(|n| format!(" nr_inodes={n}"))
                    .unwrap_or_default(),
                owner
                    .map(|o| format!(" uid={o} gid={o}"))
                    .unwrap_or_default(),
                opts(options)
            ),
            MountStep::Bind {
                source,
                target,
                options,
                optional,
            } => format!(
                "bind    {} -> /{target} {}{}",
                source.display(),
                opts(options),
                if *optional { " (if present)" } else { "" }
            ),
            MountStep::Overlay {
                lower,
                spare,
                target,
                options,
            } => format!(
                "overlay {}:{} -> /{target} {}",
                lower.display(),
                spare.display(),
                opts(options)
            ),
            MountStep::AttachWork { target, options } => {
                format!("attach  (detached tmpfs) -> /{target} {}", opts(options))
            }
            MountStep::FileCopy {
                source,
                target,
                options,
            } => format!(
                "copy    {} -> /{target} {}",
                source.display(),
                opts(options)
            ),
            MountStep::Proc { target } => format!("proc    /{target}"),
            MountStep::Mask { target } => format!("mask    /{target}"),
            MountStep::ReadonlyBind { target } => format!("ro-bind /{target}"),
            MountStep::RemountReadonly { target, options } => {
                format!("remount /{target} {}", opts(options))
            }
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merged_usr_host() -> RootfsLayout {
        RootfsLayout {
            root: PathBuf::from("/"),
            synthesize_etc: true,
            entries: vec![
                RootEntry::Dir("usr".into()),
                RootEntry::Symlink("bin".into(), "usr/bin".into()),
                RootEntry::Symlink("sbin".into(), "usr/sbin".into()),
                RootEntry::Symlink("lib".into(), "usr/lib".into()),
                RootEntry::Symlink("lib64".into(), "usr/lib64".into()),
            ],
            etc_extras: vec![
                "etc/ld.so.cache".into(),
                "etc/alternatives".into(),
                "etc/ssl/certs".into(),
            ],
            overlay_spare: None,
        }
    }

    fn minimal_root() -> RootfsLayout {
        RootfsLayout {
            root: PathBuf::from("/var/cache/airlock/roots/minimal-K/copy-H/root"),
            synthesize_etc: false,
            entries: vec![
                RootEntry::Symlink("bin".into(), "usr/bin".into()),
                RootEntry::Dir("etc".into()),
                RootEntry::Symlink("lib".into(), "usr/lib".into()),
                RootEntry::Symlink("lib64".into(), "usr/lib64".into()),
                RootEntry::Dir("usr".into()),
            ],
            etc_extras: Vec::new(),
            overlay_spare: Some(PathBuf::from(
                "/var/cache/airlock/roots/minimal-K/copy-H/empty",
            )),
        }
    }

    #[test]
    fn minimal_root_plan_snapshot() {
        insta::assert_snapshot!(render_plan(&build_mount_plan(&minimal_root(), &job())));
    }

    #[test]
    fn minimal_root_directories_are_read_only_overlays_never_host_binds() {
        let plan = build_mount_plan(&minimal_root(), &job());
        let overlays: Vec<&MountStep> = plan
            .iter()
            .filter(|s| matches!(s, MountStep::Overlay { .. }))
            .collect();
        assert_eq!(overlays.len(), 2, "{plan:#?}");
        for step in &plan {
            match step {
                MountStep::Overlay { options, .. } => {
                    assert!(options.readonly && options.nosuid && options.nodev)
                }
                MountStep::Bind { source, target, .. } => assert!(
                    target == "work" || source.starts_with("/dev/"),
                    "the minimal root binds {}",
                    source.display()
                ),
                _ => {}
            }
        }
    }

    fn job() -> JobMounts {
        JobMounts {
            workdir: WorkdirSource::Directory(PathBuf::from("/run/airlock/JOB/work")),
            workdir_mode: WorkdirMode::Ro,
            tmp_bytes: 16 * 1024 * 1024,
            session_tmp: None,
            out: None,
            trust_bundle: None,
        }
    }

    #[test]
    fn a_sessions_tmp_is_bound_as_its_work_is_instead_of_a_fresh_tmpfs() {
        let layout = minimal_root();
        let fresh = build_mount_plan(&layout, &job());
        assert!(fresh.iter().any(|s| matches!(s,
            MountStep::Tmpfs { target, options, .. } if target == "tmp" && *options == MountOptions::RW_NOEXEC)));
        let mut mounts = job();
        mounts.workdir_mode = WorkdirMode::Rw;
        mounts.session_tmp = Some(PathBuf::from("/run/airlock-sessions/S-tmp"));
        let plan = build_mount_plan(&layout, &mounts);
        let tmp: Vec<&MountStep> = plan
            .iter()
            .filter(|s| matches!(s, MountStep::Tmpfs { target, .. } | MountStep::Bind { target, .. } if target == "tmp"))
            .collect();
        assert_eq!(tmp.len(), 1, "{tmp:?}");
        assert!(
            matches!(tmp[0], MountStep::Bind { source, options, optional: false, .. }
                if source == Path::new("/run/airlock-sessions/S-tmp") && *options == MountOptions::RW),
            "{tmp:?}"
        );
        // /dev/shm stays the job's own.
        assert!(
            plan.iter()
                .any(|s| matches!(s, MountStep::Tmpfs { target, .. } if target == "dev/shm"))
        );
    }

    #[test]
    fn the_jobs_ca_bundle_is_copied_read_only_over_the_roots_after_etc() {
        for layout in [merged_usr_host(), minimal_root()] {
            let mut mounts = job();
            mounts.trust_bundle = Some(PathBuf::from("/run/airlock/JOB/trust-bundle.pem"));
            let plan = build_mount_plan(&layout, &mounts);
            let at = |wanted: &dyn Fn(&MountStep) -> bool| plan.iter().position(wanted);
            let bundle = at(&|s| {
                matches!(s, MountStep::FileCopy { target, source, options }
                    if target == "etc/ssl/certs/ca-certificates.crt"
                        && source == Path::new("/run/airlock/JOB/trust-bundle.pem")
                        && *options == MountOptions::RO_NOEXEC)
            })
            .expect("the bundle's bind");
            // After whatever shows /etc (the overlay, or the synthesized /etc's certificate
            // directory), so nothing covers it.
            let etc = plan
                .iter()
                .rposition(|s| match s {
                    MountStep::Overlay { target, .. } => target == "etc",
                    MountStep::Bind { target, .. } => {
                        target.starts_with("etc/") && target != "etc/ssl/certs/ca-certificates.crt"
                    }
                    _ => false,
                })
                .expect("a step that shows /etc");
            assert!(bundle > etc, "{plan:#?}");
        }
        assert!(!build_mount_plan(&merged_usr_host(), &job()).iter().any(
            |s| matches!(s, MountStep::Bind { target, .. } if target.contains("ca-certificates"))
        ));
    }

    #[test]
    fn the_bundle_target_must_be_a_file_reached_through_directories() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("usr")).unwrap();
        std::fs::create_dir_all(root.join("etc/ssl/certs")).unwrap();
        let probe = || RootfsLayout::probe_dir(&root).unwrap();
        let err = probe().check_trust_bundle_target().unwrap_err();
        assert!(err.contains("install ca-certificates"), "{err}");
        std::fs::write(root.join("etc/ssl/certs/ca-certificates.crt"), "x").unwrap();
        probe().check_trust_bundle_target().unwrap();
        // A link on the way could carry the bind somewhere else.
        std::fs::rename(root.join("etc/ssl"), root.join("etc/real-ssl")).unwrap();
        std::os::unix::fs::symlink("real-ssl", root.join("etc/ssl")).unwrap();
        let err = probe().check_trust_bundle_target().unwrap_err();
        assert!(err.contains("symbolic link"), "{err}");
        // The synthesized /etc shows the host's certificate directory only when it is
        // among the extras.
        let mut host = merged_usr_host();
        host.root = dir.path().join("host");
        std::fs::create_dir_all(host.root.join("etc/ssl/certs")).unwrap();
        std::fs::write(host.root.join("etc/ssl/certs/ca-certificates.crt"), "x").unwrap();
        host.etc_extras = vec!["etc/ssl/certs".to_owned()];
        host.check_trust_bundle_target().unwrap();
        host.etc_extras.clear();
        assert!(host.check_trust_bundle_target().is_err());
    }

    #[test]
    fn host_profile_plan_snapshot() {
        insta::assert_snapshot!(render_plan(&build_mount_plan(&merged_usr_host(), &job())));
    }

    #[test]
    fn nothing_sensitive_of_the_host_is_bound() {
        let plan = build_mount_plan(&merged_usr_host(), &job());
        for step in &plan {
            if let MountStep::Bind { source, .. } = step {
                let s = source.to_string_lossy();
                for forbidden in [
                    "/home",
                    "/root",
                    "/var",
                    "/run/",
                    "/srv",
                    "/opt",
                    "/mnt",
                    "/media",
                    "/etc/shadow",
                    "/etc/passwd",
                    "/sys",
                    "/proc",
                ] {
                    let allowed_job_dir = s.starts_with("/run/airlock/");
                    assert!(
                        allowed_job_dir || !s.starts_with(forbidden),
                        "plan binds {s}"
                    );
                }
                if s.starts_with("/etc") {
                    assert!(
                        HOST_ETC_EXTRAS.iter().any(|(p, _)| s == format!("/{p}")),
                        "unexpected /etc bind {s}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_host_bind_is_read_only_except_work_and_devices() {
        let plan = build_mount_plan(&merged_usr_host(), &job());
        for step in &plan {
            if let MountStep::Bind {
                source,
                target,
                options,
                ..
            } = step
            {
                if !target.starts_with("dev/") {
                    assert!(options.readonly, "{} is writable", source.display());
                }
                assert!(options.nosuid, "{} allows setuid", source.display());
            }
        }
    }

    #[test]
    fn tmp_is_noexec_and_capped() {
        let plan = build_mount_plan(&merged_usr_host(), &job());
        assert!(plan.contains(&MountStep::Tmpfs {
            target: "tmp".into(),
            size_bytes: 16 * 1024 * 1024,
            mode: 0o1777,
            options: MountOptions::RW_NOEXEC,
            inodes: None,
            owner: None,
        }));
    }

    #[test]
    fn out_is_a_capped_tmpfs_owned_by_the_job() {
        let mut j = job();
        j.out = Some(OutMount {
            size_bytes: 8 << 20,
            inodes: 128,
        });
        let plan = build_mount_plan(&merged_usr_host(), &j);
        let out = plan
            .iter()
            .find(|s| matches!(s, MountStep::Tmpfs { target, .. } if target == "out"))
            .expect("an /out mount");
        assert_eq!(
            render_plan(std::slice::from_ref(out)),
            "tmpfs   /out size=8388608 mode=700 nr_inodes=128 uid=65534 gid=65534 rw,nosuid,nodev,noexec\n"
        );
    }

    #[test]
    fn rw_workdir_is_writable() {
        let mut j = job();
        j.workdir_mode = WorkdirMode::Rw;
        let plan = build_mount_plan(&merged_usr_host(), &j);
        assert!(plan.iter().any(|s| matches!(s,
            MountStep::Bind { target, options, .. } if target == "work" && !options.readonly)));
    }

    #[test]
    fn dir_rootfs_binds_its_entries_but_not_the_ones_airlock_provides() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["usr", "etc", "var", "proc", "dev", "tmp", "home"] {
            fs::create_dir(dir.path().join(d)).unwrap();
        }
        std::os::unix::fs::symlink("usr/bin", dir.path().join("bin")).unwrap();
        let layout = RootfsLayout::probe_dir(dir.path()).unwrap();
        assert_eq!(
            layout.entries,
            vec![
                RootEntry::Symlink("bin".into(), "usr/bin".into()),
                RootEntry::Dir("etc".into()),
                RootEntry::Dir("home".into()),
                RootEntry::Dir("usr".into()),
                RootEntry::Dir("var".into()),
            ]
        );
        assert!(!layout.synthesize_etc);
        assert!(RootfsLayout::probe_dir(Path::new("/nonexistent-airlock")).is_err());
    }

    #[test]
    fn host_probe_finds_usr() {
        let layout = RootfsLayout::probe_host().unwrap();
        assert!(layout.entries.contains(&RootEntry::Dir("usr".into())));
        assert!(layout.synthesize_etc);
    }
}
