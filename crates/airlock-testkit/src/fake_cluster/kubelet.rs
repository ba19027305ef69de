//! The test kubelet: every new Pod becomes a real container on the local Docker daemon.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::errors::Error::DockerResponseServerError;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, KillContainerOptions, RemoveContainerOptions,
    WaitContainerOptions,
};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::json;

use super::apiserver::{State, is_deleted};

/// The node-wide pids limit of every Pod (a kubelet's `podPidsLimit`; a Pod spec has none),
/// small, as a node for airlock's jobs should set it (docs/kube.md): at 1024, a fork bomb
/// of a thousand interpreters thrashing at the memory limit took the daemon over a minute
/// to kill on a 2-core CI machine.
pub const POD_PIDS_LIMIT: i64 = 128;
/// Where downward API volumes are written on this "node".
pub const VOLUME_ROOT: &str = "/run/airlock-kube-fake";
/// The label of the fake kubelet's containers (never `airlock.managed`: the Docker
/// backend's sweep must not take them for its own).
pub const LABEL_FAKE: &str = "airlock.kube-fake";
/// The label naming the fake cluster a container belongs to ([`State::instance`]).
pub const LABEL_INSTANCE: &str = "airlock.kube-fake.instance";
/// This node's seccomp directory (a kubelet's `<root-dir>/seccomp`): a Pod's
/// `seccompProfile: {type: Localhost, localhostProfile: P}` is the file `SECCOMP_ROOT/P`.
pub const SECCOMP_ROOT: &str = "/run/airlock-kube-fake/seccomp";

/// How long a request to the Docker daemon may take.
const CLIENT_TIMEOUT_SECS: u64 = 30;
/// How many times [`remove`] asks the daemon before it gives up, and the pause between.
const REMOVE_ATTEMPTS: u32 = 5;
const REMOVE_RETRY_PAUSE: Duration = Duration::from_millis(200);

/// A client of the Docker daemon at `socket`, this "node"'s container runtime.
pub fn connect(socket: &Path) -> Result<Docker, bollard::errors::Error> {
    Docker::connect_with_unix(
        &socket.to_string_lossy(),
        CLIENT_TIMEOUT_SECS,
        bollard::API_DEFAULT_VERSION,
    )
}

/// Force-removes a container with its anonymous volumes, asking again a few times; one
/// already gone, or being removed already, is fine.
async fn remove(docker: &Docker, container: &str) -> Result<(), bollard::errors::Error> {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        link: false,
    };
    let mut attempt = 1;
    loop {
        match docker
            .remove_container(container, Some(options.clone()))
            .await
        {
            Ok(())
            | Err(DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(()),
            Err(DockerResponseServerError {
                status_code: 409,
                message,
            }) if message.contains("already in progress") => return Ok(()),
            Err(e) if attempt < REMOVE_ATTEMPTS => {
                eprintln!("fake kubelet: remove {container} (attempt {attempt}): {e}");
                tokio::time::sleep(REMOVE_RETRY_PAUSE).await;
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The id of the image a Pod names as `reference@digest`, when the image this node has
/// under `reference` is the one `digest` pins (its id, or one of its repository digests);
/// else why not, as a kubelet's `ErrImagePull` message (this node never pulls).
async fn resolve_image(docker: &Docker, reference: &str, digest: &str) -> Result<String, String> {
    let image = match docker.inspect_image(reference).await {
        Ok(image) => image,
        Err(DockerResponseServerError {
            status_code: 404, ..
        }) => {
            return Err(format!(
                "image {reference}@{digest} is not on this node, which never pulls"
            ));
        }
        Err(e) => return Err(format!("inspect image {reference}: {e}")),
    };
    let id = image.id.clone().unwrap_or_default();
    let pinned = id == digest
        || image
            .repo_digests
            .iter()
            .flatten()
            .any(|d| d.rsplit_once('@').is_some_and(|(_, d)| d == digest));
    if !pinned || id.is_empty() {
        return Err(format!(
            "image {reference} on this node is {id}, not the pinned {digest}"
        ));
    }
    Ok(id)
}

/// Runs every Pod that is created.
pub async fn run(
    state: Arc<State>,
    socket: PathBuf,
    mut events: tokio::sync::broadcast::Receiver<super::apiserver::Event>,
) {
    use tokio::sync::broadcast::error::RecvError;
    let docker = connect(&socket).unwrap().negotiate_version().await.unwrap();
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(RecvError::Lagged(n)) => panic!("fake kubelet missed {n} events"),
            Err(RecvError::Closed) => return,
        };
        if event.kind == "ADDED" {
            let (state, docker) = (state.clone(), docker.clone());
            tokio::spawn(async move {
                let name = event.pod.metadata.name.clone().unwrap_or_default();
                if let Err(reason) = run_pod(&state, &docker, event.pod).await {
                    eprintln!("fake kubelet: pod {name}: {reason}");
                }
                release_volumes(&name);
            });
        }
    }
}

fn waiting(state: &State, name: &str, reason: &str, message: &str) {
    state.update(name, |pod| {
        pod.status = Some(serde_json::from_value(json!({"phase": "Pending",
            "containerStatuses": [{"name": "job", "image": "", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"waiting": {"reason": reason, "message": message}}}]})).unwrap());
    });
}

fn quantity_bytes(text: &str) -> i64 {
    text.parse().unwrap_or(0)
}

fn cpu_nanos(text: &str) -> i64 {
    match text.strip_suffix('m') {
        Some(milli) => milli.parse::<i64>().unwrap_or(0) * 1_000_000,
        None => (text.parse::<f64>().unwrap_or(0.0) * 1e9) as i64,
    }
}

/// Mounts a memory-backed emptyDir as a kubelet does: a tmpfs of its size limit on the
/// node, with no nosuid, nodev or noexec, world-writable (mode 1777), bound into the
/// container. (Docker's own tmpfs mounts would add nosuid and nodev, and take the mode of
/// the directory they cover, which for the working directory is root's 0755.)
fn mount_tmpfs(dir: &Path, size: i64) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let out = std::process::Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=1777"),
            "tmpfs",
        ])
        .arg(dir)
        .output()
        .map_err(|e| format!("mount: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mount tmpfs on {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Unmounts and removes a Pod's volumes on this node.
pub fn release_volumes(pod: &str) {
    let root = Path::new(VOLUME_ROOT).join(pod);
    if let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") {
        // Field 5 is the mount point; ours have no characters mountinfo escapes.
        let mut points: Vec<&str> = info
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| Path::new(p).starts_with(&root))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in points {
            let _ = std::process::Command::new("umount").arg(point).status();
        }
    }
    let _ = std::fs::remove_dir_all(&root);
}

/// Writes the Pod's downward API volumes as files and mounts its emptyDirs; returns volume
/// name → host dir.
fn project_volumes(pod: &Pod) -> Result<HashMap<String, PathBuf>, String> {
    use std::os::unix::fs::PermissionsExt;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let mut dirs = HashMap::new();
    for volume in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
    {
        let dir = Path::new(VOLUME_ROOT).join(&name).join(&volume.name);
        if let Some(empty) = &volume.empty_dir {
            if empty.medium.as_deref() != Some("Memory") {
                return Err(format!("emptyDir {} is not memory-backed", volume.name));
            }
            let size = empty
                .size_limit
                .as_ref()
                .map_or(64 << 20, |q| quantity_bytes(&q.0));
            mount_tmpfs(&dir, size)?;
            dirs.insert(volume.name.clone(), dir);
            continue;
        }
        let Some(downward) = &volume.downward_api else {
            continue;
        };
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        for item in downward.items.iter().flatten() {
            let field = &item
                .field_ref
                .as_ref()
                .ok_or("only fieldRef items")?
                .field_path;
            let key = field
                .strip_prefix("metadata.annotations['")
                .and_then(|k| k.strip_suffix("']"))
                .ok_or_else(|| format!("unsupported field {field}"))?;
            let path = dir.join(&item.path);
            std::fs::create_dir_all(path.parent().unwrap()).map_err(|e| e.to_string())?;
            std::fs::write(&path, annotations.get(key).cloned().unwrap_or_default())
                .map_err(|e| e.to_string())?;
            let mode = item.mode.or(downward.default_mode).unwrap_or(0o644) as u32;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| e.to_string())?;
        }
        dirs.insert(volume.name.clone(), dir);
    }
    Ok(dirs)
}

fn container_body(
    instance: &str,
    pod: &Pod,
    c: &Container,
    image_id: &str,
    volumes: &HashMap<String, PathBuf>,
) -> Result<ContainerCreateBody, String> {
    let spec = pod.spec.as_ref().unwrap();
    let sc = c.security_context.clone().unwrap_or_default();
    let psc = spec.security_context.clone().unwrap_or_default();
    let mut security_opt = Vec::new();
    // The container's profile, else the Pod's; none at all is refused (a kubelet would run
    // the container unconfined, which airlock never asks for).
    let seccomp = sc
        .seccomp_profile
        .as_ref()
        .or(psc.seccomp_profile.as_ref())
        .ok_or("no seccomp profile")?;
    match (seccomp.type_.as_str(), seccomp.localhost_profile.as_deref()) {
        // Docker's default profile stands in for the runtime's.
        ("RuntimeDefault", _) => {}
        ("Localhost", Some(path))
            if !path.starts_with('/') && !path.split('/').any(|s| s == "..") =>
        {
            let file = Path::new(SECCOMP_ROOT).join(path);
            let profile = std::fs::read_to_string(&file)
                .map_err(|e| format!("cannot load seccomp profile {}: {e}", file.display()))?;
            // The Engine API takes the profile's JSON itself.
            security_opt.push(format!("seccomp={profile}"));
        }
        (kind, path) => return Err(format!("unsupported seccomp profile {kind} {path:?}")),
    }
    let uid = sc.run_as_user.or(psc.run_as_user).unwrap_or(0);
    let gid = sc.run_as_group.or(psc.run_as_group).unwrap_or(0);
    if sc.run_as_non_root.or(psc.run_as_non_root) == Some(true) && uid == 0 {
        return Err("CreateContainerConfigError: runAsNonRoot and uid 0".into());
    }
    let limits = c
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    let memory = limits.get("memory").map(|q| quantity_bytes(&q.0));
    let mut binds = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .ok_or("mount of a missing volume")?;
        if let Some(dir) = volumes.get(&m.name) {
            let mode = if m.read_only == Some(true) || volume.downward_api.is_some() {
                "ro"
            } else {
                "rw"
            };
            binds.push(format!("{}:{}:{mode}", dir.display(), m.mount_path));
        } else {
            return Err(format!("unsupported volume {}", m.name));
        }
    }
    let mut labels = HashMap::from([
        (LABEL_FAKE.to_owned(), "true".to_owned()),
        (LABEL_INSTANCE.to_owned(), instance.to_owned()),
    ]);
    if let Some(job) = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("airlock.job"))
    {
        labels.insert("airlock.job".to_owned(), job.clone());
    }
    if sc.allow_privilege_escalation == Some(false) {
        security_opt.push("no-new-privileges".to_owned());
    }
    Ok(ContainerCreateBody {
        image: Some(image_id.to_owned()),
        hostname: spec.hostname.clone(),
        user: Some(format!("{uid}:{gid}")),
        entrypoint: c.command.clone(),
        cmd: Some(c.args.clone().unwrap_or_default()),
        // What a kubelet adds to every container (enableServiceLinks: false still leaves these).
        env: Some(vec![
            "KUBERNETES_SERVICE_HOST=10.96.0.1".to_owned(),
            "KUBERNETES_SERVICE_PORT=443".to_owned(),
            format!("HOSTNAME={}", spec.hostname.clone().unwrap_or_default()),
        ]),
        working_dir: c.working_dir.clone(),
        labels: Some(labels),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_owned()),
            readonly_rootfs: sc.read_only_root_filesystem,
            binds: Some(binds),
            cap_drop: sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            cap_add: sc.capabilities.as_ref().and_then(|c| c.add.clone()),
            privileged: sc.privileged,
            security_opt: Some(security_opt),
            memory,
            memory_swap: memory,
            nano_cpus: limits.get("cpu").map(|q| cpu_nanos(&q.0)),
            pids_limit: Some(POD_PIDS_LIMIT),
            log_config: Some(HostConfigLogConfig {
                typ: Some("none".to_owned()),
                config: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

async fn run_pod(state: &State, docker: &Docker, pod: Pod) -> Result<(), String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let spec = pod.spec.clone().ok_or("no spec")?;
    let c = spec.containers.first().ok_or("no container")?.clone();
    waiting(state, &name, "ContainerCreating", "");
    let image = c.image.clone().unwrap_or_default();
    let (reference, digest) = image.rsplit_once('@').ok_or("image not by digest")?;
    let image_id = match resolve_image(docker, reference, digest).await {
        Ok(id) => id,
        Err(e) => {
            waiting(state, &name, "ErrImagePull", &e);
            return Ok(());
        }
    };
    let volumes = project_volumes(&pod)?;
    let body = match container_body(&state.instance, &pod, &c, &image_id, &volumes) {
        Ok(body) => body,
        Err(e) => {
            waiting(state, &name, "CreateContainerConfigError", &e);
            return Ok(());
        }
    };
    let container = format!("{name}-job");
    if let Err(e) = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(container.clone()),
                platform: String::new(),
            }),
            body,
        )
        .await
    {
        // As a kubelet reports a container the runtime would not create.
        waiting(state, &name, "CreateContainerError", &e.to_string());
        return Ok(());
    }
    let result = supervise(state, docker, &pod, &container).await;
    let _ = remove(docker, &container).await;
    result
}

/// Longest wait for the daemon to remove a container.
pub const REMOVE_TIMEOUT: Duration = Duration::from_secs(60);

/// Force-removes a container and waits until the daemon no longer has it. An error leaves
/// the Pod in place (its deletion then never completes), as a kubelet that cannot stop a
/// container does.
async fn remove_until_gone(docker: &Docker, container: &str) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + REMOVE_TIMEOUT;
    loop {
        if let Err(e) = remove(docker, container).await {
            eprintln!("fake kubelet: remove {container}: {e}");
        }
        match docker.inspect_container(container, None).await {
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(()),
            Ok(_) | Err(_) if tokio::time::Instant::now() >= deadline => {
                return Err(format!(
                    "container {container} still there after {REMOVE_TIMEOUT:?}"
                ));
            }
            Ok(_) | Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// SIGKILL, from a task of its own: the daemon may hold the kill until the container's
/// output is drained, which this loop must keep doing meanwhile.
fn kill(docker: &Docker, container: &str) {
    let (docker, container) = (docker.clone(), container.to_owned());
    tokio::spawn(async move {
        let _ = docker
            .kill_container(
                &container,
                Some(KillContainerOptions {
                    signal: "SIGKILL".to_owned(),
                }),
            )
            .await;
    });
}

async fn supervise(
    state: &State,
    docker: &Docker,
    pod: &Pod,
    container: &str,
) -> Result<(), String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    if is_deleted(state, &name) {
        return Ok(());
    }
    let attached = docker
        .attach_container(
            container,
            Some(AttachContainerOptions {
                stream: true,
                stdout: true,
                stderr: true,
                stdin: false,
                logs: false,
                detach_keys: None,
            }),
        )
        .await
        .map_err(|e| e.to_string())?;
    docker
        .start_container(container, None)
        .await
        .map_err(|e| e.to_string())?;
    state.set_log(&name, |log| log.started = true);
    let started = k8s_openapi::jiff::Timestamp::now();
    state.update(&name, |p| {
        p.status = Some(serde_json::from_value(json!({"phase": "Running", "startTime": started.to_string(),
            "containerStatuses": [{"name": "job", "image": "", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": started.to_string()}}}]})).unwrap());
    });
    let deadline = tokio::time::Instant::now()
        + Duration::from_secs(
            pod.spec
                .as_ref()
                .and_then(|s| s.active_deadline_seconds)
                .unwrap_or(3600) as u64,
        );
    let mut output = attached.output;
    let mut events = state.events.subscribe();
    let mut wait = Box::pin(docker.wait_container(
        container,
        Some(WaitContainerOptions {
            condition: "not-running".to_owned(),
        }),
    ));
    let mut deadline_hit = false;
    let mut killed = false;
    let mut output_done = false;
    let mut exited = false;
    let mut drain: Option<tokio::time::Instant> = None;
    while !(exited && output_done) {
        if drain.is_none() && (exited || killed) {
            drain = Some(tokio::time::Instant::now() + Duration::from_secs(5));
        }
        tokio::select! {
            _ = tokio::time::sleep_until(drain.unwrap_or(deadline)), if drain.is_some() => {
                eprintln!("fake kubelet: {name}: output or exit not seen 5 s after the end (exited {exited}, output done {output_done})");
                break;
            }
            chunk = output.next(), if !output_done => match chunk {
                Some(Ok(LogOutput::StdOut { message })) => state.append_log(&name, false, &message),
                Some(Ok(LogOutput::StdErr { message })) => state.append_log(&name, true, &message),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => output_done = true,
            },
            _ = wait.next(), if !exited => exited = true,
            event = events.recv(), if !killed => {
                if let Ok(e) = event
                    && e.pod.metadata.name.as_deref() == Some(name.as_str())
                    && (e.kind == "DELETED" || e.pod.metadata.deletion_timestamp.is_some())
                {
                    killed = true;
                    eprintln!("fake kubelet: {name} deleted: killing");
                    kill(docker, container);
                }
            },
            _ = tokio::time::sleep_until(deadline), if !deadline_hit && !killed => {
                deadline_hit = true;
                killed = true;
                kill(docker, container);
            }
        }
    }
    eprintln!("fake kubelet: {name} ended (killed {killed})");
    let inspect = docker
        .inspect_container(container, None)
        .await
        .map_err(|e| e.to_string())?;
    let s = inspect.state.unwrap_or_default();
    let code = s.exit_code.unwrap_or(-1);
    let oom = s.oom_killed.unwrap_or(false);
    let reason = if oom {
        "OOMKilled"
    } else if code == 0 {
        "Completed"
    } else {
        "Error"
    };
    let finished = k8s_openapi::jiff::Timestamp::now();
    // The container is gone before the status says so, as with a real kubelet. (A container
    // of a thousand processes thrashing at its memory limit can take the daemon more than
    // the drain's 5 s to kill.)
    remove_until_gone(docker, container).await?;
    state.set_log(&name, |log| log.done = true);
    let mut status = json!({"phase": if code == 0 && !deadline_hit { "Succeeded" } else { "Failed" }, "startTime": started.to_string(),
        "containerStatuses": [{"name": "job", "image": "", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": reason, "startedAt": started.to_string(), "finishedAt": finished.to_string()}}}]});
    if deadline_hit {
        status["reason"] = "DeadlineExceeded".into();
    }
    let deleting = is_deleted(state, &name);
    state.update(&name, |p| {
        p.status = Some(serde_json::from_value(status).unwrap())
    });
    if deleting {
        state.remove(&name);
    }
    Ok(())
}

/// Removes every container of the fake cluster `instance` (its shutdown), returning how many.
pub async fn remove_all(docker: &Docker, instance: &str) -> Result<usize, String> {
    use bollard::query_parameters::ListContainersOptions;
    let filters = HashMap::from([(
        "label".to_owned(),
        vec![
            format!("{LABEL_FAKE}=true"),
            format!("{LABEL_INSTANCE}={instance}"),
        ],
    )]);
    let containers = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .map_err(|e| e.to_string())?;
    let mut removed = 0;
    for id in containers.into_iter().filter_map(|c| c.id) {
        remove(docker, &id).await.map_err(|e| e.to_string())?;
        removed += 1;
    }
    Ok(removed)
}
