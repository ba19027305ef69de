//! The Pod Security Standards' `restricted` profile (which includes `baseline`), checked
//! on a Pod spec the way the admission controller checks it. The backend checks every Pod
//! before creating it (a violation is a bug: the job fails closed), and the tests check the
//! profile over generated jobs.

use k8s_openapi::api::core::v1::{Container, Pod, SeccompProfile, Volume};

/// Volume types the restricted profile allows.
pub const RESTRICTED_VOLUME_TYPES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];
/// The one capability the restricted profile lets a container add.
pub const RESTRICTED_ADDABLE_CAPABILITY: &str = "NET_BIND_SERVICE";
/// Sysctls the baseline profile allows.
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

fn volume_type(volume: &Volume) -> &'static str {
    let v = volume;
    let kinds: [(&'static str, bool); 30] = [
        ("configMap", v.config_map.is_some()),
        ("csi", v.csi.is_some()),
        ("downwardAPI", v.downward_api.is_some()),
        ("emptyDir", v.empty_dir.is_some()),
        ("ephemeral", v.ephemeral.is_some()),
        ("persistentVolumeClaim", v.persistent_volume_claim.is_some()),
        ("projected", v.projected.is_some()),
        ("secret", v.secret.is_some()),
        ("hostPath", v.host_path.is_some()),
        ("awsElasticBlockStore", v.aws_elastic_block_store.is_some()),
        ("azureDisk", v.azure_disk.is_some()),
        ("azureFile", v.azure_file.is_some()),
        ("cephfs", v.cephfs.is_some()),
        ("cinder", v.cinder.is_some()),
        ("fc", v.fc.is_some()),
        ("flexVolume", v.flex_volume.is_some()),
        ("flocker", v.flocker.is_some()),
        ("gcePersistentDisk", v.gce_persistent_disk.is_some()),
        ("gitRepo", v.git_repo.is_some()),
        ("glusterfs", v.glusterfs.is_some()),
        ("image", v.image.is_some()),
        ("iscsi", v.iscsi.is_some()),
        ("nfs", v.nfs.is_some()),
        ("photonPersistentDisk", v.photon_persistent_disk.is_some()),
        ("portworxVolume", v.portworx_volume.is_some()),
        ("quobyte", v.quobyte.is_some()),
        ("rbd", v.rbd.is_some()),
        ("scaleIO", v.scale_io.is_some()),
        ("storageos", v.storageos.is_some()),
        ("vsphereVolume", v.vsphere_volume.is_some()),
    ];
    kinds
        .iter()
        .find(|(_, set)| *set)
        .map_or("none", |(name, _)| name)
}

fn seccomp_ok(profile: Option<&SeccompProfile>) -> Option<bool> {
    profile.map(|p| p.type_ == "RuntimeDefault" || p.type_ == "Localhost")
}

/// Every way `pod` breaks the `restricted` profile, one line each; empty when it passes.
pub fn restricted_violations(pod: &Pod) -> Vec<String> {
    let mut out = Vec::new();
    let Some(spec) = &pod.spec else {
        return vec!["the Pod has no spec".to_owned()];
    };
    for (field, set) in [
        ("hostNetwork", spec.host_network),
        ("hostPID", spec.host_pid),
        ("hostIPC", spec.host_ipc),
    ] {
        if set == Some(true) {
            out.push(format!("spec.{field} is true"));
        }
    }
    for volume in spec.volumes.iter().flatten() {
        let kind = volume_type(volume);
        if !RESTRICTED_VOLUME_TYPES.contains(&kind) {
            out.push(format!("volume {:?} is of type {kind}", volume.name));
        }
    }
    let pod_sc = spec.security_context.as_ref();
    for sysctl in pod_sc
        .and_then(|sc| sc.sysctls.as_ref())
        .into_iter()
        .flatten()
    {
        if !SAFE_SYSCTLS.contains(&sysctl.name.as_str()) {
            out.push(format!("sysctl {} is not in the safe set", sysctl.name));
        }
    }
    if let Some(se) = pod_sc.and_then(|sc| sc.se_linux_options.as_ref())
        && (se.user.is_some() || se.role.is_some())
    {
        out.push("spec.securityContext.seLinuxOptions sets a user or role".to_owned());
    }
    if pod_sc.and_then(|sc| sc.run_as_user) == Some(0) {
        out.push("spec.securityContext.runAsUser is 0".to_owned());
    }
    if pod_sc
        .and_then(|sc| sc.windows_options.as_ref())
        .and_then(|w| w.host_process)
        == Some(true)
    {
        out.push("spec.securityContext.windowsOptions.hostProcess is true".to_owned());
    }
    let pod_non_root = pod_sc.and_then(|sc| sc.run_as_non_root);
    let pod_seccomp = seccomp_ok(pod_sc.and_then(|sc| sc.seccomp_profile.as_ref()));
    if pod_seccomp == Some(false) {
        out.push("spec.securityContext.seccompProfile is Unconfined".to_owned());
    }
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    for c in containers {
        check_container(c, pod_non_root, pod_seccomp, &mut out);
    }
    if spec
        .ephemeral_containers
        .as_ref()
        .is_some_and(|e| !e.is_empty())
    {
        out.push("the Pod has ephemeral containers".to_owned());
    }
    out
}

fn check_container(
    c: &Container,
    pod_non_root: Option<bool>,
    pod_seccomp: Option<bool>,
    out: &mut Vec<String>,
) {
    let name = &c.name;
    let sc = c.security_context.as_ref();
    if sc.and_then(|s| s.privileged) == Some(true) {
        out.push(format!("container {name}: privileged"));
    }
    if sc.and_then(|s| s.allow_privilege_escalation) != Some(false) {
        out.push(format!(
            "container {name}: allowPrivilegeEscalation is not false"
        ));
    }
    let non_root = sc.and_then(|s| s.run_as_non_root);
    if non_root == Some(false) || (non_root.is_none() && pod_non_root != Some(true)) {
        out.push(format!("container {name}: runAsNonRoot is not true"));
    }
    if sc.and_then(|s| s.run_as_user) == Some(0) {
        out.push(format!("container {name}: runAsUser is 0"));
    }
    match seccomp_ok(sc.and_then(|s| s.seccomp_profile.as_ref())) {
        Some(true) => {}
        Some(false) => out.push(format!("container {name}: seccompProfile is Unconfined")),
        None if pod_seccomp == Some(true) => {}
        None => out.push(format!("container {name}: no seccompProfile")),
    }
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let drops_all = caps
        .and_then(|c| c.drop.as_ref())
        .is_some_and(|d| d.iter().any(|cap| cap == "ALL"));
    if !drops_all {
        out.push(format!("container {name}: capabilities.drop lacks ALL"));
    }
    for cap in caps.and_then(|c| c.add.as_ref()).into_iter().flatten() {
        if cap != RESTRICTED_ADDABLE_CAPABILITY {
            out.push(format!("container {name}: adds capability {cap}"));
        }
    }
    if let Some(pm) = sc.and_then(|s| s.proc_mount.as_deref())
        && pm != "Default"
    {
        out.push(format!("container {name}: procMount {pm}"));
    }
    if let Some(se) = sc.and_then(|s| s.se_linux_options.as_ref())
        && (se.user.is_some() || se.role.is_some())
    {
        out.push(format!(
            "container {name}: seLinuxOptions sets a user or role"
        ));
    }
    for port in c.ports.iter().flatten() {
        if port.host_port.is_some_and(|p| p != 0) {
            out.push(format!("container {name}: hostPort {:?}", port.host_port));
        }
    }
}
