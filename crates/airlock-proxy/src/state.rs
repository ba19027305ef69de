//! State shared by every connection of one proxy: the records, the per-proxy counters and
//! budgets, and the stop signal.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use crate::config::ProxyConfig;
use crate::host::TargetHost;
use crate::record::{ConnectionRecord, LimitKind, ProxySummary, RECORD_PATH_MAX_BYTES, Verdict};

/// Longest host kept in a record of a refused request, in bytes.
const RECORD_HOST_MAX_BYTES: usize = 255;

/// Most file hosts package indexes may name during one job; later ones are not allowed.
pub const FILE_HOSTS_MAX: usize = 16;

/// One proxy's shared state.
pub(crate) struct Shared {
    pub(crate) config: Arc<ProxyConfig>,
    /// The listening address, so that the proxy never dials itself.
    pub(crate) listen_addr: SocketAddr,
    epoch: Instant,
    records: Mutex<Vec<ConnectionRecord>>,
    /// Request slots taken (each request or tunnel, allowed or denied, takes one).
    slots: AtomicU64,
    refused_after_limit: AtomicU64,
    upstream_connects: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    /// Bytes reserved against `limits.bytes` (both directions).
    bytes_reserved: AtomicU64,
    limit_hit: Mutex<Option<LimitKind>>,
    stop: watch::Receiver<bool>,
    /// Cloned into every task; the proxy has drained when all clones are gone. Taken out
    /// (dropped) by `shutdown`.
    drain: Mutex<Option<mpsc::Sender<()>>>,
    /// Hosts a package index's answers linked to for files (`https://` links): allowed
    /// and intercepted for the rest of the job, at most [`FILE_HOSTS_MAX`].
    file_hosts: Mutex<Vec<(TargetHost, u16)>>,
}

impl Shared {
    pub(crate) fn new(
        config: Arc<ProxyConfig>,
        listen_addr: SocketAddr,
        stop: watch::Receiver<bool>,
        drain: mpsc::Sender<()>,
    ) -> Self {
        Self {
            config,
            listen_addr,
            epoch: Instant::now(),
            records: Mutex::new(Vec::new()),
            slots: AtomicU64::new(0),
            refused_after_limit: AtomicU64::new(0),
            upstream_connects: AtomicU64::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
            bytes_reserved: AtomicU64::new(0),
            limit_hit: Mutex::new(None),
            stop,
            drain: Mutex::new(Some(drain)),
            file_hosts: Mutex::new(Vec::new()),
        }
    }

    /// True when `host:port` may be reached: on the allowlist, a package index, or a file
    /// host an index named.
    pub(crate) fn allows(&self, host: &TargetHost, port: u16) -> bool {
        self.config.allows(host, port) || self.is_file_host(host, port)
    }

    /// True when the proxy terminates the TLS of a tunnel to `host:port`.
    pub(crate) fn intercepts(&self, host: &TargetHost, port: u16) -> bool {
        self.config.intercepts(host, port)
            || (self.config.interception().is_some() && self.is_file_host(host, port))
    }

    /// True for a package index and the file hosts it named: their requests' paths are
    /// recorded.
    pub(crate) fn is_package_host(&self, host: &TargetHost, port: u16) -> bool {
        self.config.is_package_index(host, port) || self.is_file_host(host, port)
    }

    fn is_file_host(&self, host: &TargetHost, port: u16) -> bool {
        lock(&self.file_hosts)
            .iter()
            .any(|(h, p)| h == host && *p == port)
    }

    /// Allows `host:port` from now on, because a package index linked to it; `false` when
    /// [`FILE_HOSTS_MAX`] are known already (the host stays unknown).
    pub(crate) fn learn_file_host(&self, host: TargetHost, port: u16) -> bool {
        let mut hosts = lock(&self.file_hosts);
        if hosts.iter().any(|(h, p)| *h == host && *p == port) {
            return true;
        }
        if hosts.len() >= FILE_HOSTS_MAX {
            return false;
        }
        tracing::debug!(%host, port, "a package index named a file host");
        hosts.push((host, port));
        true
    }

    /// Milliseconds since the proxy started.
    pub(crate) fn now_ms(&self) -> u64 {
        duration_ms(self.epoch.elapsed())
    }

    pub(crate) fn epoch(&self) -> Instant {
        self.epoch
    }

    /// A token that keeps [`ProxyHandle::shutdown`](crate::ProxyHandle::shutdown) waiting
    /// until the task holding it ends.
    pub(crate) fn drain_token(&self) -> Option<mpsc::Sender<()>> {
        lock(&self.drain).clone()
    }

    /// Drops the proxy's own drain token, so that the drain channel closes with the last
    /// task.
    pub(crate) fn release_drain(&self) {
        lock(&self.drain).take();
    }

    /// Resolves when the proxy is told to stop (or its handle is dropped).
    pub(crate) async fn stopped(&self) {
        let mut stop = self.stop.clone();
        while !*stop.borrow_and_update() {
            if stop.changed().await.is_err() {
                return;
            }
        }
    }

    /// Takes one request slot; `false` once `limits.connections` are used up.
    pub(crate) fn claim_slot(&self) -> bool {
        let max = u64::from(self.config.limits().connections);
        let claimed = self
            .slots
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                (used < max).then_some(used + 1)
            })
            .is_ok();
        if !claimed {
            self.refused_after_limit.fetch_add(1, Ordering::SeqCst);
            self.hit(LimitKind::Connections);
        }
        claimed
    }

    /// Remembers the first proxy-wide limit reached.
    pub(crate) fn hit(&self, limit: LimitKind) {
        let mut hit = lock(&self.limit_hit);
        if hit.is_none() {
            *hit = Some(limit);
        }
    }

    /// True once the byte budget is spent.
    pub(crate) fn bytes_exhausted(&self) -> bool {
        self.bytes_reserved.load(Ordering::SeqCst) >= self.config.limits().bytes.as_u64()
    }

    /// Reserves up to `want` bytes of the budget; returns how many were granted (0 when it
    /// is spent, which also records the limit as hit).
    pub(crate) fn reserve_bytes(&self, want: u64) -> u64 {
        let max = self.config.limits().bytes.as_u64();
        let mut granted = 0;
        let _ = self
            .bytes_reserved
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                granted = want.min(max.saturating_sub(used));
                Some(used + granted)
            });
        if granted == 0 && want > 0 {
            self.hit(LimitKind::Bytes);
        }
        granted
    }

    /// Gives back reserved bytes that were not used.
    pub(crate) fn refund_bytes(&self, unused: u64) {
        if unused > 0 {
            self.bytes_reserved.fetch_sub(unused, Ordering::SeqCst);
        }
    }

    pub(crate) fn count_connect(&self) {
        self.upstream_connects.fetch_add(1, Ordering::SeqCst);
    }

    fn push(&self, record: ConnectionRecord) {
        self.bytes_up.fetch_add(record.bytes_up, Ordering::SeqCst);
        self.bytes_down
            .fetch_add(record.bytes_down, Ordering::SeqCst);
        lock(&self.records).push(record);
    }

    /// The summary as of now.
    pub(crate) fn summary(&self) -> ProxySummary {
        ProxySummary {
            connections: lock(&self.records).clone(),
            refused_after_limit: self.refused_after_limit.load(Ordering::SeqCst),
            upstream_connects: self.upstream_connects.load(Ordering::SeqCst),
            bytes_up: self.bytes_up.load(Ordering::SeqCst),
            bytes_down: self.bytes_down.load(Ordering::SeqCst),
            limit_hit: *lock(&self.limit_hit),
        }
    }
}

/// Locks a mutex, taking the data even if a panicking thread poisoned it (the data are
/// plain records and counters, valid after any partial update).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Bytes moved on one upstream connection.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
    /// Set when the byte budget refused a read or write of this connection.
    pub(crate) budget_refused: AtomicBool,
}

/// The last time anything moved on a client connection or its upstreams.
#[derive(Debug)]
pub(crate) struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub(crate) fn new(epoch: Instant) -> Self {
        let now = duration_ms(epoch.elapsed());
        Self {
            epoch,
            last_ms: AtomicU64::new(now),
        }
    }

    pub(crate) fn touch(&self) {
        self.last_ms
            .store(duration_ms(self.epoch.elapsed()), Ordering::Relaxed);
    }

    /// Resolves once nothing has moved for `timeout`.
    pub(crate) async fn idle(&self, timeout: Duration) {
        let timeout_ms = duration_ms(timeout);
        loop {
            let deadline = self
                .last_ms
                .load(Ordering::Relaxed)
                .saturating_add(timeout_ms);
            let now = duration_ms(self.epoch.elapsed());
            if now >= deadline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(deadline - now)).await;
        }
    }
}

/// Set when a client connection is cut by a limit while requests may be in flight, so
/// that their records name the limit even if their own tasks end quietly.
#[derive(Debug, Default)]
pub(crate) struct Cut(Mutex<Option<LimitKind>>);

impl Cut {
    pub(crate) fn set(&self, limit: LimitKind) {
        lock(&self.0).get_or_insert(limit);
    }

    fn get(&self) -> Option<LimitKind> {
        *lock(&self.0)
    }
}

/// A request or tunnel in flight. Its record is written when the last owner drops it, so
/// a connection cut by shutdown, a client going away or a timeout is still recorded.
pub(crate) struct InFlight {
    shared: Arc<Shared>,
    started: Instant,
    record: Mutex<ConnectionRecord>,
    counters: Arc<Counters>,
    finished: AtomicBool,
    cut: Option<Arc<Cut>>,
    /// Keeps `shutdown` waiting until this record is written (fields drop after `drop`).
    _drain: Option<mpsc::Sender<()>>,
}

impl InFlight {
    pub(crate) fn new(shared: Arc<Shared>, method: String, cut: Option<Arc<Cut>>) -> Arc<Self> {
        let record = ConnectionRecord::new(method, shared.now_ms());
        Arc::new(Self {
            started: Instant::now(),
            record: Mutex::new(record),
            counters: Arc::new(Counters::default()),
            finished: AtomicBool::new(false),
            cut,
            _drain: shared.drain_token(),
            shared,
        })
    }

    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// Changes the record.
    pub(crate) fn update(&self, change: impl FnOnce(&mut ConnectionRecord)) {
        change(&mut lock(&self.record));
    }

    /// Sets the target.
    pub(crate) fn target(&self, host: &str, port: u16) {
        let mut host = host.to_owned();
        if host.len() > RECORD_HOST_MAX_BYTES {
            let mut cut = RECORD_HOST_MAX_BYTES;
            while !host.is_char_boundary(cut) {
                cut -= 1;
            }
            host.truncate(cut);
        }
        self.update(|r| {
            r.host = host;
            r.port = port;
        });
    }

    /// Records the request's path (package hosts only), without its query, bounded.
    pub(crate) fn path(&self, path: &str) {
        let mut path = path.split('?').next().unwrap_or_default().to_owned();
        if path.len() > RECORD_PATH_MAX_BYTES {
            let mut cut = RECORD_PATH_MAX_BYTES;
            while !path.is_char_boundary(cut) {
                cut -= 1;
            }
            path.truncate(cut);
        }
        self.update(|r| r.path = Some(path));
    }

    /// Marks the record denied.
    pub(crate) fn deny(&self, reason: &str, status: u16, limit: Option<LimitKind>) {
        self.update(|r| {
            r.verdict = Verdict::Denied {
                reason: reason.to_owned(),
            };
            r.status = Some(status);
            r.limit = limit;
        });
        self.finish();
    }

    /// Records an error, keeping the first one.
    pub(crate) fn fail(&self, error: String, limit: Option<LimitKind>) {
        self.update(|r| {
            if r.error.is_none() {
                r.error = Some(error);
            }
            if r.limit.is_none() {
                r.limit = limit;
            }
        });
    }

    /// Marks the request or tunnel as having ended normally.
    pub(crate) fn finish(&self) {
        self.finished.store(true, Ordering::SeqCst);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut record = std::mem::replace(
            &mut *lock(&self.record),
            ConnectionRecord::new(String::new(), 0),
        );
        record.bytes_up = self.counters.up.load(Ordering::SeqCst);
        record.bytes_down = self.counters.down.load(Ordering::SeqCst);
        record.duration_ms = duration_ms(self.started.elapsed());
        if self.counters.budget_refused.load(Ordering::SeqCst) {
            record.limit.get_or_insert(LimitKind::Bytes);
            record
                .error
                .get_or_insert_with(|| "byte limit reached".to_owned());
        }
        if record.error.is_none()
            && let Some(limit) = self.cut.as_ref().and_then(|cut| cut.get())
        {
            record.error = Some(limit.to_string());
            record.limit.get_or_insert(limit);
        }
        if !self.finished.load(Ordering::SeqCst) && record.error.is_none() {
            record.error = Some(if *self.shared.stop.borrow() {
                "proxy shut down".to_owned()
            } else {
                "interrupted".to_owned()
            });
        }
        tracing::debug!(
            method = %record.method,
            host = %record.host,
            port = record.port,
            allowed = record.verdict == Verdict::Allowed,
            bytes_up = record.bytes_up,
            bytes_down = record.bytes_down,
            "proxy connection ended"
        );
        self.shared.push(record);
    }
}
