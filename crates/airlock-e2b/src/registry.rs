//! The E2B sandboxes of a server: each an airlock session of its tenant, with the E2B
//! id, access token, template, metadata, environment and end time the SDKs see, and the
//! commands running in it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use subtle::ConstantTimeEq;
use tokio::sync::oneshot;

use crate::E2bHost;

/// How often sandboxes past their end are looked for.
const REAP_INTERVAL: Duration = Duration::from_millis(500);

/// A running command of a sandbox.
#[derive(Debug)]
pub struct RunningCommand {
    /// The command line, as the SDK sent it (for `List`).
    pub cmd: String,
    /// The arguments.
    pub args: Vec<String>,
    /// Sending kills the command (the engine removes its sandbox); the reason.
    pub kill: Option<oneshot::Sender<String>>,
}

/// One E2B sandbox.
#[derive(Debug)]
pub struct Sandbox {
    /// The E2B id.
    pub id: String,
    /// The tenant that created it (`None`: a server without tokens).
    pub tenant: Option<String>,
    /// The tenant's name for the session manager.
    pub session_tenant: String,
    /// The session that holds its workspace.
    pub session_id: String,
    /// The template it was created from.
    pub template: String,
    /// The `envdAccessToken` every in-sandbox call must carry.
    pub access_token: String,
    /// The `trafficAccessToken` the code interpreter's SDK sends (instead of the access
    /// token on its contexts calls).
    pub traffic_token: String,
    /// The create request's metadata.
    pub metadata: BTreeMap<String, String>,
    /// The create request's environment, for every command.
    pub envs: BTreeMap<String, String>,
    /// Whether its commands may reach the network (the policy's mode) or not (`none`).
    pub internet: bool,
    /// When it was created.
    pub started_at: SystemTime,
    /// When it ends: its E2B timeout, never past the session's `ttl`.
    pub end_at: Mutex<SystemTime>,
    /// When its session ends at the latest (the policy's `ttl`).
    pub ttl_end: SystemTime,
    /// Its running commands, by pid.
    pub commands: Mutex<HashMap<u32, RunningCommand>>,
    next_pid: AtomicU32,
}

impl Sandbox {
    /// A sandbox record.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: String,
        tenant: Option<String>,
        session_tenant: String,
        session_id: String,
        template: String,
        access_token: String,
        traffic_token: String,
        metadata: BTreeMap<String, String>,
        envs: BTreeMap<String, String>,
        internet: bool,
        timeout: Duration,
        ttl: Duration,
    ) -> Self {
        let now = SystemTime::now();
        Self {
            id,
            tenant,
            session_tenant,
            session_id,
            template,
            access_token,
            traffic_token,
            metadata,
            envs,
            internet,
            started_at: now,
            end_at: Mutex::new(now + timeout.min(ttl)),
            ttl_end: now + ttl,
            commands: Mutex::new(HashMap::new()),
            next_pid: AtomicU32::new(1000),
        }
    }

    /// When it ends.
    pub fn end_at(&self) -> SystemTime {
        *self.end_at.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The time `timeout` from now, capped by the session's `ttl` (a huge timeout cannot
    /// overflow the clock).
    pub fn end_after(&self, timeout: Duration) -> SystemTime {
        SystemTime::now()
            .checked_add(timeout)
            .map_or(self.ttl_end, |end| end.min(self.ttl_end))
    }

    /// Sets its end to `timeout` from now, capped by the session's `ttl`; the end set.
    pub fn set_timeout(&self, timeout: Duration) -> SystemTime {
        let end = self.end_after(timeout);
        *self.end_at.lock().unwrap_or_else(PoisonError::into_inner) = end;
        end
    }

    /// Whether `token` is its access token (constant time).
    pub fn token_matches(&self, token: &str) -> bool {
        bool::from(self.access_token.as_bytes().ct_eq(token.as_bytes()))
    }

    /// Whether `token` is its traffic token (constant time).
    pub fn traffic_token_matches(&self, token: &str) -> bool {
        bool::from(self.traffic_token.as_bytes().ct_eq(token.as_bytes()))
    }

    /// A new pid for a command.
    pub fn next_pid(&self) -> u32 {
        self.next_pid.fetch_add(1, Ordering::Relaxed)
    }

    /// Kills the command `pid`; `false` when there is no such command.
    pub fn kill_command(&self, pid: u32, reason: &str) -> bool {
        let mut commands = self.commands.lock().unwrap_or_else(PoisonError::into_inner);
        match commands.get_mut(&pid) {
            Some(command) => {
                if let Some(kill) = command.kill.take() {
                    let _ = kill.send(reason.to_owned());
                }
                true
            }
            None => false,
        }
    }

    /// Kills every running command.
    pub fn kill_all_commands(&self, reason: &str) {
        let mut commands = self.commands.lock().unwrap_or_else(PoisonError::into_inner);
        for command in commands.values_mut() {
            if let Some(kill) = command.kill.take() {
                let _ = kill.send(reason.to_owned());
            }
        }
    }
}

/// The sandboxes, by E2B id.
#[derive(Debug, Default)]
pub struct SandboxRegistry {
    sandboxes: Mutex<HashMap<String, Arc<Sandbox>>>,
}

impl SandboxRegistry {
    /// Adds a sandbox.
    pub fn insert(&self, sandbox: Arc<Sandbox>) {
        self.sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(sandbox.id.clone(), sandbox);
    }

    /// The sandbox `id`, whoever owns it (the data plane checks its token).
    pub fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// The sandbox `id` when `tenant` owns it (another tenant's is as absent as none).
    pub fn get_owned(&self, tenant: Option<&str>, id: &str) -> Option<Arc<Sandbox>> {
        self.get(id).filter(|s| s.tenant.as_deref() == tenant)
    }

    /// The sandboxes `tenant` owns, oldest first.
    pub fn list(&self, tenant: Option<&str>) -> Vec<Arc<Sandbox>> {
        let mut list: Vec<Arc<Sandbox>> = self
            .sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|s| s.tenant.as_deref() == tenant)
            .cloned()
            .collect();
        list.sort_by_key(|s| s.started_at);
        list
    }

    /// Removes the sandbox `id` and ends its session (its commands are killed, its
    /// workspace destroyed); `false` when there was none.
    pub async fn kill(&self, host: &dyn E2bHost, id: &str, reason: &str) -> bool {
        let removed = self
            .sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        let Some(sandbox) = removed else {
            return false;
        };
        sandbox.kill_all_commands(reason);
        if let Ok(sessions) = host.sessions() {
            // Gone already (its ttl or idle ended it) is fine.
            let _ = sessions
                .delete(&sandbox.session_tenant, &sandbox.session_id)
                .await;
        }
        audit(
            host,
            &sandbox,
            serde_json::json!({"event": "e2b_sandbox_end", "reason": reason}),
        );
        tracing::info!(sandbox = %id, reason, "e2b sandbox ended");
        true
    }

    /// Kills every sandbox.
    pub async fn kill_all(&self, host: &dyn E2bHost) {
        let ids: Vec<String> = self
            .sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        for id in ids {
            self.kill(host, &id, "shutdown").await;
        }
    }

    /// Kills the sandboxes past their end, and forgets those whose session ended by
    /// itself (its `ttl` or `idle`).
    async fn reap(&self, host: &dyn E2bHost) {
        let now = SystemTime::now();
        let sessions = host.sessions().ok();
        let due: Vec<(String, &'static str)> = self
            .sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(|s| {
                if s.end_at() <= now {
                    return Some((s.id.clone(), "timeout"));
                }
                let gone = sessions
                    .as_ref()
                    .is_some_and(|m| m.get(&s.session_tenant, &s.session_id).is_err());
                gone.then(|| (s.id.clone(), "session_ended"))
            })
            .collect();
        for (id, reason) in due {
            self.kill(host, &id, reason).await;
        }
    }
}

/// Writes an E2B audit line (the sandbox id beside its session's) into the tenant's
/// audit log.
pub fn audit(host: &dyn E2bHost, sandbox: &Sandbox, line: serde_json::Value) {
    let mut line = line;
    line["time"] = serde_json::json!(airlock_core::audit::format_rfc3339_millis(SystemTime::now()));
    line["e2b_sandbox_id"] = serde_json::json!(sandbox.id);
    line["session_id"] = serde_json::json!(sandbox.session_id);
    line["tenant"] = serde_json::json!(sandbox.session_tenant);
    line["template"] = serde_json::json!(sandbox.template);
    let engine = host.engine(sandbox.tenant.as_deref());
    if let Err(e) = engine.audit().append_line(&format!("{line}\n")) {
        tracing::error!(sandbox = %sandbox.id, error = %e, "e2b audit line not written");
    }
}

/// Reaps until the registry is dropped.
pub(crate) async fn reap_loop(registry: Weak<SandboxRegistry>, host: Arc<dyn E2bHost>) {
    loop {
        tokio::time::sleep(REAP_INTERVAL).await;
        let Some(registry) = registry.upgrade() else {
            return;
        };
        registry.reap(host.as_ref()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(timeout: Duration, ttl: Duration) -> Sandbox {
        Sandbox::new(
            "abc".into(),
            Some("t".into()),
            "t".into(),
            "s".into(),
            "base".into(),
            "token-a".into(),
            "token-b".into(),
            BTreeMap::new(),
            BTreeMap::new(),
            true,
            timeout,
            ttl,
        )
    }

    #[test]
    fn timeouts_are_capped_by_the_ttl_and_never_overflow() {
        let s = sandbox(Duration::from_secs(u64::MAX), Duration::from_secs(60));
        assert_eq!(s.end_at(), s.ttl_end);
        let end = s.set_timeout(Duration::from_secs(u64::MAX));
        assert_eq!(end, s.ttl_end);
        let shorter = s.set_timeout(Duration::from_secs(5));
        assert!(shorter < s.ttl_end);
        assert!(s.token_matches("token-a") && !s.token_matches("token-b"));
        assert!(s.traffic_token_matches("token-b") && !s.traffic_token_matches(""));
    }

    #[test]
    fn only_running_commands_are_killed() {
        let s = sandbox(Duration::from_secs(5), Duration::from_secs(60));
        let (kill, mut killed) = oneshot::channel();
        let pid = s.next_pid();
        s.commands.lock().unwrap().insert(
            pid,
            RunningCommand {
                cmd: "sleep".into(),
                args: vec![],
                kill: Some(kill),
            },
        );
        assert!(!s.kill_command(pid + 1, "x"));
        assert!(s.kill_command(pid, "by test"));
        assert_eq!(killed.try_recv().unwrap(), "by test");
    }
}
