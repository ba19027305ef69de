//! E2B paths to the session's `/work`: E2B's home (`/home/user`), `/work`, and relative
//! paths land in the workspace; anything else is refused. The path checks themselves
//! (`..`, links a job made) are `airlock_host::workspace`'s and the session manager's.

use http::StatusCode;

use crate::wire::ApiError;

/// E2B's home directory, where the SDKs put relative paths and where `/work` is shown.
pub const E2B_HOME: &str = "/home/user";
/// The workspace inside airlock's sandboxes.
pub const WORK: &str = "/work";

/// The workspace-relative path of an E2B path (`""` is the workspace itself).
pub fn to_workspace(path: &str) -> Result<String, ApiError> {
    let refused = |why: &str| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "path {path:?}: {why}; airlock confines files to the sandbox's workspace ({E2B_HOME}, also {WORK}, and paths relative to it)"
            ),
        )
    };
    let trimmed = path.trim_end_matches('/');
    let rel = if trimmed.is_empty() && path.starts_with('/') {
        return Err(refused("outside the workspace"));
    } else if let Some(rest) = strip_dir(trimmed, E2B_HOME).or_else(|| strip_dir(trimmed, WORK)) {
        rest
    } else if trimmed.starts_with('/') {
        return Err(refused("outside the workspace"));
    } else if trimmed.starts_with('~') {
        trimmed.trim_start_matches('~').trim_start_matches('/')
    } else {
        trimmed
    };
    let segments: Vec<&str> = rel
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    if segments.contains(&"..") {
        return Err(refused("\"..\" is not allowed"));
    }
    let rel = segments.join("/");
    if !rel.is_empty() {
        airlock_engine::sessions::check_user_path(&rel)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("path {path:?}: {e}")))?;
    }
    Ok(rel)
}

fn strip_dir<'a>(path: &'a str, dir: &str) -> Option<&'a str> {
    if path == dir {
        return Some("");
    }
    path.strip_prefix(dir)?.strip_prefix('/')
}

/// The E2B path of a workspace-relative path.
pub fn to_e2b(rel: &str) -> String {
    if rel.is_empty() {
        E2B_HOME.to_owned()
    } else {
        format!("{E2B_HOME}/{rel}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_work_and_relative_paths_land_in_the_workspace() {
        for (e2b, rel) in [
            ("/home/user", ""),
            ("/home/user/", ""),
            ("/home/user/a/b.txt", "a/b.txt"),
            ("/work/a", "a"),
            ("a/./b", "a/b"),
            ("~/x", "x"),
            ("", ""),
        ] {
            assert_eq!(to_workspace(e2b).unwrap(), rel, "{e2b}");
        }
        assert_eq!(to_e2b("a/b"), "/home/user/a/b");
        assert_eq!(to_e2b(""), "/home/user");
    }

    #[test]
    fn outside_paths_and_dot_dot_are_refused() {
        for bad in [
            "/etc/passwd",
            "/",
            "/home/user/../../etc/passwd",
            "../x",
            "a/../../b",
            "/home/username",
            "/workspace",
            ".airlock/call-1.py",
        ] {
            let err = to_workspace(bad).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
