//! `[admission]`: how much of `airlock serve`'s job slots and queue one tenant may hold, so
//! a tenant flooding the server cannot starve the others (issue 34). The server's own sizes
//! (`--max-in-flight`, `--queue`) bound everyone together; these bound each tenant of a
//! tokens file, under the policy its jobs run with.

use serde::{Deserialize, Serialize};

/// Per-tenant shares of the server's admission control.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionPolicy {
    /// Jobs of one tenant running at once (a tokens file's `max_in_flight` may lower it).
    /// Free slots go first to the waiting tenant with the fewest jobs running, so the
    /// default lets a lone tenant use every slot without starving a second one.
    pub max_in_flight_per_tenant: u32,
    /// Jobs of one tenant waiting for a slot; more are refused with 429 naming this key.
    /// Below the server's queue (16 per slot by default), so a second tenant always finds
    /// room in it.
    pub max_queued_per_tenant: u32,
}

impl Default for AdmissionPolicy {
    fn default() -> Self {
        Self {
            max_in_flight_per_tenant: 1024,
            max_queued_per_tenant: 16,
        }
    }
}

impl AdmissionPolicy {
    /// The largest value either key accepts.
    pub const PER_TENANT_MAX: u32 = 65_536;

    /// Checks both bounds; returns the field name and reason.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        let range = |field: &'static str, value: u32, min: u32| {
            if value < min || value > Self::PER_TENANT_MAX {
                Err((field, format!("must be {min}-{}", Self::PER_TENANT_MAX)))
            } else {
                Ok(())
            }
        };
        range("max_in_flight_per_tenant", self.max_in_flight_per_tenant, 1)?;
        // 0 is allowed: the tenant's jobs are refused rather than queued when its slots
        // are busy.
        range("max_queued_per_tenant", self.max_queued_per_tenant, 0)
    }
}

#[cfg(test)]
mod tests {
    use crate::policy::Policy;

    #[test]
    fn admission_section_parses_and_rejects_zero_slots() {
        let p = Policy::from_toml(
            "version = \"t\"\n[admission]\nmax_in_flight_per_tenant = 2\nmax_queued_per_tenant = 0\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.admission.max_in_flight_per_tenant, 2);
        assert_eq!(p.admission.max_queued_per_tenant, 0);
        let err = Policy::from_toml(
            "version = \"t\"\n[admission]\nmax_in_flight_per_tenant = 0\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("admission.max_in_flight_per_tenant"), "{err}");
        let defaults = Policy::builtin().admission;
        assert_eq!(
            (
                defaults.max_in_flight_per_tenant,
                defaults.max_queued_per_tenant
            ),
            (1024, 16)
        );
    }
}
