//! The tasks a `run_code` call became (the `io.modelcontextprotocol/tasks` extension):
//! who owns each, its status, and its result once the job ends.
//!
//! A task belongs to the tenant that created it: for any other tenant it does not exist
//! (`tasks/get` and `tasks/cancel` answer exactly as for an unknown id). A tenant holds at
//! most `[mcp] tasks_per_tenant` tasks, running or finished; a finished one is kept for
//! `[mcp] task_ttl` after it ends, then forgotten. Cancelling a task fires its token,
//! which drops the call and so kills its job.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use airlock_core::policy::McpPolicy;
use rmcp::model::{
    CallToolResult, CreateTaskResult, DetailedTask, JsonObject, Task, TaskPayload, TaskStatus,
};
use tokio_util::sync::CancellationToken;

/// How often a client should poll `tasks/get` (`pollIntervalMs`).
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Why the store refused or did not find a task.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// The tenant already holds as many tasks as its policy allows.
    #[error(
        "this caller already holds {limit} MCP tasks, the most the policy allows ([mcp] tasks_per_tenant); \
         cancel one, or wait until a finished one expires ({ttl}s after it ended)"
    )]
    TooMany {
        /// The bound.
        limit: u32,
        /// How long a finished task is kept, in seconds.
        ttl: u64,
    },
    /// No task with this id belongs to the caller (never existed, expired, or another
    /// tenant's: the three are not told apart).
    #[error(
        "task not found: no task {0:?} belongs to this caller (unknown, another caller's, or expired)"
    )]
    NotFound(String),
}

/// What a task is doing.
#[derive(Debug, Clone)]
enum State {
    Working,
    Completed(JsonObject),
    Failed(JsonObject),
    Cancelled,
}

#[derive(Debug)]
struct Entry {
    tenant: Option<String>,
    created: Instant,
    created_at: String,
    last_updated_at: String,
    /// Kept this long after the task ends.
    keep: Duration,
    /// The longest the job can run (the TTL a working task reports).
    longest_run: Duration,
    /// When the task ended, once it has.
    ended: Option<Instant>,
    /// Whether the client was given the task (a call that finished within `task_after`
    /// is answered directly and its reservation dropped).
    published: bool,
    state: State,
    cancel: CancellationToken,
}

impl Entry {
    fn touch(&mut self) {
        self.last_updated_at = rmcp::task_manager::current_timestamp();
    }

    fn expired(&self, now: Instant) -> bool {
        self.ended
            .is_some_and(|ended| now.saturating_duration_since(ended) >= self.keep)
    }

    /// The time to live from creation: until the job's longest run plus the keep while
    /// it runs, the exact end plus the keep once it has ended.
    fn ttl(&self) -> Duration {
        match self.ended {
            Some(ended) => ended.saturating_duration_since(self.created) + self.keep,
            None => self.longest_run + self.keep,
        }
    }

    fn task(&self, id: &str) -> Task {
        let status = match self.state {
            State::Working => TaskStatus::Working,
            State::Completed(_) => TaskStatus::Completed,
            State::Failed(_) => TaskStatus::Failed,
            State::Cancelled => TaskStatus::Cancelled,
        };
        let mut task = Task::new(
            id,
            status,
            self.created_at.clone(),
            self.last_updated_at.clone(),
        )
        .with_ttl_ms(u64::try_from(self.ttl().as_millis()).unwrap_or(u64::MAX))
        .with_poll_interval_ms(POLL_INTERVAL.as_millis() as u64);
        if let State::Cancelled = self.state {
            task = task.with_status_message("cancelled by tasks/cancel: the job was killed");
        }
        task
    }

    fn detailed(&self, id: &str) -> DetailedTask {
        let payload = match &self.state {
            State::Working => TaskPayload::Working,
            State::Completed(result) => TaskPayload::Completed {
                result: result.clone(),
            },
            State::Failed(error) => TaskPayload::Failed {
                error: error.clone(),
            },
            State::Cancelled => TaskPayload::Cancelled,
        };
        DetailedTask::new(self.task(id), payload)
    }
}

/// A reserved task: its id, and the token that cancelling it fires.
#[derive(Debug, Clone)]
pub struct Reservation {
    /// The task's id (unguessable).
    pub id: String,
    /// Fired by `tasks/cancel` and when the store closes.
    pub cancel: CancellationToken,
}

/// What became of a reserved call when the server had to answer.
#[derive(Debug)]
pub enum Publication {
    /// The job had already finished: answer with its result (no task was made).
    Finished(CallToolResult),
    /// The job still runs: answer with this task.
    Task(CreateTaskResult),
}

/// The tasks of one MCP endpoint (every session of `airlock serve`'s `/mcp`, or the one
/// stdio client of `airlock mcp`).
#[derive(Debug)]
pub struct TaskStore {
    tasks: Mutex<HashMap<String, Entry>>,
    closed: CancellationToken,
}

impl Default for TaskStore {
    fn default() -> Self {
        Self::new(CancellationToken::new())
    }
}

impl TaskStore {
    /// A store whose running tasks are all cancelled (their jobs killed) when `closed`
    /// fires: the server shutting down, or the stdio client going away.
    pub fn new(closed: CancellationToken) -> Self {
        Self {
            tasks: Mutex::new(HashMap::new()),
            closed,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reserves a task for a call of `tenant`, refused when the tenant already holds
    /// `policy.tasks_per_tenant`. `longest_run` bounds how long its job can take.
    pub fn reserve(
        &self,
        tenant: Option<&str>,
        policy: &McpPolicy,
        longest_run: Duration,
    ) -> Result<Reservation, TaskError> {
        self.reserve_at(tenant, policy, longest_run, Instant::now())
    }

    fn reserve_at(
        &self,
        tenant: Option<&str>,
        policy: &McpPolicy,
        longest_run: Duration,
        now: Instant,
    ) -> Result<Reservation, TaskError> {
        let mut tasks = self.lock();
        tasks.retain(|_, entry| !entry.expired(now));
        let held = tasks
            .values()
            .filter(|entry| entry.tenant.as_deref() == tenant)
            .count();
        if held >= policy.tasks_per_tenant as usize {
            return Err(TaskError::TooMany {
                limit: policy.tasks_per_tenant,
                ttl: policy.task_ttl.as_secs(),
            });
        }
        let id = airlock_core::JobId::generate().to_string();
        let cancel = self.closed.child_token();
        let stamp = rmcp::task_manager::current_timestamp();
        tasks.insert(
            id.clone(),
            Entry {
                tenant: tenant.map(str::to_owned),
                created: now,
                created_at: stamp.clone(),
                last_updated_at: stamp,
                keep: policy.task_ttl,
                longest_run,
                ended: None,
                published: false,
                state: State::Working,
                cancel: cancel.clone(),
            },
        );
        Ok(Reservation { id, cancel })
    }

    /// Records the result of task `id`'s call (unless it was cancelled first).
    pub fn complete(&self, id: &str, result: &CallToolResult) {
        let result = match serde_json::to_value(result) {
            Ok(serde_json::Value::Object(object)) => State::Completed(object),
            Ok(_) | Err(_) => State::Failed(internal_error("the tool result could not be encoded")),
        };
        self.end(id, result, Instant::now());
    }

    /// Records that task `id`'s call failed without a result.
    pub fn fail(&self, id: &str, message: &str) {
        self.end(id, State::Failed(internal_error(message)), Instant::now());
    }

    fn end(&self, id: &str, state: State, now: Instant) {
        let mut tasks = self.lock();
        if let Some(entry) = tasks.get_mut(id)
            && matches!(entry.state, State::Working)
        {
            entry.state = state;
            entry.ended = Some(now);
            entry.touch();
        }
    }

    /// When the call must be answered: its result if the job already finished and
    /// `direct` allows answering it directly (the reservation is dropped), else the task,
    /// which from now on the tenant can see.
    pub fn publish(&self, id: &str, direct: bool) -> Option<Publication> {
        let mut tasks = self.lock();
        let entry = tasks.get_mut(id)?;
        if direct && let State::Completed(result) = &entry.state {
            let result = serde_json::from_value(serde_json::Value::Object(result.clone())).ok();
            if let Some(result) = result {
                tasks.remove(id);
                return Some(Publication::Finished(result));
            }
        }
        entry.published = true;
        Some(Publication::Task(CreateTaskResult::new(entry.task(id))))
    }

    /// Drops the reservation of a call that is answered without a task (its client
    /// gave up while it was being decided); its job is cancelled.
    pub fn withdraw(&self, id: &str) {
        if let Some(entry) = self.lock().remove(id) {
            entry.cancel.cancel();
        }
    }

    /// Task `id` as `tenant` may see it (`tasks/get`).
    pub fn get(&self, tenant: Option<&str>, id: &str) -> Result<DetailedTask, TaskError> {
        self.get_at(tenant, id, Instant::now())
    }

    fn get_at(
        &self,
        tenant: Option<&str>,
        id: &str,
        now: Instant,
    ) -> Result<DetailedTask, TaskError> {
        let mut tasks = self.lock();
        tasks.retain(|_, entry| !entry.expired(now));
        tasks
            .get(id)
            .filter(|entry| entry.published && entry.tenant.as_deref() == tenant)
            .map(|entry| entry.detailed(id))
            .ok_or_else(|| TaskError::NotFound(id.to_owned()))
    }

    /// Cancels task `id` of `tenant` (`tasks/cancel`): a running one becomes `cancelled`
    /// and its job is killed; a finished one stays as it is.
    pub fn cancel(&self, tenant: Option<&str>, id: &str) -> Result<(), TaskError> {
        self.cancel_at(tenant, id, Instant::now())
    }

    fn cancel_at(&self, tenant: Option<&str>, id: &str, now: Instant) -> Result<(), TaskError> {
        let mut tasks = self.lock();
        tasks.retain(|_, entry| !entry.expired(now));
        let entry = tasks
            .get_mut(id)
            .filter(|entry| entry.published && entry.tenant.as_deref() == tenant)
            .ok_or_else(|| TaskError::NotFound(id.to_owned()))?;
        if matches!(entry.state, State::Working) {
            entry.state = State::Cancelled;
            entry.ended = Some(now);
            entry.touch();
            entry.cancel.cancel();
        }
        Ok(())
    }

    /// Whether task `id` of `tenant` exists (`tasks/update`, which airlock's tasks never
    /// need: no task of `run_code` asks the client for input).
    pub fn exists(&self, tenant: Option<&str>, id: &str) -> bool {
        self.get(tenant, id).is_ok()
    }
}

fn internal_error(message: &str) -> JsonObject {
    let mut error = JsonObject::new();
    error.insert("code".to_owned(), serde_json::json!(-32603));
    error.insert("message".to_owned(), serde_json::json!(message));
    error
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::Observation;

    fn policy(max: u32, ttl_s: u64) -> McpPolicy {
        McpPolicy {
            task_after: Duration::ZERO,
            tasks_per_tenant: max,
            task_ttl: Duration::from_secs(ttl_s),
        }
    }

    fn result() -> CallToolResult {
        crate::observation_result(&Observation::error(
            airlock_core::JobId::generate(),
            airlock_core::BackendKind::Docker,
            "v1",
            airlock_core::ErrorKind::Internal,
            "x",
        ))
    }

    fn published(store: &TaskStore, tenant: Option<&str>, policy: &McpPolicy) -> Reservation {
        let reservation = store
            .reserve(tenant, policy, Duration::from_secs(35))
            .unwrap();
        assert!(matches!(
            store.publish(&reservation.id, true),
            Some(Publication::Task(_))
        ));
        reservation
    }

    #[test]
    fn a_task_is_seen_and_cancelled_only_by_its_tenant() {
        let store = TaskStore::default();
        let policy = policy(4, 60);
        let task = published(&store, Some("alice"), &policy);
        let status = |tenant| store.get(tenant, &task.id).map(|t| t.status());
        assert_eq!(status(Some("alice")), Ok(TaskStatus::Working));
        for other in [Some("bob"), None] {
            assert_eq!(status(other), Err(TaskError::NotFound(task.id.clone())));
            assert_eq!(
                store.cancel(other, &task.id),
                Err(TaskError::NotFound(task.id.clone()))
            );
        }
        // Bob's attempt left it running.
        assert!(!task.cancel.is_cancelled());
        assert_eq!(store.cancel(Some("alice"), &task.id), Ok(()));
        assert!(task.cancel.is_cancelled());
        assert_eq!(status(Some("alice")), Ok(TaskStatus::Cancelled));
        // A result that arrives after the cancel does not revive it.
        store.complete(&task.id, &result());
        assert_eq!(status(Some("alice")), Ok(TaskStatus::Cancelled));
    }

    #[test]
    fn an_unpublished_reservation_is_invisible_and_a_finished_call_needs_no_task() {
        let store = TaskStore::default();
        let policy = policy(4, 60);
        let reservation = store
            .reserve(None, &policy, Duration::from_secs(35))
            .unwrap();
        assert!(store.get(None, &reservation.id).is_err());
        let expected = result();
        store.complete(&reservation.id, &expected);
        match store.publish(&reservation.id, true) {
            Some(Publication::Finished(answer)) => assert_eq!(
                serde_json::to_value(answer).unwrap(),
                serde_json::to_value(&expected).unwrap()
            ),
            other => panic!("{other:?}"),
        }
        // The reservation is gone: the bound counts it no more.
        assert!(store.lock().is_empty());
    }

    #[test]
    fn a_completed_task_carries_the_call_result() {
        let store = TaskStore::default();
        let task = published(&store, None, &policy(4, 60));
        let answer = result();
        store.complete(&task.id, &answer);
        let detailed = store.get(None, &task.id).unwrap();
        assert_eq!(detailed.status(), TaskStatus::Completed);
        let TaskPayload::Completed { result } = detailed.payload else {
            panic!("{detailed:?}")
        };
        assert_eq!(
            serde_json::Value::Object(result),
            serde_json::to_value(&answer).unwrap()
        );
        // Cancelling a finished task changes nothing.
        assert_eq!(store.cancel(None, &task.id), Ok(()));
        assert_eq!(
            store.get(None, &task.id).unwrap().status(),
            TaskStatus::Completed
        );
    }

    #[test]
    fn the_bound_is_per_tenant_and_counts_running_and_kept_tasks() {
        let store = TaskStore::default();
        let policy = policy(2, 60);
        let first = published(&store, Some("alice"), &policy);
        published(&store, Some("alice"), &policy);
        let refused = store.reserve(Some("alice"), &policy, Duration::from_secs(35));
        assert_eq!(
            refused.unwrap_err(),
            TaskError::TooMany { limit: 2, ttl: 60 }
        );
        // Another tenant is not affected.
        published(&store, Some("bob"), &policy);
        // A finished task still counts until it expires.
        store.complete(&first.id, &result());
        assert!(
            store
                .reserve(Some("alice"), &policy, Duration::from_secs(35))
                .is_err()
        );
    }

    #[test]
    fn a_finished_task_is_kept_for_its_ttl_then_forgotten_and_frees_its_place() {
        let store = TaskStore::default();
        let policy = policy(1, 60);
        let task = published(&store, None, &policy);
        // A running task never expires, however old.
        let later = Instant::now() + Duration::from_secs(3600);
        assert!(store.get_at(None, &task.id, later).is_ok());
        let ended = Instant::now();
        store.end(&task.id, State::Cancelled, ended);
        let ttl = store.get(None, &task.id).unwrap().task.ttl_ms.unwrap();
        assert!((60_000..61_000).contains(&ttl), "{ttl}");
        let just_before = ended + Duration::from_secs(59);
        assert!(store.get_at(None, &task.id, just_before).is_ok());
        assert!(
            store
                .reserve_at(None, &policy, Duration::from_secs(35), just_before)
                .is_err()
        );
        let after = ended + Duration::from_secs(60);
        assert_eq!(
            store.get_at(None, &task.id, after),
            Err(TaskError::NotFound(task.id.clone()))
        );
        assert!(
            store
                .reserve_at(None, &policy, Duration::from_secs(35), after)
                .is_ok()
        );
    }

    #[test]
    fn closing_the_store_cancels_every_running_task() {
        let closed = CancellationToken::new();
        let store = TaskStore::new(closed.clone());
        let policy = policy(4, 60);
        let a = published(&store, Some("a"), &policy);
        let b = published(&store, Some("b"), &policy);
        closed.cancel();
        assert!(a.cancel.is_cancelled() && b.cancel.is_cancelled());
    }

    #[test]
    fn the_wire_shapes_are_the_extensions() {
        let store = TaskStore::default();
        let reservation = store
            .reserve(None, &policy(4, 60), Duration::from_secs(35))
            .unwrap();
        let Some(Publication::Task(created)) = store.publish(&reservation.id, true) else {
            panic!("no task")
        };
        let value = serde_json::to_value(&created).unwrap();
        assert_eq!(value["resultType"], "task");
        assert_eq!(value["status"], "working");
        assert_eq!(value["taskId"], reservation.id.as_str());
        assert_eq!(value["pollIntervalMs"], 500);
        assert_eq!(value["ttlMs"], 95_000);
    }
}
