//! Prometheus metrics: one explicit registry, a small fixed set of series. Labels are
//! closed sets (outcome, backend, stream, reason); never tenants' tokens, never job data.

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use airlock_core::{Observation, WarmPoolStats};

/// How often `/metrics` measures the root cache (a walk of its tree).
pub const ROOT_CACHE_REFRESH: std::time::Duration = std::time::Duration::from_secs(30);

/// `outcome` and `backend` of a finished job.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    /// `exited`, `timeout`, ... `error`.
    pub outcome: String,
    /// `native`, ...
    pub backend: String,
}

/// `stream` of output bytes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    /// `stdout` or `stderr`.
    pub stream: String,
}

/// Why a request was turned away before it ran.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    /// `queue_full`, `tenant_queue_full`, `shutting_down`, `unauthorized`, `body_too_large`, `bad_request`,
    /// `foreign_host` (a foreign Host or Origin without tokens), `not_json`.
    pub reason: String,
}

/// What became of a job with respect to the warm pool, or of a warm sandbox.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WarmLabels {
    /// Jobs: `hit`, `miss`, `unfit`. Sandboxes: `started`, `failed`, `discarded`,
    /// `started_for_job`, `started_for_session`.
    pub result: String,
}

/// The server's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    jobs: Family<JobLabels, Counter>,
    duration: Histogram,
    queue_wait: Histogram,
    in_flight: Gauge<i64, AtomicI64>,
    queue_depth: Gauge<i64, AtomicI64>,
    output_bytes: Family<StreamLabels, Counter>,
    redactions: Counter,
    rejected: Family<RejectLabels, Counter>,
    warm_ready: Gauge<i64, AtomicI64>,
    warm_jobs: Family<WarmLabels, Counter>,
    warm_sandboxes: Family<WarmLabels, Counter>,
    warm_zygote: Family<WarmLabels, Counter>,
    warm_container_ends: Family<WarmLabels, Counter>,
    /// The pool figures last copied into the counters.
    warm_seen: std::sync::Mutex<WarmPoolStats>,
    audit_writable: Gauge<i64, AtomicI64>,
    audit_unsettled: Gauge<i64, AtomicI64>,
    audit_write_failures: Gauge<i64, AtomicI64>,
    root_cache_bytes: Gauge<i64, AtomicI64>,
    root_cache_copies: Gauge<i64, AtomicI64>,
    /// When the root cache was last measured (a walk of its tree: not on every scrape).
    root_cache_measured: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every series registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("airlock");
        let jobs = Family::<JobLabels, Counter>::default();
        // 5 ms .. ~82 s.
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 15));
        // 1 ms .. ~33 s.
        let queue_wait = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let in_flight = Gauge::<i64, AtomicI64>::default();
        let queue_depth = Gauge::<i64, AtomicI64>::default();
        let output_bytes = Family::<StreamLabels, Counter>::default();
        let redactions = Counter::default();
        let rejected = Family::<RejectLabels, Counter>::default();
        registry.register(
            "jobs",
            "Jobs finished, by outcome and backend (refused ones as outcome error)",
            jobs.clone(),
        );
        registry.register(
            "job_duration_seconds",
            "Time from a job's start (after the queue) to its observation, teardown included",
            duration.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time jobs waited for a slot",
            queue_wait.clone(),
        );
        registry.register("jobs_in_flight", "Jobs running now", in_flight.clone());
        registry.register(
            "queue_depth",
            "Jobs waiting for a slot now",
            queue_depth.clone(),
        );
        registry.register(
            "output_bytes",
            "Bytes jobs wrote, by stream (all of it, kept or not)",
            output_bytes.clone(),
        );
        registry.register(
            "redactions",
            "Secret-shaped strings replaced in job output",
            redactions.clone(),
        );
        registry.register(
            "requests_rejected",
            "Requests turned away before running, by reason",
            rejected.clone(),
        );
        let audit_writable = Gauge::<i64, AtomicI64>::default();
        let audit_unsettled = Gauge::<i64, AtomicI64>::default();
        let audit_write_failures = Gauge::<i64, AtomicI64>::default();
        audit_writable.set(1);
        registry.register(
            "audit_writable",
            "1 while the audit log takes every line; 0 when a write failed (a full disk, an I/O error, read-only): new jobs are then refused until it recovers",
            audit_writable.clone(),
        );
        registry.register(
            "audit_unsettled_jobs",
            "Jobs that ended while the audit log could not take their line: written before the next job runs",
            audit_unsettled.clone(),
        );
        registry.register(
            "audit_write_failures",
            "Writes to the audit log or its write-ahead records that failed since the server started",
            audit_write_failures.clone(),
        );
        let root_cache_bytes = Gauge::<i64, AtomicI64>::default();
        let root_cache_copies = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "root_cache_bytes",
            "Bytes of the native backend's prepared minimal roots under the cache directory (measured at most every ROOT_CACHE_REFRESH)",
            root_cache_bytes.clone(),
        );
        registry.register(
            "root_cache_copies",
            "Prepared minimal root copies under the cache directory (one per root shape, plus any a running sandbox still mounts)",
            root_cache_copies.clone(),
        );
        let warm_ready = Gauge::<i64, AtomicI64>::default();
        let warm_jobs = Family::<WarmLabels, Counter>::default();
        let warm_sandboxes = Family::<WarmLabels, Counter>::default();
        let warm_zygote = Family::<WarmLabels, Counter>::default();
        let warm_container_ends = Family::<WarmLabels, Counter>::default();
        registry.register(
            "warm_pool_ready",
            "Warm sandboxes or containers started and waiting for a job ([native] warm_pool, [docker] warm_pool, gvisor_warm_pool, podman_warm_pool)",
            warm_ready.clone(),
        );
        registry.register(
            "warm_pool_jobs",
            "Jobs by warm pool result: hit (ran warm), miss (none ready), unfit (the pool's template does not fit)",
            warm_jobs.clone(),
        );
        registry.register(
            "warm_pool_sandboxes",
            "Warm sandboxes or containers started, failed to start, or discarded (found dead, idle past warm_idle, or their CPU share not raised); started_for_job: forked from the zygote at once for a job that found none ready; started_for_session: forked from the zygote with a session's /work and /tmp for its kernel",
            warm_sandboxes.clone(),
        );
        registry.register(
            "warm_pool_zygote",
            "The warm pool's zygotes ([native] zygote): hit (a job ran in a forked sandbox), forked, fork_failed (filled from scratch instead), started, failed (to start), lost (died or unusable while serving)",
            warm_zygote.clone(),
        );
        registry.register(
            "warm_pool_container_ends",
            "Warm container jobs by where their end was learned: kernel (the first process's pidfd and the kernel's process events, without waiting for the engine), engine (the engine's wait: gVisor, no process events on this host, or a status the events cannot tell)",
            warm_container_ends.clone(),
        );
        Self {
            registry,
            warm_ready,
            warm_jobs,
            warm_sandboxes,
            warm_zygote,
            warm_container_ends,
            warm_seen: std::sync::Mutex::new(WarmPoolStats::default()),
            audit_writable,
            audit_unsettled,
            audit_write_failures,
            root_cache_bytes,
            root_cache_copies,
            root_cache_measured: std::sync::Mutex::new(None),
            jobs,
            duration,
            queue_wait,
            in_flight,
            queue_depth,
            output_bytes,
            redactions,
            rejected,
        }
    }

    /// Records a finished job.
    pub fn job_finished(&self, observation: &Observation, seconds: f64) {
        self.jobs
            .get_or_create(&JobLabels {
                outcome: observation.outcome.as_str().to_owned(),
                backend: observation.backend.as_str().to_owned(),
            })
            .inc();
        self.duration.observe(seconds);
        for (stream, bytes) in [
            ("stdout", observation.stdout_bytes),
            ("stderr", observation.stderr_bytes),
        ] {
            self.output_bytes
                .get_or_create(&StreamLabels {
                    stream: stream.to_owned(),
                })
                .inc_by(bytes);
        }
        self.redactions.inc_by(observation.redactions);
    }

    /// Records how long a job waited for its slot.
    pub fn waited(&self, seconds: f64) {
        self.queue_wait.observe(seconds);
    }

    /// The jobs-in-flight gauge.
    pub fn in_flight(&self) -> &Gauge<i64, AtomicI64> {
        &self.in_flight
    }

    /// The queue-depth gauge.
    pub fn queue_depth(&self) -> &Gauge<i64, AtomicI64> {
        &self.queue_depth
    }

    /// Records a request turned away.
    pub fn rejected(&self, reason: &str) {
        self.rejected
            .get_or_create(&RejectLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Copies the audit logs' health (every policy's log) into the series.
    pub fn audit(&self, health: &[airlock_engine::audit::AuditHealth]) {
        self.audit_writable
            .set(i64::from(health.iter().all(|h| h.writable)));
        self.audit_unsettled.set(
            health
                .iter()
                .map(|h| i64::try_from(h.unsettled).unwrap_or(i64::MAX))
                .sum(),
        );
        self.audit_write_failures.set(
            health
                .iter()
                .map(|h| i64::try_from(h.write_failures).unwrap_or(i64::MAX))
                .sum(),
        );
    }

    /// Whether the root cache is due for measuring (never measured, or not within
    /// [`ROOT_CACHE_REFRESH`]); a true answer counts as the start of a measurement.
    pub fn root_cache_due(&self) -> bool {
        let Ok(mut measured) = self.root_cache_measured.lock() else {
            return false;
        };
        let now = std::time::Instant::now();
        if measured.is_some_and(|at| now.duration_since(at) < ROOT_CACHE_REFRESH) {
            return false;
        }
        *measured = Some(now);
        true
    }

    /// Records the root cache's size.
    pub fn root_cache(&self, bytes: u64, copies: u64) {
        self.root_cache_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.root_cache_copies
            .set(i64::try_from(copies).unwrap_or(i64::MAX));
    }

    /// Copies the warm pools' figures (summed over every policy's pool) into the series.
    pub fn warm_pool(&self, now: WarmPoolStats) {
        let Ok(mut seen) = self.warm_seen.lock() else {
            return;
        };
        self.warm_ready
            .set(i64::try_from(now.ready).unwrap_or(i64::MAX));
        let jobs = [
            ("hit", now.hits, seen.hits),
            ("miss", now.misses, seen.misses),
            ("unfit", now.unfit, seen.unfit),
        ];
        let sandboxes = [
            ("started", now.started, seen.started),
            ("failed", now.failed, seen.failed),
            ("discarded", now.discarded, seen.discarded),
            (
                "started_for_job",
                now.started_for_jobs,
                seen.started_for_jobs,
            ),
            (
                "started_for_session",
                now.started_for_sessions,
                seen.started_for_sessions,
            ),
        ];
        let zygote = [
            ("hit", now.forked_hits, seen.forked_hits),
            ("forked", now.forked, seen.forked),
            ("fork_failed", now.fork_failed, seen.fork_failed),
            ("started", now.zygotes_started, seen.zygotes_started),
            ("failed", now.zygotes_failed, seen.zygotes_failed),
            ("lost", now.zygotes_lost, seen.zygotes_lost),
        ];
        let container_ends = [
            (
                "kernel",
                now.container_ends_from_kernel,
                seen.container_ends_from_kernel,
            ),
            (
                "engine",
                now.container_ends_from_engine,
                seen.container_ends_from_engine,
            ),
        ];
        for (family, counts) in [
            (&self.warm_jobs, &jobs[..]),
            (&self.warm_sandboxes, &sandboxes[..]),
            (&self.warm_zygote, &zygote[..]),
            (&self.warm_container_ends, &container_ends[..]),
        ] {
            for (result, now, before) in counts {
                family
                    .get_or_create(&WarmLabels {
                        result: (*result).to_owned(),
                    })
                    .inc_by(now.saturating_sub(*before));
            }
        }
        *seen = now;
    }

    /// The exposition in `format`.
    pub fn render(&self, format: ExpositionFormat) -> String {
        let mut text = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::error!(error = %e, "encode metrics");
        }
        match format {
            ExpositionFormat::OpenMetrics => text,
            ExpositionFormat::PrometheusText => openmetrics_to_prometheus_text(&text),
        }
    }
}

/// The two text formats `/metrics` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpositionFormat {
    /// Prometheus text format 0.0.4: what a client that names no format gets.
    PrometheusText,
    /// OpenMetrics 1.0.0.
    OpenMetrics,
}

impl ExpositionFormat {
    /// The `Content-Type` of the exposition.
    pub fn content_type(self) -> &'static str {
        match self {
            ExpositionFormat::PrometheusText => "text/plain; version=0.0.4; charset=utf-8",
            ExpositionFormat::OpenMetrics => {
                "application/openmetrics-text; version=1.0.0; charset=utf-8"
            }
        }
    }

    /// The format an `Accept` header asks for: OpenMetrics only when it weighs
    /// `application/openmetrics-text` above every range that matches `text/plain`
    /// (Prometheus's own scraper does); Prometheus text otherwise, absent header included.
    pub fn negotiate(accept: Option<&str>) -> Self {
        let mut openmetrics = 0.0_f32;
        let mut text = 0.0_f32;
        for range in accept.unwrap_or("").split(',') {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let mut q = 1.0_f32;
            for param in parts {
                if let Some((name, value)) = param.split_once('=')
                    && name.trim().eq_ignore_ascii_case("q")
                {
                    q = value.trim().parse::<f32>().unwrap_or(0.0).clamp(0.0, 1.0);
                }
            }
            match media.as_str() {
                "application/openmetrics-text" => openmetrics = openmetrics.max(q),
                "text/plain" | "text/*" | "*/*" => text = text.max(q),
                _ => {}
            }
        }
        if openmetrics > 0.0 && openmetrics > text {
            ExpositionFormat::OpenMetrics
        } else {
            ExpositionFormat::PrometheusText
        }
    }
}

/// Rewrites prometheus-client's OpenMetrics text as Prometheus text 0.0.4. The samples are
/// the same; what differs is metadata: a 0.0.4 counter family is named after its samples
/// (`# TYPE airlock_jobs_total counter`, where OpenMetrics says `airlock_jobs`), `unknown`
/// is `untyped`, and there is no `# UNIT` or `# EOF`. Read by OpenMetrics names, a 0.0.4
/// parser sees an empty `airlock_jobs` counter and an orphan `airlock_jobs_total`.
fn openmetrics_to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let rewritten = if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            // OpenMetrics escapes `"` in help text; 0.0.4 escapes only `\` and newlines.
            let help = help.replace("\\\"", "\"");
            if counters.contains(name) {
                format!("# HELP {name}_total {help}")
            } else {
                format!("# HELP {name} {help}")
            }
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            match rest.rsplit_once(' ') {
                Some((name, "counter")) => format!("# TYPE {name}_total counter"),
                Some((name, "unknown")) => format!("# TYPE {name} untyped"),
                _ => line.to_owned(),
            }
        } else {
            line.to_owned()
        };
        out.push_str(&rewritten);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_core::{BackendKind, ErrorKind, JobId};

    #[test]
    fn render_has_every_series() {
        let metrics = Metrics::new();
        let obs = Observation::error(
            JobId::generate(),
            BackendKind::Native,
            "v",
            ErrorKind::PolicyDenied,
            "no",
        );
        metrics.job_finished(&obs, 0.01);
        metrics.waited(0.002);
        metrics.rejected("queue_full");
        for format in [
            ExpositionFormat::PrometheusText,
            ExpositionFormat::OpenMetrics,
        ] {
            let text = metrics.render(format);
            for needle in [
                "airlock_jobs_total{outcome=\"error\",backend=\"native\"} 1",
                "airlock_job_duration_seconds_bucket",
                "airlock_queue_wait_seconds_count 1",
                "airlock_jobs_in_flight 0",
                "airlock_queue_depth 0",
                "airlock_output_bytes_total{stream=\"stdout\"} 0",
                "airlock_redactions_total 0",
                "airlock_requests_rejected_total{reason=\"queue_full\"} 1",
            ] {
                assert!(text.contains(needle), "{needle} missing from:\n{text}");
            }
        }
    }

    /// Counter families: `airlock_jobs` with samples `airlock_jobs_total` in OpenMetrics,
    /// `airlock_jobs_total` in 0.0.4; every other line the same, no EOF in 0.0.4.
    #[test]
    fn each_format_names_counter_families_its_own_way() {
        let metrics = Metrics::new();
        metrics.rejected("unauthorized");
        metrics.job_finished(
            &Observation::error(
                JobId::generate(),
                BackendKind::Native,
                "v",
                ErrorKind::Internal,
                "x",
            ),
            0.5,
        );
        let om = metrics.render(ExpositionFormat::OpenMetrics);
        assert!(om.contains("# TYPE airlock_jobs counter\n"), "{om}");
        assert!(
            om.contains("# TYPE airlock_requests_rejected counter\n"),
            "{om}"
        );
        assert!(om.ends_with("# EOF\n"), "{om}");
        let text = metrics.render(ExpositionFormat::PrometheusText);
        assert!(
            text.contains("# TYPE airlock_jobs_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP airlock_requests_rejected_total Requests turned away"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE airlock_requests_rejected_total counter\n"),
            "{text}"
        );
        assert!(text.contains("airlock_requests_rejected_total{reason=\"unauthorized\"} 1\n"));
        assert!(
            text.contains("# TYPE airlock_job_duration_seconds histogram\n"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE airlock_jobs_in_flight gauge\n"),
            "{text}"
        );
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        // Every TYPE line of 0.0.4 names a family whose samples exist or may exist under
        // that exact name (or its histogram suffixes): no orphans.
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let name = line.split(' ').nth(2).unwrap();
            assert!(
                !text
                    .lines()
                    .any(|l| !l.starts_with('#') && l.starts_with(&format!("{name}_total"))),
                "{name} has _total samples of another family"
            );
        }
        // Samples are identical.
        let samples = |t: &str| -> Vec<String> {
            t.lines()
                .filter(|l| !l.starts_with('#'))
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(samples(&om), samples(&text));
    }

    #[test]
    fn openmetrics_only_when_preferred() {
        use ExpositionFormat::*;
        for (accept, want) in [
            (None, PrometheusText),
            (Some("*/*"), PrometheusText),
            (Some("text/plain;version=0.0.4"), PrometheusText),
            (
                Some("text/plain; version=0.0.4; q=0.9, application/openmetrics-text; q=0.5"),
                PrometheusText,
            ),
            (Some("application/openmetrics-text"), OpenMetrics),
            (
                Some("application/openmetrics-text; version=1.0.0"),
                OpenMetrics,
            ),
            // Prometheus 2.x's scrape header.
            (
                Some(
                    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                ),
                OpenMetrics,
            ),
            (
                Some("application/openmetrics-text;q=0, text/plain"),
                PrometheusText,
            ),
            (
                Some("application/openmetrics-text, text/plain"),
                PrometheusText,
            ),
            (Some("application/json"), PrometheusText),
        ] {
            assert_eq!(ExpositionFormat::negotiate(accept), want, "{accept:?}");
        }
    }
}
