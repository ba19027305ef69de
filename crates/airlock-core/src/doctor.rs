//! `airlock doctor`'s report, one type for every backend: each control and how it stands
//! on this host, and whether jobs can run. Backends produce [`Check`]s; the engine gathers
//! them (and the end-to-end job) into a [`DoctorReport`].

use serde::Serialize;

/// How a control stands on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Enforced.
    Ok,
    /// Works, with a caveat worth knowing.
    Warning,
    /// Cannot be enforced: jobs that need it are refused.
    Missing,
}

/// One control.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// The control, e.g. `user namespaces`.
    pub control: String,
    /// Its status.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// How to fix it, when it is not ok.
    pub fix: Option<String>,
}

impl Check {
    /// An enforced control.
    pub fn ok(control: &str, detail: impl Into<String>) -> Self {
        Self {
            control: control.to_owned(),
            status: Status::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    /// A control that cannot be enforced, and how to fix that.
    pub fn missing(control: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            control: control.to_owned(),
            status: Status::Missing,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// A control that works with a caveat, and what to do about it.
    pub fn warning(control: &str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self {
            control: control.to_owned(),
            status: Status::Warning,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// What `airlock doctor` found for one backend.
#[derive(Debug, Clone, Serialize)]
pub struct DoctorReport {
    /// The backend checked (`native`, `docker`, ...).
    pub backend: &'static str,
    /// Whether every required control is available: false once any check is
    /// [`Status::Missing`].
    pub ready: bool,
    /// Each control, in the order checked.
    pub checks: Vec<Check>,
}

impl DoctorReport {
    /// An empty report for `backend`, ready until a missing control is pushed.
    pub fn new(backend: &'static str) -> Self {
        Self {
            backend,
            ready: true,
            checks: Vec::new(),
        }
    }

    /// Adds a check and updates `ready`.
    pub fn push(&mut self, check: Check) {
        if check.status == Status::Missing {
            self.ready = false;
        }
        self.checks.push(check);
    }
}

impl Extend<Check> for DoctorReport {
    fn extend<I: IntoIterator<Item = Check>>(&mut self, checks: I) {
        for check in checks {
            self.push(check);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_control_makes_the_report_not_ready_and_a_warning_does_not() {
        let mut report = DoctorReport::new("native");
        report.push(Check::ok("a", "fine"));
        report.push(Check::warning("b", "caveat", "do this"));
        assert!(report.ready);
        report.extend([Check::missing("c", "absent", "install it")]);
        assert!(!report.ready);
        assert_eq!(report.checks.len(), 3);
    }
}
