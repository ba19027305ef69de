//! The test kubelet: every new Pod becomes a real container on the local Docker daemon.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, KillContainerOptions, WaitContainerOptions,
};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::json;

use super::apiserver::{State, is_deleted};

/// The node-wide pids limit of every Pod (a kubelet's `podPidsLimit`; a Pod spec has none).
pub const POD_PIDS_LIMIT: i64 = 1024;
/// Where downward API volumes are written on this "node".
pub const VOLUME_ROOT: &str = "/run/airlock-kube-fake";
/// The label of the fake kubelet's containers (never `airlock.managed`: the Docker
/// backend's sweep must not take them for its own).
pub const LABEL_FAKE: &str = "airlock.kube-fake";

/// Runs every Pod that is created.
pub async fn run(
    state: Arc<State>,
    socket: PathBuf,
    mut events: tokio::sync::broadcast::Receiver<super::apiserver::Event>,
) {
    use tokio::sync::broadcast::error::RecvError;
    let docker = airlock_docker::cleanup::connect(&socket)
        .unwrap()
        .negotiate_version()
        .await
        .unwrap();
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
                let _ = std::fs::remove_dir_all(Path::new(VOLUME_ROOT).join(&name));
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

/// Writes the Pod's downward API volumes as files; returns volume name → host dir.
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
        let Some(downward) = &volume.downward_api else {
            continue;
        };
        let dir = Path::new(VOLUME_ROOT).join(&name).join(&volume.name);
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
    pod: &Pod,
    c: &Container,
    image_id: &str,
    volumes: &HashMap<String, PathBuf>,
) -> Result<ContainerCreateBody, String> {
    let spec = pod.spec.as_ref().unwrap();
    let sc = c.security_context.clone().unwrap_or_default();
    let psc = spec.security_context.clone().unwrap_or_default();
    if sc
        .seccomp_profile
        .as_ref()
        .is_some_and(|p| p.type_ != "RuntimeDefault")
    {
        return Err("the fake kubelet runs RuntimeDefault seccomp only".into());
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
    let mut tmpfs = HashMap::new();
    let mut binds = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let volume = spec
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .ok_or("mount of a missing volume")?;
        if let Some(dir) = &volume.empty_dir {
            // As a kubelet mounts a memory-backed emptyDir: size only, exec allowed.
            let size = dir
                .size_limit
                .as_ref()
                .map_or(64 << 20, |q| quantity_bytes(&q.0));
            tmpfs.insert(m.mount_path.clone(), format!("rw,exec,size={size}"));
        } else if let Some(dir) = volumes.get(&m.name) {
            binds.push(format!("{}:{}:ro", dir.display(), m.mount_path));
        } else {
            return Err(format!("unsupported volume {}", m.name));
        }
    }
    let mut labels = HashMap::from([(LABEL_FAKE.to_owned(), "true".to_owned())]);
    if let Some(job) = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("airlock.job"))
    {
        labels.insert("airlock.job".to_owned(), job.clone());
    }
    let mut security_opt = Vec::new();
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
            tmpfs: Some(tmpfs),
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
    let checked = match airlock_docker::image::check(docker, "kube", reference, digest).await {
        Ok(checked) => checked,
        Err(e) => {
            waiting(state, &name, "ErrImagePull", &e.to_string());
            return Ok(());
        }
    };
    let volumes = project_volumes(&pod)?;
    let body = match container_body(&pod, &c, &checked.id, &volumes) {
        Ok(body) => body,
        Err(e) => {
            waiting(state, &name, "CreateContainerConfigError", &e);
            return Ok(());
        }
    };
    let container = format!("{name}-job");
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(container.clone()),
                platform: String::new(),
            }),
            body,
        )
        .await
        .map_err(|e| e.to_string())?;
    let result = supervise(state, docker, &pod, &container).await;
    let _ = airlock_docker::cleanup::remove(docker, &container).await;
    result
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
    // The container is gone before the status says so, as with a real kubelet.
    let _ = airlock_docker::cleanup::remove(docker, container).await;
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
