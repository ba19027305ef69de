//! The Pod a job runs in, as pure data: built from a checked [`JobSpec`] and the policy's
//! `[kube]` section, with no I/O, so every field is unit- and property-tested.
//!
//! The source, input files and stdin travel inside the Pod object itself, as annotations
//! projected into the container by a downward API volume: no host path, no ConfigMap, so a
//! job costs exactly two API writes (create, delete). The program is started by a short
//! `/bin/sh` wrapper that lowers rlimits Kubernetes has no field for, redirects stdin from
//! its file, and execs `/usr/bin/env -i` with exactly the job's environment (the kubelet
//! adds `KUBERNETES_SERVICE_*` and `HOSTNAME` to every container). The image needs
//! `/bin/sh`, `/usr/bin/env` and `/usr/bin/prlimit` (util-linux, in every Debian image).

use std::collections::BTreeMap;

use airlock_core::JobSpec;
use airlock_core::job::WORKDIR;
use airlock_core::policy::{KubeLogStreams, KubePolicy, WorkdirMode};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource,
    ObjectFieldSelector, Pod, PodDNSConfig, PodSecurityContext, PodSpec, ResourceRequirements,
    SeccompProfile, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::error::KubeError;

/// The job's uid and gid (DESIGN S5).
pub const JOB_UID: i64 = 65534;
/// The Pod's hostname, as on the other backends.
pub const HOSTNAME: &str = "airlock";
/// The name of the job's one container.
pub const CONTAINER: &str = "job";
/// The label every Pod airlock creates carries, and the only one it ever deletes.
pub const LABEL_MANAGED: &str = "airlock.managed";
/// The label holding the job id.
pub const LABEL_JOB: &str = "airlock.job";
/// The label holding the backend kind.
pub const LABEL_BACKEND: &str = "airlock.backend";
/// The selector of airlock's Pods.
pub const SELECTOR_MANAGED: &str = "airlock.managed=true";
/// The prefix of the annotations carrying input files (`airlock.dev/in-0`, ...).
pub const ANNOTATION_INPUT_PREFIX: &str = "airlock.dev/in-";
/// The annotation carrying stdin.
pub const ANNOTATION_STDIN: &str = "airlock.dev/stdin";
/// The annotation holding the job's wall-time limit in milliseconds (for the janitor and
/// for people reading `kubectl get pod -o yaml`).
pub const ANNOTATION_TIMEOUT_MS: &str = "airlock.dev/timeout-ms";
/// The API server refuses a Pod whose annotations total more than 256 KiB; airlock keeps
/// this much of it for the input files and stdin, and the rest for its own annotations
/// and metadata.
pub const INPUT_ANNOTATIONS_MAX_BYTES: usize = 256 * 1024 - 4 * 1024;
/// Where the inputs are projected when `/work` is writable (they are copied to `/work`).
pub const INPUT_DIR: &str = "/airlock/in";
/// Where stdin is projected.
pub const STDIN_DIR: &str = "/airlock/stdin";
/// The stdin file's name in [`STDIN_DIR`].
pub const STDIN_FILE: &str = "stdin";
/// The shell that runs the wrapper; every Debian-based image has it.
pub const SHELL: &str = "/bin/sh";
/// Runs the program with exactly the job's environment (see the module doc).
pub const ENV_WRAPPER: &str = "/usr/bin/env";
/// Sets RLIMIT_CORE to exactly [`CORE_RLIMIT_BYTES`]: a shell's `ulimit -c` counts
/// 512-byte blocks, so it cannot.
pub const PRLIMIT: &str = "/usr/bin/prlimit";
/// RLIMIT_CORE of the job: 1, not 0, as on the other backends (see
/// `airlock_native::backend::CORE_RLIMIT_BYTES`): a node whose `kernel.core_pattern` is a
/// pipe (systemd-coredump, apport) ignores a core limit of 0 and would receive the job's
/// memory; 1 means "no dump" to a pipe, and is below a page for a file.
pub const CORE_RLIMIT_BYTES: u64 = 1;
/// File mode of a projected input file.
pub const INPUT_FILE_MODE: i32 = 0o444;
/// File mode of a projected executable input file.
pub const INPUT_EXEC_MODE: i32 = 0o555;
/// `ulimit -f` counts 512-byte blocks in POSIX shells.
pub const ULIMIT_BLOCK_BYTES: u64 = 512;
/// Time on top of the job's wall time and the start timeout before the kubelet itself ends
/// the Pod (`activeDeadlineSeconds`, counted from the Pod's acceptance by the kubelet):
/// the backstop when airlock is gone. airlock ends the job itself at its wall time.
pub const DEADLINE_SLACK_SECS: i64 = 30;
/// The only nameserver a job's resolver is given: nothing listens there, so names do not
/// resolve (the NetworkPolicy blocks DNS too).
pub const NAMESERVER: &str = "127.0.0.1";
/// The line the wrapper writes first on stdout in split mode (followed by the job id).
pub const STDOUT_MARKER: &str = "airlock-stdout:";
/// The line the wrapper writes first on stderr in split mode (followed by the job id).
pub const STDERR_MARKER: &str = "airlock-stderr:";
/// Memory-backed `emptyDir`s count against the Pod's memory limit, as the tmpfs of the
/// other backends does.
pub const MEDIUM_MEMORY: &str = "Memory";

/// What [`pod_manifest`] needs besides the job.
#[derive(Debug, Clone)]
pub struct PodPlan<'a> {
    /// The `[kube]` section of the policy.
    pub kube: &'a KubePolicy,
    /// The image reference without the digest.
    pub image_reference: &'a str,
    /// The pinned digest, `sha256:…`.
    pub image_digest: &'a str,
}

/// The Pod's name: unique per job, and telling whose it is in `kubectl get pods`.
pub fn pod_name(job: &JobSpec) -> String {
    format!("airlock-{}", job.id)
}

/// The labels of a job's Pod.
pub fn labels(job: &JobSpec) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED.to_owned(), "true".to_owned()),
        (LABEL_JOB.to_owned(), job.id.to_string()),
        (LABEL_BACKEND.to_owned(), "kube".to_owned()),
    ])
}

/// The image as the Pod names it: `REF@sha256:…`, so the kubelet runs exactly the pinned
/// image whatever the tag points to now. A reference that already holds a digest is
/// replaced by the pinned one.
pub fn image(reference: &str, digest: &str) -> String {
    let name = reference
        .split_once('@')
        .map_or(reference, |(name, _)| name);
    format!("{name}@{digest}")
}

/// `'text'` for `/bin/sh`, with every `'` closed, escaped and reopened.
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// One projected input: the annotation carrying it, the path it appears at, its mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Input {
    /// The annotation key.
    pub annotation: String,
    /// The relative path under `/work`.
    pub path: String,
    /// The content (UTF-8: annotations are strings).
    pub content: String,
    /// Whether it is executable.
    pub executable: bool,
}

fn utf8(field: String, bytes: &[u8]) -> Result<String, KubeError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| KubeError::Input {
        field,
        reason: "is not UTF-8 text: the kube backend delivers inputs as Pod annotations, which hold text only".to_owned(),
    })
}

/// The source and input files as projected inputs, checked against what an annotation and
/// the downward API can carry.
pub fn inputs(job: &JobSpec) -> Result<Vec<Input>, KubeError> {
    let mut inputs = Vec::with_capacity(job.files.len() + 1);
    inputs.push(Input {
        annotation: format!("{ANNOTATION_INPUT_PREFIX}0"),
        path: job.source_file.clone(),
        content: utf8("source".to_owned(), &job.source)?,
        executable: false,
    });
    for (i, file) in job.files.iter().enumerate() {
        let field = format!("files[{i}]");
        // The downward API's atomic writer owns names starting with "..".
        if file
            .path
            .split('/')
            .any(|segment| segment.starts_with(".."))
        {
            return Err(KubeError::Input {
                field,
                reason: format!(
                    "{:?}: names starting with \"..\" are reserved by the downward API volume",
                    file.path
                ),
            });
        }
        inputs.push(Input {
            annotation: format!("{ANNOTATION_INPUT_PREFIX}{}", i + 1),
            path: file.path.clone(),
            content: utf8(field, &file.content)?,
            executable: file.executable,
        });
    }
    Ok(inputs)
}

/// The wrapper script `/bin/sh -c` runs; its positional parameters are
/// `NAME=VALUE`... then the job's argv, handed to `env -i`.
pub fn wrapper_script(job: &JobSpec, inputs: &[Input], streams: KubeLogStreams) -> String {
    let limits = &job.limits;
    let mut script = String::new();
    // Kubernetes has no field for rlimits; lowering them needs no privilege.
    let fsize_blocks = (limits.file_size.as_u64() / ULIMIT_BLOCK_BYTES).max(1);
    // The core limit of the shell itself ($$), which execs the program.
    script.push_str(&format!(
        "ulimit -n {} && ulimit -f {fsize_blocks} && {PRLIMIT} --pid $$ --core={CORE_RLIMIT_BYTES}:{CORE_RLIMIT_BYTES} || {{ echo 'airlock: cannot set rlimits (the image needs {PRLIMIT})' >&2; exit 125; }}\n",
        limits.open_files
    ));
    if job.filesystem.workdir == WorkdirMode::Rw {
        // /work is an emptyDir the job may write; the inputs come from the read-only
        // projection.
        for input in inputs {
            let target = format!("{WORKDIR}/{}", input.path);
            if let Some((parent, _)) = target.rsplit_once('/')
                && parent != WORKDIR
            {
                script.push_str(&format!("mkdir -p {} && ", shell_quote(parent)));
            }
            script.push_str(&format!(
                "cp {} {} || exit 125\n",
                shell_quote(&format!("{INPUT_DIR}/{}", input.path)),
                shell_quote(&target)
            ));
        }
    }
    if streams == KubeLogStreams::Split {
        script.push_str(&format!(
            "printf '%s\\n' '{STDOUT_MARKER}{id}' && printf '%s\\n' '{STDERR_MARKER}{id}' >&2 || exit 125\n",
            id = job.id
        ));
    }
    let stdin = if job.stdin.is_some() {
        format!("{STDIN_DIR}/{STDIN_FILE}")
    } else {
        "/dev/null".to_owned()
    };
    script.push_str(&format!("exec {ENV_WRAPPER} -i \"$@\" < {stdin}\n"));
    script
}

/// The container's command: `/bin/sh -c SCRIPT airlock NAME=VALUE... argv...`.
pub fn command(job: &JobSpec, inputs: &[Input], streams: KubeLogStreams) -> Vec<String> {
    let mut cmd = Vec::with_capacity(job.env.len() + job.argv.len() + 4);
    cmd.push(SHELL.to_owned());
    cmd.push("-c".to_owned());
    cmd.push(wrapper_script(job, inputs, streams));
    cmd.push("airlock".to_owned());
    cmd.extend(job.env.iter().map(|(k, v)| format!("{k}={v}")));
    cmd.extend(job.argv.iter().cloned());
    cmd
}

/// The kubelet's backstop deadline for the Pod.
pub fn active_deadline_seconds(job: &JobSpec, kube: &KubePolicy) -> i64 {
    let secs = (job.limits.timeout + kube.start_timeout)
        .as_secs_f64()
        .ceil();
    // Both are bounded by the policy (24 h and 1 h).
    (secs as i64).saturating_add(DEADLINE_SLACK_SECS)
}

fn quantity(value: impl ToString) -> Quantity {
    Quantity(value.to_string())
}

fn field_ref(annotation: &str) -> ObjectFieldSelector {
    ObjectFieldSelector {
        api_version: Some("v1".to_owned()),
        field_path: format!("metadata.annotations['{annotation}']"),
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// The seccomp profile of the policy as a Pod field.
pub fn seccomp_profile(kube: &KubePolicy) -> SeccompProfile {
    match kube
        .seccomp_profile
        .strip_prefix(KubePolicy::SECCOMP_LOCALHOST_PREFIX)
    {
        Some(path) => SeccompProfile {
            type_: "Localhost".to_owned(),
            localhost_profile: Some(path.to_owned()),
        },
        None => SeccompProfile {
            type_: "RuntimeDefault".to_owned(),
            localhost_profile: None,
        },
    }
}

/// The Pod for `job`.
pub fn pod_manifest(job: &JobSpec, plan: &PodPlan<'_>) -> Result<Pod, KubeError> {
    let kube = plan.kube;
    let limits = &job.limits;
    let inputs = inputs(job)?;

    let mut annotations = BTreeMap::new();
    let mut input_bytes = 0usize;
    for input in &inputs {
        input_bytes += input.annotation.len() + input.content.len();
        annotations.insert(input.annotation.clone(), input.content.clone());
    }
    if let Some(stdin) = &job.stdin {
        let text = utf8("stdin".to_owned(), stdin)?;
        input_bytes += ANNOTATION_STDIN.len() + text.len();
        annotations.insert(ANNOTATION_STDIN.to_owned(), text);
    }
    if input_bytes > INPUT_ANNOTATIONS_MAX_BYTES {
        return Err(KubeError::Input {
            field: "files".to_owned(),
            reason: format!(
                "source, input files and stdin total {input_bytes} bytes; the kube backend carries at most {INPUT_ANNOTATIONS_MAX_BYTES} in the Pod's annotations"
            ),
        });
    }
    annotations.insert(
        ANNOTATION_TIMEOUT_MS.to_owned(),
        limits.timeout.as_millis().to_string(),
    );

    let resources = BTreeMap::from([
        (
            "cpu".to_owned(),
            quantity(format!("{}m", limits.cpus.millis())),
        ),
        ("memory".to_owned(), quantity(limits.memory.as_u64())),
        (
            "ephemeral-storage".to_owned(),
            quantity(kube.ephemeral_storage.as_u64()),
        ),
    ]);

    let rw = job.filesystem.workdir == WorkdirMode::Rw;
    let mut volumes = vec![
        Volume {
            name: "tmp".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some(MEDIUM_MEMORY.to_owned()),
                size_limit: Some(quantity(limits.tmp.as_u64())),
            }),
            ..Default::default()
        },
        Volume {
            name: "inputs".to_owned(),
            downward_api: Some(DownwardAPIVolumeSource {
                default_mode: Some(INPUT_FILE_MODE),
                items: Some(
                    inputs
                        .iter()
                        .map(|input| DownwardAPIVolumeFile {
                            path: input.path.clone(),
                            field_ref: Some(field_ref(&input.annotation)),
                            mode: Some(if input.executable {
                                INPUT_EXEC_MODE
                            } else {
                                INPUT_FILE_MODE
                            }),
                            resource_field_ref: None,
                        })
                        .collect(),
                ),
            }),
            ..Default::default()
        },
    ];
    let mut mounts = vec![mount("tmp", "/tmp", false)];
    if rw {
        volumes.push(Volume {
            name: "work".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some(MEDIUM_MEMORY.to_owned()),
                size_limit: Some(quantity(limits.tmp.as_u64())),
            }),
            ..Default::default()
        });
        mounts.push(mount("work", WORKDIR, false));
        mounts.push(mount("inputs", INPUT_DIR, true));
    } else {
        mounts.push(mount("inputs", WORKDIR, true));
    }
    if job.stdin.is_some() {
        volumes.push(Volume {
            name: "stdin".to_owned(),
            downward_api: Some(DownwardAPIVolumeSource {
                default_mode: Some(INPUT_FILE_MODE),
                items: Some(vec![DownwardAPIVolumeFile {
                    path: STDIN_FILE.to_owned(),
                    field_ref: Some(field_ref(ANNOTATION_STDIN)),
                    mode: Some(INPUT_FILE_MODE),
                    resource_field_ref: None,
                }]),
            }),
            ..Default::default()
        });
        mounts.push(mount("stdin", STDIN_DIR, true));
    }

    let seccomp = seccomp_profile(kube);
    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(image(plan.image_reference, plan.image_digest)),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(command(job, &inputs, kube.log_streams)),
        args: Some(Vec::new()),
        env: Some(Vec::new()),
        working_dir: Some(WORKDIR.to_owned()),
        resources: Some(ResourceRequirements {
            limits: Some(resources.clone()),
            requests: Some(resources),
            claims: None,
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                add: None,
                drop: Some(vec!["ALL".to_owned()]),
            }),
            privileged: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            run_as_user: Some(JOB_UID),
            run_as_group: Some(JOB_UID),
            seccomp_profile: Some(seccomp.clone()),
            proc_mount: Some("Default".to_owned()),
            ..Default::default()
        }),
        volume_mounts: Some(mounts),
        stdin: Some(false),
        tty: Some(false),
        termination_message_policy: Some("File".to_owned()),
        ..Default::default()
    };

    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(job)),
            namespace: Some(kube.namespace.clone()),
            labels: Some(labels(job)),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".to_owned()),
            active_deadline_seconds: Some(active_deadline_seconds(job, kube)),
            termination_grace_period_seconds: Some(0),
            automount_service_account_token: Some(false),
            service_account_name: Some(kube.service_account.clone()),
            enable_service_links: Some(false),
            host_network: Some(false),
            host_pid: Some(false),
            host_ipc: Some(false),
            share_process_namespace: Some(false),
            hostname: Some(HOSTNAME.to_owned()),
            dns_policy: Some("None".to_owned()),
            dns_config: Some(PodDNSConfig {
                nameservers: Some(vec![NAMESERVER.to_owned()]),
                options: None,
                searches: Some(Vec::new()),
            }),
            runtime_class_name: (!kube.runtime_class.is_empty())
                .then(|| kube.runtime_class.clone()),
            node_selector: (!kube.node_selector.is_empty()).then(|| kube.node_selector.clone()),
            tolerations: (!kube.tolerations.is_empty()).then(|| {
                kube.tolerations
                    .iter()
                    .map(|t| Toleration {
                        key: (!t.key.is_empty()).then(|| t.key.clone()),
                        operator: Some(t.operator.clone()),
                        value: (!t.value.is_empty()).then(|| t.value.clone()),
                        effect: (!t.effect.is_empty()).then(|| t.effect.clone()),
                        toleration_seconds: None,
                    })
                    .collect()
            }),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(JOB_UID),
                run_as_group: Some(JOB_UID),
                seccomp_profile: Some(seccomp),
                supplemental_groups: Some(Vec::new()),
                ..Default::default()
            }),
            containers: vec![container],
            volumes: Some(volumes),
            ..Default::default()
        }),
        status: None,
    })
}
