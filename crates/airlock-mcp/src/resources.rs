//! The `/out` files of MCP jobs, kept for a while so a client can read them back with
//! `resources/read` instead of receiving their bytes in the tool result (which goes into
//! the model's context). Bounded per tenant in time and bytes; a tenant reads only its
//! own jobs' files: another tenant's URI reads as unknown, so it learns nothing of it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use airlock_core::JobId;
use airlock_core::observation::{OutputFile, ReleasedFile};

/// How long a job's files stay readable.
pub const OUT_RESOURCE_TTL: Duration = Duration::from_secs(15 * 60);

/// Most bytes of files kept per tenant; the oldest go first when a new job's files need
/// the room.
pub const OUT_RESOURCE_TENANT_BYTES: u64 = 64 * 1024 * 1024;

/// The URI scheme of the files.
pub const URI_PREFIX: &str = "airlock://jobs/";

/// The template `resources/templates/list` announces.
pub const URI_TEMPLATE: &str = "airlock://jobs/{job_id}/out/{path}";

/// One file kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutResource {
    /// Its URI, `airlock://jobs/{job_id}/out/{path}` (the path percent-encoded).
    pub uri: String,
    /// Its media type as the engine detected it.
    pub media_type: String,
    /// Its content (redacted when text, as released).
    pub content: Vec<u8>,
    kept_until: Instant,
}

/// The kept files of every tenant.
#[derive(Debug, Default)]
pub struct OutResources {
    tenants: Mutex<HashMap<String, VecDeque<OutResource>>>,
}

/// The URI of `path` (relative to `/out`) of job `job`.
pub fn uri_for(job: &JobId, path: &str) -> String {
    let mut uri = format!("{URI_PREFIX}{job}/out/");
    for byte in path.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                uri.push(char::from(byte));
            }
            other => uri.push_str(&format!("%{other:02X}")),
        }
    }
    uri
}

fn tenant_key(tenant: Option<&str>) -> String {
    tenant.unwrap_or_default().to_owned()
}

impl OutResources {
    /// Keeps the released files of `job` for `tenant`, in `listed`'s order; returns the
    /// URIs, one per listed file (`None` for a file not kept: larger than the tenant's
    /// whole allowance, or not released).
    pub fn keep(
        &self,
        tenant: Option<&str>,
        job: &JobId,
        listed: &[OutputFile],
        released: &[ReleasedFile],
    ) -> Vec<Option<String>> {
        self.keep_at(tenant, job, listed, released, Instant::now())
    }

    fn keep_at(
        &self,
        tenant: Option<&str>,
        job: &JobId,
        listed: &[OutputFile],
        released: &[ReleasedFile],
        now: Instant,
    ) -> Vec<Option<String>> {
        let Ok(mut tenants) = self.tenants.lock() else {
            return vec![None; listed.len()];
        };
        let kept = tenants.entry(tenant_key(tenant)).or_default();
        kept.retain(|r| r.kept_until > now);
        let mut uris = Vec::with_capacity(listed.len());
        for file in listed {
            let Some(content) = released.iter().find(|r| r.path == file.path) else {
                uris.push(None);
                continue;
            };
            let size = content.content.len() as u64;
            if size > OUT_RESOURCE_TENANT_BYTES {
                uris.push(None);
                continue;
            }
            let mut used: u64 = kept.iter().map(|r| r.content.len() as u64).sum();
            while used + size > OUT_RESOURCE_TENANT_BYTES {
                match kept.pop_front() {
                    Some(oldest) => used -= oldest.content.len() as u64,
                    None => break,
                }
            }
            let uri = uri_for(job, &file.path);
            kept.push_back(OutResource {
                uri: uri.clone(),
                media_type: file.media_type.clone(),
                content: content.content.clone(),
                kept_until: now + OUT_RESOURCE_TTL,
            });
            uris.push(Some(uri));
        }
        uris
    }

    /// The file at `uri`, if `tenant` ran its job and it is still kept.
    pub fn read(&self, tenant: Option<&str>, uri: &str) -> Option<OutResource> {
        self.read_at(tenant, uri, Instant::now())
    }

    fn read_at(&self, tenant: Option<&str>, uri: &str, now: Instant) -> Option<OutResource> {
        let mut tenants = self.tenants.lock().ok()?;
        let kept = tenants.get_mut(&tenant_key(tenant))?;
        kept.retain(|r| r.kept_until > now);
        kept.iter().find(|r| r.uri == uri).cloned()
    }

    /// The files `tenant` can read now, oldest first.
    pub fn list(&self, tenant: Option<&str>) -> Vec<OutResource> {
        let now = Instant::now();
        let Ok(mut tenants) = self.tenants.lock() else {
            return Vec::new();
        };
        let Some(kept) = tenants.get_mut(&tenant_key(tenant)) else {
            return Vec::new();
        };
        kept.retain(|r| r.kept_until > now);
        kept.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: usize) -> (OutputFile, ReleasedFile) {
        (
            OutputFile {
                path: path.to_owned(),
                bytes: size as u64,
                sha256: "0".repeat(64),
                media_type: "text/plain".to_owned(),
                redactions: 0,
                content_base64: None,
            },
            ReleasedFile {
                path: path.to_owned(),
                content: vec![b'x'; size],
            },
        )
    }

    fn keep(
        store: &OutResources,
        tenant: &str,
        files: &[(OutputFile, ReleasedFile)],
        now: Instant,
    ) -> Vec<Option<String>> {
        let listed: Vec<_> = files.iter().map(|f| f.0.clone()).collect();
        let released: Vec<_> = files.iter().map(|f| f.1.clone()).collect();
        store.keep_at(Some(tenant), &JobId::generate(), &listed, &released, now)
    }

    #[test]
    fn only_the_tenant_that_ran_the_job_reads_its_files() {
        let store = OutResources::default();
        let now = Instant::now();
        let uris = keep(&store, "a", &[file("r 1.txt", 3)], now);
        let uri = uris[0].clone().unwrap();
        assert!(
            uri.starts_with(URI_PREFIX) && uri.ends_with("/out/r%201.txt"),
            "{uri}"
        );
        assert_eq!(store.read_at(Some("a"), &uri, now).unwrap().content, b"xxx");
        assert!(store.read_at(Some("b"), &uri, now).is_none());
        assert!(store.read_at(None, &uri, now).is_none());
    }

    #[test]
    fn files_expire_and_the_oldest_make_room() {
        let store = OutResources::default();
        let now = Instant::now();
        let half = (OUT_RESOURCE_TENANT_BYTES / 2) as usize;
        let first = keep(&store, "a", &[file("1", half)], now)[0]
            .clone()
            .unwrap();
        let second = keep(&store, "a", &[file("2", half)], now)[0]
            .clone()
            .unwrap();
        assert!(store.read_at(Some("a"), &first, now).is_some());
        let third = keep(&store, "a", &[file("3", 1)], now)[0].clone().unwrap();
        assert!(
            store.read_at(Some("a"), &first, now).is_none(),
            "the oldest was not evicted"
        );
        assert!(store.read_at(Some("a"), &second, now).is_some());
        assert!(store.read_at(Some("a"), &third, now).is_some());
        let later = now + OUT_RESOURCE_TTL + Duration::from_secs(1);
        assert!(store.read_at(Some("a"), &third, later).is_none());
        let huge = (OUT_RESOURCE_TENANT_BYTES + 1) as usize;
        assert_eq!(keep(&store, "a", &[file("4", huge)], now), vec![None]);
    }
}
