//! The observation (DESIGN §2): the bounded JSON result of one job. Field names are a
//! public contract.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::capture::CapturedOutput;
use crate::error::ErrorKind;
use crate::job::JobId;

/// How a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The program exited by itself.
    Exited,
    /// The wall-time limit killed it.
    Timeout,
    /// The memory limit killed it.
    Oom,
    /// A signal killed it.
    Killed,
    /// It produced more output than the flood limit and was killed.
    OutputLimit,
    /// The sandbox could not run it.
    Error,
}

impl Outcome {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Exited => "exited",
            Outcome::Timeout => "timeout",
            Outcome::Oom => "oom",
            Outcome::Killed => "killed",
            Outcome::OutputLimit => "output_limit",
            Outcome::Error => "error",
        }
    }
}

/// An executor-side failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorInfo {
    /// Its class.
    pub kind: ErrorKind,
    /// What went wrong, for a human.
    pub message: String,
}

/// A file released from `/out`, as listed in the observation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct OutputFile {
    /// Path relative to `/out`.
    pub path: String,
    /// Size of the released content.
    pub bytes: u64,
    /// SHA-256 of the released content, lowercase hex.
    pub sha256: String,
    /// Media type sniffed from the content.
    pub media_type: String,
    /// Secret-shaped strings replaced in it (text files only).
    pub redactions: u64,
    /// The released content as base64, when the caller asked for files inline
    /// (`return_files`) and the file fit in the policy's inline cap; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
}

/// A file of `/out` that was not released, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RejectedFile {
    /// Path relative to `/out`.
    pub path: String,
    /// Why, e.g. `symlink`, `fifo`, `larger than the 8MiB per-file cap`.
    pub reason: String,
}

/// A file released from `/out`, with its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleasedFile {
    /// Path relative to `/out`.
    pub path: String,
    /// The content (redacted when it is text).
    pub content: Vec<u8>,
}

/// The observation and the released files' contents, which never go into the JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct JobResult {
    /// The observation.
    pub observation: Observation,
    /// The released files, in the order of `observation.files`.
    pub files: Vec<ReleasedFile>,
    /// The egress proxy's records, one per request or tunnel, for the audit log.
    pub connections: Vec<serde_json::Value>,
}

impl JobResult {
    /// Puts the released files' content into the observation as `content_base64`, in
    /// order, while their total stays within `cap_bytes` (the decoded size); a file that
    /// does not fit is left listed without content, and later smaller ones may still fit.
    /// Returns how many files were inlined.
    pub fn inline_files(&mut self, cap_bytes: u64) -> usize {
        use base64::Engine as _;
        let mut budget = cap_bytes;
        let mut inlined = 0;
        for (listed, released) in self.observation.files.iter_mut().zip(&self.files) {
            let size = released.content.len() as u64;
            if listed.path != released.path || size > budget {
                continue;
            }
            budget -= size;
            listed.content_base64 =
                Some(base64::engine::general_purpose::STANDARD.encode(&released.content));
            inlined += 1;
        }
        inlined
    }
}

/// The result of one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Observation {
    /// The job's id.
    pub job_id: JobId,
    /// True only for `exited` with exit code 0.
    pub ok: bool,
    /// How the job ended.
    pub outcome: Outcome,
    /// The program's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed the program (`"SIGKILL"`), when one did.
    pub signal: Option<String>,
    /// The kept stdout, escaped.
    pub stdout: String,
    /// The kept stderr, escaped.
    pub stderr: String,
    /// Every byte written to stdout.
    pub stdout_bytes: u64,
    /// Every byte written to stderr.
    pub stderr_bytes: u64,
    /// Whether stdout was cut.
    pub stdout_truncated: bool,
    /// Whether stderr was cut.
    pub stderr_truncated: bool,
    /// Secret-shaped strings replaced.
    pub redactions: u64,
    /// Wall time of the program.
    pub duration_ms: u64,
    /// CPU time of every process of the job.
    pub cpu_ms: Option<u64>,
    /// Peak memory of the job.
    pub peak_memory_bytes: Option<u64>,
    /// Files released from `/out`.
    pub files: Vec<OutputFile>,
    /// The backend that ran the job.
    pub backend: BackendKind,
    /// The image, when the rootfs is an image.
    pub image_digest: Option<String>,
    /// The policy's version.
    pub policy_version: String,
    /// Set only when `outcome` is `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// What went through the egress proxy (proxy mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkCounts>,
    /// Files of `/out` that were not released. Absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejected_files: Vec<RejectedFile>,
    /// Controls that held only in a weaker form the policy accepted (e.g. `memory:
    /// RLIMIT_AS`). Absent when the full shape held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub degraded: Vec<String>,
}

impl Observation {
    /// The observation of a job that could not run.
    pub fn error(
        job_id: JobId,
        backend: BackendKind,
        policy_version: &str,
        kind: ErrorKind,
        message: impl Into<String>,
    ) -> Self {
        Self {
            job_id,
            ok: false,
            outcome: Outcome::Error,
            exit_code: None,
            signal: None,
            stdout: String::new(),
            stderr: String::new(),
            stdout_bytes: 0,
            stderr_bytes: 0,
            stdout_truncated: false,
            stderr_truncated: false,
            redactions: 0,
            duration_ms: 0,
            cpu_ms: None,
            peak_memory_bytes: None,
            files: Vec::new(),
            backend,
            image_digest: None,
            policy_version: policy_version.to_owned(),
            error: Some(ErrorInfo {
                kind,
                message: message.into(),
            }),
            rejected_files: Vec::new(),
            degraded: Vec::new(),
            network: None,
        }
    }

    /// The exit code `airlock run` uses for this observation (DESIGN §3).
    pub fn cli_exit_code(&self) -> i32 {
        match self.outcome {
            Outcome::Exited => self.exit_code.unwrap_or(0),
            Outcome::Timeout => 124,
            Outcome::Oom | Outcome::OutputLimit => 137,
            Outcome::Killed => self
                .signal
                .as_deref()
                .and_then(signal_number)
                .map_or(137, |n| 128 + n),
            Outcome::Error => 125,
        }
    }
}

/// How the program's process ended, as the backend saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Termination {
    /// It exited with this code.
    Exited(i32),
    /// This signal killed it.
    Signaled(i32),
    /// Unknown: the sandbox was torn down before a status could be read.
    Unknown,
}

/// How a job got its sandbox: the pool's decision, reported on the job's `sandbox
/// acquire` span (`airlock.acquire`, docs/telemetry.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Acquire {
    /// Built for the job from scratch: no pool, a job the pool's template does not fit,
    /// or none ready and none could be started for it.
    #[default]
    Fresh,
    /// A sandbox of the warm pool that was waiting ready.
    Warm,
    /// None was ready; the backend started one for the job at once, for less than a fresh
    /// one costs (a fork of the native backend's zygote).
    Fork,
}

impl Acquire {
    /// The name telemetry gives it: `fresh`, `warm`, `fork`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::Warm => "warm",
            Self::Fork => "fork",
        }
    }
}

/// A limit the supervisor saw being hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LimitHit {
    /// Wall time ran out; the supervisor killed the job.
    Timeout,
    /// Output exceeded the flood limit; the supervisor killed the job.
    OutputFlood,
}

/// What a backend reports about a job that ran. The engine turns it into an [`Observation`].
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// How the program ended.
    pub termination: Termination,
    /// A limit the supervisor enforced, if any.
    pub limit_hit: Option<LimitHit>,
    /// OOM kills counted by the memory controller.
    pub oom_kills: u64,
    /// Kept stdout.
    pub stdout: CapturedOutput,
    /// Kept stderr.
    pub stderr: CapturedOutput,
    /// Wall time from program start to its end.
    pub duration: Duration,
    /// Time spent building the sandbox before the program started.
    pub setup: Duration,
    /// CPU time of every process of the job.
    pub cpu_time: Option<Duration>,
    /// Peak memory.
    pub peak_memory_bytes: Option<u64>,
    /// The image, when the rootfs is an image.
    pub image_digest: Option<String>,
    /// Controls that held only in a weaker form.
    pub degraded: Vec<String>,
    /// Files of `/out` within the caps, unredacted, in path order.
    pub out_files: Vec<ReleasedFile>,
    /// Files of `/out` that were not released.
    pub out_rejected: Vec<RejectedFile>,
    /// The egress proxy's account (proxy mode only).
    pub network: Option<NetworkReport>,
    /// How the job got its sandbox; the warm pool sets it, a backend reports `Fresh`.
    pub acquire: Acquire,
}

/// What the egress proxy saw during one job.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NetworkReport {
    /// Totals for the observation.
    pub counts: NetworkCounts,
    /// One record per request or tunnel, allowed or denied, for the audit log.
    pub connections: Vec<serde_json::Value>,
}

/// Totals of the egress proxy's work for one job.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
pub struct NetworkCounts {
    /// Requests and tunnels, allowed or denied.
    pub connections: u64,
    /// How many of them were refused.
    pub denied: u64,
    /// Bytes sent upstream.
    pub bytes_up: u64,
    /// Bytes received from upstreams.
    pub bytes_down: u64,
    /// A proxy limit that was hit (`connections`, `bytes`, ...), if one was.
    pub limit_hit: Option<String>,
    /// Placeholders of secrets the proxy replaced by their real values in the job's
    /// requests (the count only, never a value; per request in the connection records).
    #[serde(default)]
    pub secrets_substituted: u64,
    /// Real values of secrets (or their encodings) the proxy replaced by placeholders in
    /// answers to the job.
    #[serde(default)]
    pub secrets_scrubbed: u64,
}

impl RunReport {
    /// The report of a job that ended as `termination` after `duration`, with nothing
    /// captured, measured or released: what a backend that reads those elsewhere (a
    /// session's kernel call, the test backends) starts from.
    pub fn ended(termination: Termination, duration: Duration) -> Self {
        Self {
            termination,
            limit_hit: None,
            oom_kills: 0,
            stdout: CapturedOutput::default(),
            stderr: CapturedOutput::default(),
            duration,
            setup: Duration::ZERO,
            cpu_time: None,
            peak_memory_bytes: None,
            image_digest: None,
            degraded: Vec::new(),
            out_files: Vec::new(),
            out_rejected: Vec::new(),
            network: None,
            acquire: Acquire::Fresh,
        }
    }

    /// The outcome, by precedence: a limit the supervisor enforced, then an OOM kill,
    /// then a signal, then a normal exit.
    pub fn outcome(&self) -> Outcome {
        match (self.limit_hit, self.oom_kills, self.termination) {
            (Some(LimitHit::Timeout), _, _) => Outcome::Timeout,
            (Some(LimitHit::OutputFlood), _, _) => Outcome::OutputLimit,
            (None, kills, _) if kills > 0 => Outcome::Oom,
            (None, _, Termination::Signaled(_)) => Outcome::Killed,
            (None, _, Termination::Unknown) => Outcome::Killed,
            (None, _, Termination::Exited(_)) => Outcome::Exited,
        }
    }

    /// Builds the observation and the released files. `redact(before, text, after)` is
    /// applied to the kept text of each stream, read between the other stream's text on
    /// both sides (a key split across stdout and stderr is whole to whoever reads both),
    /// and to each released text file with no context; it returns the text and the number
    /// of replacements.
    pub fn into_result(
        self,
        job_id: JobId,
        backend: BackendKind,
        policy_version: &str,
        redact: &dyn Fn(&str, String, &str) -> (String, u64),
    ) -> JobResult {
        let outcome = self.outcome();
        let (exit_code, signal) = match self.termination {
            Termination::Exited(code) => (Some(code), None),
            Termination::Signaled(sig) => (None, Some(signal_name(sig))),
            Termination::Unknown => (None, None),
        };
        // Each stream once rendered; the other is context only where a split secret can
        // reach: its tail before this stream's text, its head after.
        let (stdout_text, stderr_text) = (self.stdout.rendered(), self.stderr.rendered());
        let owned = |(tail, head): (&str, &str)| (tail.to_owned(), head.to_owned());
        let (stdout_tail, stdout_head) = owned(crate::capture::context_window(&stdout_text));
        let (stderr_tail, stderr_head) = owned(crate::capture::context_window(&stderr_text));
        let stdout = self.stdout.render_redacted_from(stdout_text, &|text| {
            redact(&stderr_tail, text, &stderr_head)
        });
        let stderr = self.stderr.render_redacted_from(stderr_text, &|text| {
            redact(&stdout_tail, text, &stdout_head)
        });
        let mut listed = Vec::with_capacity(self.out_files.len());
        let mut released = Vec::with_capacity(self.out_files.len());
        let mut rejected = Vec::with_capacity(self.out_rejected.len());
        // Secrets found in names and in files that are withheld rather than rewritten.
        let mut withheld_redactions = 0;
        for file in self.out_rejected {
            let (path, count) = shown_name(&file.path, redact);
            withheld_redactions += count;
            rejected.push(RejectedFile {
                path,
                reason: file.reason,
            });
        }
        for file in self.out_files {
            let (shown, name_redactions) = shown_name(&file.path, redact);
            if shown != file.path {
                // A name is written on the caller's disk as it is: never one that drives a
                // terminal, breaks a line or carries a secret.
                withheld_redactions += name_redactions;
                let reason = if name_redactions > 0 {
                    "its name looks like a secret"
                } else {
                    "its name has control characters or invalid UTF-8"
                };
                rejected.push(RejectedFile {
                    path: shown,
                    reason: reason.to_owned(),
                });
                continue;
            }
            let media_type = crate::media::sniff_media_type(&file.path, &file.content);
            let (content, redactions) = match scan_file(file.content, redact) {
                Scanned::Released {
                    content,
                    redactions,
                } => (content, redactions),
                Scanned::Withheld { secrets } => {
                    withheld_redactions += secrets;
                    rejected.push(RejectedFile {
                        path: file.path,
                        reason: format!(
                            "binary ({media_type}) with {secrets} secret-shaped string(s) in it; \
                             binary files are not rewritten"
                        ),
                    });
                    continue;
                }
            };
            listed.push(OutputFile {
                path: file.path.clone(),
                bytes: content.len() as u64,
                sha256: crate::job::sha256_digest(&content)
                    .trim_start_matches("sha256:")
                    .to_owned(),
                media_type: media_type.to_owned(),
                redactions,
                content_base64: None,
            });
            released.push(ReleasedFile {
                path: file.path,
                content,
            });
        }
        let file_redactions: u64 =
            listed.iter().map(|f| f.redactions).sum::<u64>() + withheld_redactions;
        let observation = Observation {
            job_id,
            ok: outcome == Outcome::Exited && exit_code == Some(0),
            outcome,
            exit_code,
            signal,
            stdout: stdout.text,
            stderr: stderr.text,
            stdout_bytes: self.stdout.total_bytes,
            stderr_bytes: self.stderr.total_bytes,
            stdout_truncated: stdout.truncated,
            stderr_truncated: stderr.truncated,
            redactions: stdout.redactions + stderr.redactions + file_redactions,
            duration_ms: duration_ms(self.duration),
            cpu_ms: self.cpu_time.map(duration_ms),
            peak_memory_bytes: self.peak_memory_bytes,
            files: listed,
            backend,
            image_digest: self.image_digest,
            policy_version: policy_version.to_owned(),
            error: None,
            rejected_files: rejected,
            degraded: self.degraded,
            network: self.network.as_ref().map(|n| n.counts.clone()),
        };
        JobResult {
            observation,
            files: released,
            connections: self.network.map(|n| n.connections).unwrap_or_default(),
        }
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

const SIGNAL_NAMES: &[(i32, &str)] = &[
    (1, "SIGHUP"),
    (2, "SIGINT"),
    (3, "SIGQUIT"),
    (4, "SIGILL"),
    (5, "SIGTRAP"),
    (6, "SIGABRT"),
    (7, "SIGBUS"),
    (8, "SIGFPE"),
    (9, "SIGKILL"),
    (10, "SIGUSR1"),
    (11, "SIGSEGV"),
    (12, "SIGUSR2"),
    (13, "SIGPIPE"),
    (14, "SIGALRM"),
    (15, "SIGTERM"),
    (16, "SIGSTKFLT"),
    (17, "SIGCHLD"),
    (18, "SIGCONT"),
    (19, "SIGSTOP"),
    (20, "SIGTSTP"),
    (21, "SIGTTIN"),
    (22, "SIGTTOU"),
    (23, "SIGURG"),
    (24, "SIGXCPU"),
    (25, "SIGXFSZ"),
    (26, "SIGVTALRM"),
    (27, "SIGPROF"),
    (28, "SIGWINCH"),
    (29, "SIGIO"),
    (30, "SIGPWR"),
    (31, "SIGSYS"),
];

/// `"SIGKILL"` for 9; `"SIG42"` for numbers without a name.
pub fn signal_name(number: i32) -> String {
    SIGNAL_NAMES
        .iter()
        .find(|(n, _)| *n == number)
        .map_or_else(|| format!("SIG{number}"), |(_, name)| (*name).to_owned())
}

/// The inverse of [`signal_name`].
pub fn signal_number(name: &str) -> Option<i32> {
    SIGNAL_NAMES
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(number, _)| *number)
        .or_else(|| name.strip_prefix("SIG")?.parse().ok())
}

/// What the host may hand back of one file it read from a job's workspace (a session's
/// `/work`, the E2B file routes), scanned exactly as a released `/out` file is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkspaceFileRelease {
    /// The content to send: text redacted in place, a binary without secrets as it was.
    Released {
        /// The bytes to send.
        content: Vec<u8>,
        /// Secrets replaced in the content.
        redactions: u64,
    },
    /// Not handed back: the reason says why (a secret in a name or in a binary).
    Withheld {
        /// Why, for the caller.
        reason: String,
        /// Secret-shaped strings found.
        secrets: u64,
    },
}

/// Scans a file read from a workspace as [`RunReport::into_result`] scans a `/out` file
/// (`redact(before, text, after)` as there): a name that looks like a secret withholds it,
/// text is redacted in place, UTF-16 text with a byte-order mark is rewritten, and a
/// binary with a secret-shaped string in it is withheld, since it cannot be rewritten.
pub fn release_workspace_file(
    path: &str,
    content: Vec<u8>,
    redact: &dyn Fn(&str, String, &str) -> (String, u64),
) -> WorkspaceFileRelease {
    let (_, name_secrets) = shown_name(path, redact);
    if name_secrets > 0 {
        return WorkspaceFileRelease::Withheld {
            reason: "its name looks like a secret".to_owned(),
            secrets: name_secrets,
        };
    }
    let media_type = crate::media::sniff_media_type(path, &content);
    match scan_file(content, redact) {
        Scanned::Released {
            content,
            redactions,
        } => WorkspaceFileRelease::Released {
            content,
            redactions,
        },
        Scanned::Withheld { secrets } => WorkspaceFileRelease::Withheld {
            reason: format!(
                "binary ({media_type}) with {secrets} secret-shaped string(s) in it; \
                 binary files are not rewritten"
            ),
            secrets,
        },
    }
}

/// A name from a workspace listing as it may be shown: control characters and invalid
/// UTF-8 escaped as output is (`\x0a`), then redacted; with the number of secrets replaced.
/// The same rule as the names of `/out` files.
pub fn shown_workspace_name(
    name: &str,
    redact: &dyn Fn(&str, String, &str) -> (String, u64),
) -> (String, u64) {
    shown_name(name, redact)
}

/// A file name as it may be shown and written: escaped like output and redacted, with the
/// number of secrets replaced. Equal to the name when the name is safe as it is.
fn shown_name(name: &str, redact: &dyn Fn(&str, String, &str) -> (String, u64)) -> (String, u64) {
    let escaped = crate::capture::render_text(name.as_bytes(), false)
        .replace('\n', "\\x0a")
        .replace('\t', "\\x09");
    redact("", escaped, "")
}

/// What scanning a released file gave.
enum Scanned {
    /// Released, text redacted in place.
    Released { content: Vec<u8>, redactions: u64 },
    /// Binary with secrets in it: not released.
    Withheld { secrets: u64 },
}

/// Scans a file of `/out` for secrets whatever its type: UTF-8 text is redacted in place,
/// UTF-16 text with a byte-order mark is decoded, redacted and encoded again, and anything
/// else is scanned as bytes (also with NUL bytes dropped, which is how UTF-16 without a mark
/// hides ASCII) and withheld if a secret is found, since a binary cannot be rewritten safely.
fn scan_file(content: Vec<u8>, redact: &dyn Fn(&str, String, &str) -> (String, u64)) -> Scanned {
    if crate::media::is_text(&content) {
        let text = String::from_utf8_lossy(&content).into_owned();
        let (text, redactions) = redact("", text, "");
        return Scanned::Released {
            content: text.into_bytes(),
            redactions,
        };
    }
    if let Some((bom, little_endian)) = utf16_bom(&content)
        && let Some(text) = decode_utf16(&content[2..], little_endian)
    {
        let (text, redactions) = redact("", text, "");
        if redactions == 0 {
            return Scanned::Released {
                content,
                redactions,
            };
        }
        let mut encoded = bom.to_vec();
        for unit in text.encode_utf16() {
            let bytes = if little_endian {
                unit.to_le_bytes()
            } else {
                unit.to_be_bytes()
            };
            encoded.extend_from_slice(&bytes);
        }
        return Scanned::Released {
            content: encoded,
            redactions,
        };
    }
    let lossy = String::from_utf8_lossy(&content).into_owned();
    let (_, mut secrets) = redact("", lossy, "");
    if secrets == 0 && content.contains(&0) {
        let without_nul: Vec<u8> = content.iter().copied().filter(|b| *b != 0).collect();
        secrets = redact("", String::from_utf8_lossy(&without_nul).into_owned(), "").1;
    }
    if secrets == 0 {
        Scanned::Released {
            content,
            redactions: 0,
        }
    } else {
        Scanned::Withheld { secrets }
    }
}

/// The byte-order mark of UTF-16 text and whether it is little-endian.
fn utf16_bom(content: &[u8]) -> Option<(&'static [u8], bool)> {
    match content {
        [0xff, 0xfe, ..] => Some((&[0xff, 0xfe], true)),
        [0xfe, 0xff, ..] => Some((&[0xfe, 0xff], false)),
        _ => None,
    }
}

fn decode_utf16(bytes: &[u8], little_endian: bool) -> Option<String> {
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    let units = bytes.chunks_exact(2).map(|pair| {
        if little_endian {
            u16::from_le_bytes([pair[0], pair[1]])
        } else {
            u16::from_be_bytes([pair[0], pair[1]])
        }
    });
    char::decode_utf16(units)
        .collect::<Result<String, _>>()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn report(termination: Termination) -> RunReport {
        RunReport {
            stdout: CapturedOutput::whole(b"45\n"),
            setup: Duration::from_millis(5),
            cpu_time: Some(Duration::from_millis(18)),
            peak_memory_bytes: Some(9_437_184),
            ..RunReport::ended(termination, Duration::from_millis(21))
        }
    }

    fn no_redaction(_: &str, text: String, _: &str) -> (String, u64) {
        (text, 0)
    }

    #[test]
    fn observation_json_has_exactly_the_design_fields() {
        let obs = report(Termination::Exited(0))
            .into_result(
                JobId::generate(),
                BackendKind::Native,
                "default-1",
                &no_redaction,
            )
            .observation;
        let value = serde_json::to_value(&obs).unwrap();
        let mut keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        let mut expected = vec![
            "job_id",
            "ok",
            "outcome",
            "exit_code",
            "signal",
            "stdout",
            "stderr",
            "stdout_bytes",
            "stderr_bytes",
            "stdout_truncated",
            "stderr_truncated",
            "redactions",
            "duration_ms",
            "cpu_ms",
            "peak_memory_bytes",
            "files",
            "backend",
            "image_digest",
            "policy_version",
        ];
        expected.sort_unstable();
        assert_eq!(keys, expected);
        assert_eq!(value["ok"], true);
        assert_eq!(value["outcome"], "exited");
        assert_eq!(value["stdout"], "45\n");
        assert_eq!(value["backend"], "native");
    }

    #[test]
    fn error_observation_carries_kind_and_message() {
        let obs = Observation::error(
            JobId::generate(),
            BackendKind::Native,
            "default-1",
            ErrorKind::PolicyDenied,
            "too big",
        );
        let value = serde_json::to_value(&obs).unwrap();
        assert_eq!(value["ok"], false);
        assert_eq!(value["outcome"], "error");
        assert_eq!(value["error"]["kind"], "policy_denied");
        assert_eq!(value["error"]["message"], "too big");
        assert_eq!(obs.cli_exit_code(), 125);
    }

    #[test]
    fn outcome_precedence() {
        let mut r = report(Termination::Signaled(9));
        assert_eq!(r.outcome(), Outcome::Killed);
        r.oom_kills = 1;
        assert_eq!(r.outcome(), Outcome::Oom);
        r.limit_hit = Some(LimitHit::OutputFlood);
        assert_eq!(r.outcome(), Outcome::OutputLimit);
        r.limit_hit = Some(LimitHit::Timeout);
        assert_eq!(r.outcome(), Outcome::Timeout);
        assert_eq!(report(Termination::Exited(3)).outcome(), Outcome::Exited);
    }

    #[test]
    fn ok_only_for_exit_zero() {
        let obs = report(Termination::Exited(1))
            .into_result(JobId::generate(), BackendKind::Native, "v", &no_redaction)
            .observation;
        assert!(!obs.ok);
        assert_eq!(obs.cli_exit_code(), 1);
    }

    #[test]
    fn cli_exit_codes() {
        let mk = |t, hit| {
            let mut r = report(t);
            r.limit_hit = hit;
            r.into_result(JobId::generate(), BackendKind::Native, "v", &no_redaction)
                .observation
        };
        assert_eq!(
            mk(Termination::Signaled(9), Some(LimitHit::Timeout)).cli_exit_code(),
            124
        );
        assert_eq!(mk(Termination::Signaled(9), None).cli_exit_code(), 137);
        assert_eq!(mk(Termination::Signaled(15), None).cli_exit_code(), 143);
        assert_eq!(
            mk(Termination::Signaled(9), None).signal.as_deref(),
            Some("SIGKILL")
        );
    }

    #[test]
    fn released_text_files_are_redacted_and_hashed_after_redaction() {
        let mut r = report(Termination::Exited(0));
        r.out_files = vec![
            ReleasedFile {
                path: "notes.txt".into(),
                content: b"key=SECRET\n".to_vec(),
            },
            ReleasedFile {
                path: "plot.png".into(),
                content: b"\x89PNG\r\n\x1a\nSECRET".to_vec(),
            },
        ];
        let redact = |_: &str, text: String, _: &str| {
            let count = text.matches("SECRET").count() as u64;
            (text.replace("SECRET", "[REDACTED:test]"), count)
        };
        let result = r.into_result(JobId::generate(), BackendKind::Native, "v", &redact);
        let files = &result.observation.files;
        assert_eq!(files[0].media_type, "text/plain");
        assert_eq!(files[0].redactions, 1);
        assert_eq!(result.files[0].content, b"key=[REDACTED:test]\n");
        assert_eq!(files[0].bytes, result.files[0].content.len() as u64);
        assert_eq!(
            files[0].sha256,
            crate::job::sha256_digest(&result.files[0].content).trim_start_matches("sha256:")
        );
        // A binary with a secret in it cannot be rewritten: it is withheld, and counted.
        assert_eq!(files.len(), 1);
        assert_eq!(result.files.len(), 1);
        let withheld = &result.observation.rejected_files[0];
        assert_eq!(withheld.path, "plot.png");
        assert!(withheld.reason.contains("image/png"), "{}", withheld.reason);
        assert_eq!(result.observation.redactions, 2);
    }

    fn secret_redaction(_: &str, text: String, _: &str) -> (String, u64) {
        let count = text.matches("SECRET").count() as u64;
        (text.replace("SECRET", "[REDACTED:test]"), count)
    }

    #[test]
    fn every_released_file_is_scanned_whatever_its_type() {
        let utf16 = |little: bool, text: &str| {
            let mut bytes = if little {
                vec![0xff, 0xfe]
            } else {
                vec![0xfe, 0xff]
            };
            for unit in text.encode_utf16() {
                bytes.extend(if little {
                    unit.to_le_bytes()
                } else {
                    unit.to_be_bytes()
                });
            }
            bytes
        };
        let mut r = report(Termination::Exited(0));
        r.out_files = vec![
            ReleasedFile {
                path: "le.txt".into(),
                content: utf16(true, "key=SECRET"),
            },
            ReleasedFile {
                path: "be.txt".into(),
                content: utf16(false, "key=SECRET"),
            },
            ReleasedFile {
                // UTF-16 without a mark: ASCII with NULs between.
                path: "nomark.bin".into(),
                content: b"S\0E\0C\0R\0E\0T\0".to_vec(),
            },
            ReleasedFile {
                path: "clean.bin".into(),
                content: b"\0\x01\x02plain".to_vec(),
            },
        ];
        let result = r.into_result(
            JobId::generate(),
            BackendKind::Native,
            "v",
            &secret_redaction,
        );
        assert_eq!(result.files[0].content, utf16(true, "key=[REDACTED:test]"));
        assert_eq!(result.files[1].content, utf16(false, "key=[REDACTED:test]"));
        assert_eq!(result.observation.files[0].redactions, 1);
        assert_eq!(result.files[2].path, "clean.bin");
        assert_eq!(result.files[2].content, b"\0\x01\x02plain");
        assert_eq!(result.observation.rejected_files.len(), 1);
        assert_eq!(result.observation.rejected_files[0].path, "nomark.bin");
        assert_eq!(result.observation.redactions, 3);
    }

    #[test]
    fn names_with_secrets_or_controls_are_never_released() {
        let mut r = report(Termination::Exited(0));
        let file = |path: &str| ReleasedFile {
            path: path.into(),
            content: b"x".to_vec(),
        };
        r.out_files = vec![
            file("SECRET.txt"),
            file("a\x1b]0;title\x07.txt"),
            file("two\nlines.txt"),
            file("ok.txt"),
        ];
        r.out_rejected = vec![RejectedFile {
            path: "link-SECRET".into(),
            reason: "symlink".into(),
        }];
        let result = r.into_result(
            JobId::generate(),
            BackendKind::Native,
            "v",
            &secret_redaction,
        );
        let released: Vec<&str> = result.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(released, vec!["ok.txt"]);
        let rejected: Vec<(&str, &str)> = result
            .observation
            .rejected_files
            .iter()
            .map(|f| (f.path.as_str(), f.reason.as_str()))
            .collect();
        assert_eq!(
            rejected,
            vec![
                ("link-[REDACTED:test]", "symlink"),
                ("[REDACTED:test].txt", "its name looks like a secret"),
                (
                    "a\\x1b]0;title\\x07.txt",
                    "its name has control characters or invalid UTF-8"
                ),
                (
                    "two\\x0alines.txt",
                    "its name has control characters or invalid UTF-8"
                ),
            ]
        );
        assert_eq!(result.observation.redactions, 2);
    }

    #[test]
    fn signal_names_round_trip() {
        for n in 1..=64 {
            assert_eq!(signal_number(&signal_name(n)), Some(n));
        }
    }
}
