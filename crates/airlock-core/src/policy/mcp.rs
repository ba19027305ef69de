//! `[mcp]`: how the MCP tool server turns long `run_code` calls into tasks (the
//! `io.modelcontextprotocol/tasks` extension). A task belongs to the tenant that created
//! it; each tenant keeps a bounded number, each for a bounded time after it ends.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::units::duration_serde;

/// The MCP section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct McpPolicy {
    /// A `run_code` call from a client that declares the tasks extension answers with a
    /// task when its job has not finished within this long (`"0s"`: always a task).
    #[serde(with = "duration_serde")]
    pub task_after: Duration,
    /// Most tasks one tenant may hold, running or finished and not yet expired; a call
    /// that would make one more is refused.
    pub tasks_per_tenant: u32,
    /// How long a finished task (its result, or its cancelled or failed status) is kept
    /// after it ends; then `tasks/get` answers it as unknown.
    #[serde(with = "duration_serde")]
    pub task_ttl: Duration,
}

impl Default for McpPolicy {
    fn default() -> Self {
        Self {
            task_after: Duration::from_secs(2),
            tasks_per_tenant: 16,
            task_ttl: Duration::from_secs(600),
        }
    }
}

impl McpPolicy {
    /// Longest `task_after`.
    pub const TASK_AFTER_MAX: Duration = Duration::from_secs(3600);
    /// Most tasks a policy may let one tenant hold.
    pub const TASKS_PER_TENANT_MAX: u32 = 1024;
    /// Shortest time a finished task is kept.
    pub const TASK_TTL_MIN: Duration = Duration::from_secs(1);
    /// Longest time a finished task is kept.
    pub const TASK_TTL_MAX: Duration = Duration::from_secs(24 * 3600);

    /// Checks the bounds; returns the field name and reason.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if self.task_after > Self::TASK_AFTER_MAX {
            return Err((
                "task_after",
                format!("must be at most {}s", Self::TASK_AFTER_MAX.as_secs()),
            ));
        }
        if self.tasks_per_tenant == 0 || self.tasks_per_tenant > Self::TASKS_PER_TENANT_MAX {
            return Err((
                "tasks_per_tenant",
                format!("must be between 1 and {}", Self::TASKS_PER_TENANT_MAX),
            ));
        }
        if !(Self::TASK_TTL_MIN..=Self::TASK_TTL_MAX).contains(&self.task_ttl) {
            return Err((
                "task_ttl",
                format!(
                    "must be between {}s and {}s",
                    Self::TASK_TTL_MIN.as_secs(),
                    Self::TASK_TTL_MAX.as_secs()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_within_bounds_and_each_bound_refuses() {
        assert_eq!(McpPolicy::default().check(), Ok(()));
        let refused = |policy: McpPolicy| policy.check().map_err(|(field, _)| field);
        assert_eq!(
            refused(McpPolicy {
                tasks_per_tenant: 0,
                ..McpPolicy::default()
            }),
            Err("tasks_per_tenant")
        );
        assert_eq!(
            refused(McpPolicy {
                task_ttl: Duration::ZERO,
                ..McpPolicy::default()
            }),
            Err("task_ttl")
        );
        assert_eq!(
            refused(McpPolicy {
                task_after: Duration::from_secs(7200),
                ..McpPolicy::default()
            }),
            Err("task_after")
        );
        assert_eq!(
            refused(McpPolicy {
                task_after: Duration::ZERO,
                ..McpPolicy::default()
            }),
            Ok(())
        );
    }
}
