//! The A2A tasks airlock keeps: one per message, owned by the tenant that sent it, kept
//! for [`TASK_TTL`] after it ends and at most [`MAX_TASKS`] at once.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long an ended task stays readable.
pub const TASK_TTL: Duration = Duration::from_secs(15 * 60);

/// Most tasks kept at once; past it the oldest ended ones go, and a new task is refused
/// while every kept one is still running.
pub const MAX_TASKS: usize = 4096;

/// A task's state (A2A 1.0 `TaskState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// The job runs.
    Working,
    /// The job ran; its observation says how.
    Completed,
    /// The job could not run.
    Failed,
    /// CancelTask killed the job.
    Canceled,
}

impl TaskState {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Working => "TASK_STATE_WORKING",
            Self::Completed => "TASK_STATE_COMPLETED",
            Self::Failed => "TASK_STATE_FAILED",
            Self::Canceled => "TASK_STATE_CANCELED",
        }
    }

    /// Whether the task has ended.
    pub fn is_final(self) -> bool {
        self != Self::Working
    }
}

struct Entry {
    tenant: Option<String>,
    context_id: String,
    history: Vec<Value>,
    state: TaskState,
    status_text: Option<String>,
    artifacts: Vec<Value>,
    cancel: CancellationToken,
    ended_at: Option<Instant>,
    done: watch::Sender<bool>,
}

impl Entry {
    fn to_json(&self, id: &str) -> Value {
        let mut status = json!({"state": self.state.as_str()});
        if let Some(text) = &self.status_text {
            status["message"] = json!({
                "messageId": format!("{id}-status"),
                "role": "ROLE_AGENT",
                "parts": [{"text": text}],
            });
        }
        json!({
            "id": id,
            "contextId": self.context_id,
            "status": status,
            "artifacts": self.artifacts,
            "history": self.history,
        })
    }
}

/// What [`Tasks::cancel`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Cancel {
    /// No such task for this tenant.
    NotFound,
    /// It had already ended.
    AlreadyFinal(TaskState),
    /// Cancelled: the task as it is now.
    Cancelled(Value),
}

/// Every kept task.
#[derive(Default)]
pub struct Tasks {
    entries: Mutex<HashMap<String, Entry>>,
}

impl std::fmt::Debug for Tasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tasks").finish_non_exhaustive()
    }
}

impl Tasks {
    /// A new working task of `tenant` for `message`: its id and the token that cancels it.
    pub fn insert(
        &self,
        tenant: Option<String>,
        context_id: String,
        message: Value,
    ) -> Result<(String, CancellationToken), String> {
        let mut entries = self
            .entries
            .lock()
            .map_err(|_| "the task table is poisoned".to_owned())?;
        let now = Instant::now();
        entries.retain(|_, e| e.ended_at.is_none_or(|t| now.duration_since(t) < TASK_TTL));
        while entries.len() >= MAX_TASKS {
            let oldest = entries
                .iter()
                .filter_map(|(id, e)| e.ended_at.map(|t| (t, id.clone())))
                .min();
            match oldest {
                Some((_, id)) => {
                    entries.remove(&id);
                }
                None => return Err(format!("{MAX_TASKS} tasks are running; try again later")),
            }
        }
        let id = uuid::Uuid::now_v7().to_string();
        let cancel = CancellationToken::new();
        let (done, _) = watch::channel(false);
        entries.insert(
            id.clone(),
            Entry {
                tenant,
                context_id,
                history: vec![message],
                state: TaskState::Working,
                status_text: None,
                artifacts: Vec::new(),
                cancel: cancel.clone(),
                ended_at: None,
                done,
            },
        );
        Ok((id, cancel))
    }

    /// Ends a working task (a cancelled one stays cancelled).
    pub fn finish(&self, id: &str, state: TaskState, text: String, artifacts: Vec<Value>) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if let Some(entry) = entries.get_mut(id)
            && !entry.state.is_final()
        {
            entry.state = state;
            entry.status_text = Some(text);
            entry.artifacts = artifacts;
            entry.ended_at = Some(Instant::now());
            entry.done.send_replace(true);
        }
    }

    /// The task as JSON, if `tenant` owns it.
    pub fn get(&self, id: &str, tenant: Option<&str>) -> Option<Value> {
        let entries = self.entries.lock().ok()?;
        let entry = entries.get(id).filter(|e| e.tenant.as_deref() == tenant)?;
        Some(entry.to_json(id))
    }

    /// Cancels `tenant`'s task `id`: its job is killed.
    pub fn cancel(&self, id: &str, tenant: Option<&str>) -> Cancel {
        let Ok(mut entries) = self.entries.lock() else {
            return Cancel::NotFound;
        };
        let Some(entry) = entries
            .get_mut(id)
            .filter(|e| e.tenant.as_deref() == tenant)
        else {
            return Cancel::NotFound;
        };
        if entry.state.is_final() {
            return Cancel::AlreadyFinal(entry.state);
        }
        entry.cancel.cancel();
        entry.state = TaskState::Canceled;
        entry.status_text = Some("cancelled by the client: the job was killed".to_owned());
        entry.ended_at = Some(Instant::now());
        entry.done.send_replace(true);
        Cancel::Cancelled(entry.to_json(id))
    }

    /// Completes when task `id` has ended (or is gone).
    pub async fn wait_final(&self, id: &str) {
        let receiver = {
            let Ok(entries) = self.entries.lock() else {
                return;
            };
            match entries.get(id) {
                Some(entry) => entry.done.subscribe(),
                None => return,
            }
        };
        let mut receiver = receiver;
        // An error means the entry was dropped: nothing more to wait for.
        let _ = receiver.wait_for(|done| *done).await;
    }
}
