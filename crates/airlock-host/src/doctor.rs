//! One line of a backend's `airlock doctor` report: a control and how it stands here.

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
