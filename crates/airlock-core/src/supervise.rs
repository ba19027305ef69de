//! The supervision core (DESIGN S7, S8): the one place where a job's output is capped, its
//! flood limit trips, kept output is streamed to a tap, its wall time runs out and the
//! decision to kill it is taken. Every backend runs its jobs through [`supervise`]; a
//! backend supplies only how bytes arrive ([`OutputSource`]: pipes, an attach stream, a log
//! stream) and how its sandbox ends and is killed ([`Sandbox`]: a helper process and its
//! cgroup, a container, a Pod).
//!
//! How a supervised job can end, and what each means:
//! - **ended**: the sandbox reported the job over (its own exit, or a kill taking effect);
//!   [`Supervised::exit`] holds what the backend read of it.
//! - **killed for wall time** ([`LimitHit::Timeout`]): the deadline (`started_at` plus the
//!   timeout) passed while the job ran. The kill starts then, and the job's wall time ends
//!   there, however long the sandbox then takes to stop.
//! - **flood** ([`LimitHit::OutputFlood`]): both streams together passed the flood limit.
//!   A job still running is killed at that moment; one that had already ended is not, but
//!   it did write more than the limit, so the flood is reported all the same (whether the
//!   end or the backlog was read first must not change the outcome).
//! - **cancelled**: the caller dropped the future (a client gone, airlock interrupted).
//!   Nothing is returned; the core holds no task of its own, so reading stops at once and
//!   a kill request in flight is dropped with it; the backend's guard, dropped with the
//!   future, kills and removes the sandbox.
//!
//! After a kill, output is read (and, past the caps, only counted) until the sandbox has
//! stopped: a producer that blocks while nobody reads (the Docker daemon delivering an
//! attach stream) would otherwise never stop, and its kill request with it.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::backend::{OutputTap, StreamKind};
use crate::capture::{BoundedCapture, CapturedOutput};
use crate::job::JobSpec;
use crate::observation::LimitHit;
use crate::policy::Limits;
use crate::units::ByteSize;

/// Bytes read from a pipe at a time ([`PipeSource`]); also its buffer per stream.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

/// A cap in bytes as a length: a cap beyond the address space keeps everything there is.
pub fn cap_bytes(size: ByteSize) -> usize {
    usize::try_from(size.as_u64()).unwrap_or(usize::MAX)
}

/// A job's output as it is read: both streams' bounded captures, the flood limit over
/// their total, and the tap that sees what is kept as it arrives.
pub struct JobOutput {
    stdout: BoundedCapture,
    stderr: BoundedCapture,
    flood_limit: u64,
    flooded: bool,
    tap: Option<OutputTap>,
}

impl std::fmt::Debug for JobOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobOutput")
            .field("stdout", &self.stdout.total())
            .field("stderr", &self.stderr.total())
            .field("flood_limit", &self.flood_limit)
            .field("flooded", &self.flooded)
            .field("tap", &self.tap.is_some())
            .finish()
    }
}

impl JobOutput {
    /// The output of a job with `limits`, streamed to `tap` if there is one.
    pub fn new(limits: &Limits, tap: Option<OutputTap>) -> Self {
        Self::with_caps(
            cap_bytes(limits.stdout),
            cap_bytes(limits.stderr),
            limits.flood.as_u64(),
            tap,
        )
    }

    /// The output with these caps (stdout and stderr bytes shown, the flood limit).
    pub fn with_caps(
        stdout_cap: usize,
        stderr_cap: usize,
        flood_limit: u64,
        tap: Option<OutputTap>,
    ) -> Self {
        Self {
            stdout: BoundedCapture::new(stdout_cap),
            stderr: BoundedCapture::new(stderr_cap),
            flood_limit,
            flooded: false,
            tap,
        }
    }

    /// Records a chunk of one stream. True the one time the total of both streams passes
    /// the flood limit.
    #[must_use]
    pub fn push(&mut self, stream: StreamKind, bytes: &[u8]) -> bool {
        let capture = match stream {
            StreamKind::Stdout => &mut self.stdout,
            StreamKind::Stderr => &mut self.stderr,
        };
        if let Some(tap) = &self.tap {
            // Only what the observation keeps is streamed (the cap plus the lookahead
            // redaction needs; the engine cuts the stream back to the cap), so a flood
            // never reaches a client either.
            let room = capture
                .keep()
                .saturating_sub(usize::try_from(capture.total()).unwrap_or(usize::MAX));
            if room > 0 {
                tap(stream, &bytes[..bytes.len().min(room)]);
            }
        }
        // Past the caps only counted, so draining a killed job's backlog costs no memory.
        capture.push(bytes);
        if !self.flooded && self.total() > self.flood_limit {
            self.flooded = true;
            return true;
        }
        false
    }

    /// Bytes of both streams so far.
    pub fn total(&self) -> u64 {
        self.stdout.total().saturating_add(self.stderr.total())
    }

    /// Whether the total has passed the flood limit.
    pub fn flooded(&self) -> bool {
        self.flooded
    }

    /// What was kept of stdout and of stderr.
    pub fn finish(self) -> (CapturedOutput, CapturedOutput) {
        (self.stdout.finish(), self.stderr.finish())
    }
}

/// A chunk of output: which stream, and its bytes.
pub type Chunk = (StreamKind, Vec<u8>);

/// How a backend's output arrives.
pub trait OutputSource<E>: Send {
    /// The next chunk of either stream, or `None` once every stream has ended. A stream
    /// that fails ends (the backend logs why); an `Err` fails the job.
    ///
    /// Cancel-safe: [`supervise`] drops the future when something else happens first and
    /// calls again, so no byte may be lost in between.
    fn next_chunk(&mut self) -> impl Future<Output = Result<Option<Chunk>, E>> + Send;
}

/// A kill under way: polled by [`supervise`] while it keeps reading output, never awaited
/// on its own (the sandbox may not answer it until its output has been taken).
pub type KillRequest = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What killing a sandbox takes.
pub enum Kill {
    /// The kill has started; the sandbox should report its end within `grace`, after which
    /// it is given up on (and the caller's teardown removes it).
    Started {
        /// The request, run to its end alongside the reading.
        request: KillRequest,
        /// How long the sandbox may take to stop.
        grace: Duration,
    },
    /// The sandbox is killed when supervision returns, by the caller's teardown (deleting
    /// a Pod ends its containers and its log stream): supervision ends at once.
    OnReturn,
}

impl std::fmt::Debug for Kill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kill::Started { grace, .. } => f.debug_struct("Started").field("grace", grace).finish(),
            Kill::OnReturn => f.write_str("OnReturn"),
        }
    }
}

impl Kill {
    /// A kill that is already sent (a signal), given `grace` to take effect.
    pub fn sent(grace: Duration) -> Self {
        Kill::Started {
            request: Box::pin(std::future::ready(())),
            grace,
        }
    }
}

/// How a backend's sandbox ends and is killed.
pub trait Sandbox: Send {
    /// What the backend learns of a job's end (an exit status, a Pod's state).
    type Exit: Send;
    /// The backend's failure.
    type Error: Send;

    /// Resolves once the job has ended; an `Err` fails the job.
    ///
    /// Cancel-safe: [`supervise`] drops the future when something else happens first and
    /// calls again.
    fn wait(&mut self) -> impl Future<Output = Result<Self::Exit, Self::Error>> + Send;

    /// Starts killing the job, without waiting for it (called at most once).
    fn kill(&mut self) -> Kill;
}

/// The clock of one job.
#[derive(Debug, Clone, Copy)]
pub struct Supervision<'a> {
    /// The job, for the log.
    pub job_id: &'a str,
    /// When the job's wall time started (its program started, or a warm sandbox got it).
    pub started_at: Instant,
    /// Its wall time.
    pub timeout: Duration,
    /// How long the output may take to end once the sandbox stopped.
    pub drain_timeout: Duration,
}

impl<'a> Supervision<'a> {
    /// The clock of `job`, whose wall time started at `started_at`.
    pub fn of(job: &'a JobSpec, started_at: std::time::Instant, drain_timeout: Duration) -> Self {
        Self {
            job_id: job.id.as_str(),
            started_at: Instant::from_std(started_at),
            timeout: job.limits.timeout,
            drain_timeout,
        }
    }
}

/// What [`supervise`] saw of a job.
#[derive(Debug)]
pub struct Supervised<X> {
    /// What the sandbox reported of its end; `None` when it was not seen to end (killed
    /// with [`Kill::OnReturn`], or given up on after the kill's grace).
    pub exit: Option<X>,
    /// The limit that ended it.
    pub limit_hit: Option<LimitHit>,
    /// Its wall time: from `started_at` to its end, or to the kill.
    pub duration: Duration,
    /// Kept stdout.
    pub stdout: CapturedOutput,
    /// Kept stderr.
    pub stderr: CapturedOutput,
}

/// Runs a started job to its end against its wall time and its flood limit: reads every
/// chunk of `source` into `output`, kills `sandbox` when a limit is hit, and returns once
/// the sandbox has stopped and its output has ended (or given up on, each after its
/// grace).
pub async fn supervise<S, O>(
    clock: Supervision<'_>,
    mut sandbox: S,
    mut source: O,
    mut output: JobOutput,
) -> Result<Supervised<S::Exit>, S::Error>
where
    S: Sandbox,
    O: OutputSource<S::Error>,
{
    let deadline = clock.started_at + clock.timeout;
    let mut state = State {
        limit_hit: None,
        exit: None,
        stopped: false,
        output_done: false,
        ended_at: None,
        kill: None,
        kill_deadline: None,
        drain_deadline: None,
    };
    // One timer for the whole run, not one per chunk read.
    let wall_clock = tokio::time::sleep_until(deadline);
    tokio::pin!(wall_clock);
    while !(state.stopped && state.output_done) {
        tokio::select! {
            // Timers first: however fast output arrives, a limit is noticed on time.
            biased;
            () = sleep_until_some(state.drain_deadline), if !state.output_done => {
                tracing::warn!(job_id = clock.job_id, "output still open after the sandbox stopped");
                state.output_done = true;
            }
            () = sleep_until_some(state.kill_deadline), if !state.stopped => {
                tracing::warn!(job_id = clock.job_id, "sandbox still running after the kill; giving up on it");
                state.stopped = true;
                state.output_done = true;
            }
            () = &mut wall_clock, if state.limit_hit.is_none() && !state.stopped => {
                state.limit(LimitHit::Timeout, &mut sandbox);
            }
            () = run_kill(&mut state.kill), if state.kill.is_some() => {
                state.kill = None;
            }
            ended = sandbox.wait(), if !state.stopped => {
                let now = Instant::now();
                state.exit = Some(ended?);
                state.stopped = true;
                state.ended_at.get_or_insert(now);
                state.drain_deadline = Some(now + clock.drain_timeout);
            }
            chunk = source.next_chunk(), if !state.output_done => match chunk? {
                Some((stream, bytes)) => {
                    if output.push(stream, &bytes) && state.limit_hit.is_none() {
                        state.limit(LimitHit::OutputFlood, &mut sandbox);
                    }
                }
                None => state.output_done = true,
            },
        }
    }
    let (stdout, stderr) = output.finish();
    Ok(Supervised {
        exit: state.exit,
        limit_hit: state.limit_hit,
        duration: state
            .ended_at
            .unwrap_or_else(Instant::now)
            .saturating_duration_since(clock.started_at),
        stdout,
        stderr,
    })
}

/// Where [`supervise`] is.
struct State<X> {
    limit_hit: Option<LimitHit>,
    exit: Option<X>,
    /// The sandbox's end was seen, or given up on.
    stopped: bool,
    output_done: bool,
    /// When the job's wall time ended: its end, or the kill.
    ended_at: Option<Instant>,
    kill: Option<KillRequest>,
    kill_deadline: Option<Instant>,
    drain_deadline: Option<Instant>,
}

impl<X> State<X> {
    /// `hit` was hit: recorded, and the job killed if it still runs.
    fn limit<S: Sandbox>(&mut self, hit: LimitHit, sandbox: &mut S) {
        self.limit_hit = Some(hit);
        if self.stopped {
            return;
        }
        let now = Instant::now();
        self.ended_at = Some(now);
        match sandbox.kill() {
            Kill::Started { request, grace } => {
                self.kill = Some(request);
                self.kill_deadline = Some(now + grace);
            }
            Kill::OnReturn => {
                self.stopped = true;
                self.output_done = true;
            }
        }
    }
}

/// Sleeps until `at`, or forever.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Runs the request in `slot` to its end (`slot` is `Some`: the branch is guarded).
async fn run_kill(slot: &mut Option<KillRequest>) {
    if let Some(request) = slot {
        request.await;
    }
}

/// Output read from two byte streams (a process's stdout and stderr pipes) at once. A
/// stream that fails to read ends.
#[derive(Debug)]
pub struct PipeSource<R> {
    stdout: Option<R>,
    stderr: Option<R>,
    stdout_buffer: Vec<u8>,
    stderr_buffer: Vec<u8>,
}

impl<R: AsyncRead + Unpin + Send> PipeSource<R> {
    /// Reads `stdout` and `stderr`.
    pub fn new(stdout: R, stderr: R) -> Self {
        Self {
            stdout: Some(stdout),
            stderr: Some(stderr),
            stdout_buffer: vec![0; READ_CHUNK_BYTES],
            stderr_buffer: vec![0; READ_CHUNK_BYTES],
        }
    }
}

/// Reads once from `stream` (pending forever once it has ended).
async fn read_some<R: AsyncRead + Unpin>(
    stream: &mut Option<R>,
    buffer: &mut [u8],
) -> Option<usize> {
    match stream {
        Some(reader) => match reader.read(buffer).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

impl<R: AsyncRead + Unpin + Send, E: Send> OutputSource<E> for PipeSource<R> {
    async fn next_chunk(&mut self) -> Result<Option<Chunk>, E> {
        // A read is cancel-safe: dropped before it completes, it has taken no bytes.
        while self.stdout.is_some() || self.stderr.is_some() {
            let (stream, read) = tokio::select! {
                read = read_some(&mut self.stdout, &mut self.stdout_buffer) => (StreamKind::Stdout, read),
                read = read_some(&mut self.stderr, &mut self.stderr_buffer) => (StreamKind::Stderr, read),
            };
            let (slot, buffer) = match stream {
                StreamKind::Stdout => (&mut self.stdout, &self.stdout_buffer),
                StreamKind::Stderr => (&mut self.stderr, &self.stderr_buffer),
            };
            match read {
                Some(n) => return Ok(Some((stream, buffer[..n].to_vec()))),
                None => *slot = None,
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::REDACTION_LOOKAHEAD_BYTES;
    use pretty_assertions::assert_eq;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use tokio::io::{AsyncWriteExt, DuplexStream};
    use tokio::sync::watch;

    // Real time (tokio's paused clock needs its test-util feature, which would rebuild
    // every crate of the workspace with another tokio): short, and checked with room.
    const TIMEOUT: Duration = Duration::from_millis(600);
    const GRACE: Duration = Duration::from_millis(900);
    const DRAIN: Duration = Duration::from_millis(400);
    /// More than any step of these tests takes on a loaded machine, less than the
    /// differences between the outcomes they tell apart.
    const SLACK: Duration = Duration::from_millis(300);

    /// A fake job: writes to two pipes as `behaviour` says, until it ends or is killed.
    /// It ends (and closes its pipes) when it is done writing, or when the kill reaches it.
    struct FakeJob {
        sandbox: FakeSandbox,
        source: PipeSource<DuplexStream>,
        killed: watch::Sender<bool>,
    }

    #[derive(Clone, Copy)]
    enum Behaviour {
        /// Writes these bytes to stdout and to stderr, then exits.
        Writes(&'static [u8], &'static [u8]),
        /// Writes `chunk` to stdout forever, `pause` apart.
        Floods { chunk: usize, pause: Duration },
        /// Writes nothing and never exits on its own.
        Sleeps,
    }

    #[derive(Clone)]
    struct FakeSandbox {
        ended: watch::Receiver<bool>,
        killed: watch::Sender<bool>,
        kills: Arc<AtomicUsize>,
        /// The kill takes effect (a kill that does not: a sandbox that ignores it).
        kill_works: bool,
        /// The kill request completes only once the job has ended (the Docker daemon
        /// answers a kill only after delivering what the job wrote).
        kill_waits_for_end: bool,
        /// Set when the sandbox is dropped while its job runs: its guard kills it.
        dropped_running: Arc<AtomicBool>,
        kill_style: KillStyle,
    }

    #[derive(Clone, Copy, PartialEq)]
    enum KillStyle {
        Signal,
        OnReturn,
    }

    impl Drop for FakeSandbox {
        fn drop(&mut self) {
            if !*self.ended.borrow() {
                self.dropped_running.store(true, Ordering::SeqCst);
            }
        }
    }

    impl Sandbox for FakeSandbox {
        type Exit = &'static str;
        type Error = Infallible;

        async fn wait(&mut self) -> Result<&'static str, Infallible> {
            let _ = self.ended.wait_for(|ended| *ended).await;
            Ok(if *self.killed.borrow() {
                "killed"
            } else {
                "exited"
            })
        }

        fn kill(&mut self) -> Kill {
            self.kills.fetch_add(1, Ordering::SeqCst);
            if self.kill_style == KillStyle::OnReturn {
                return Kill::OnReturn;
            }
            if self.kill_works {
                self.killed.send_replace(true);
            }
            let mut ended = self.ended.clone();
            let waits = self.kill_waits_for_end;
            Kill::Started {
                request: Box::pin(async move {
                    if waits {
                        let _ = ended.wait_for(|ended| *ended).await;
                    }
                }),
                grace: GRACE,
            }
        }
    }

    /// Starts a fake job writing through pipes of `pipe` bytes.
    fn start(behaviour: Behaviour, pipe: usize) -> FakeJob {
        let (stdout_read, mut stdout_write) = tokio::io::duplex(pipe);
        let (stderr_read, mut stderr_write) = tokio::io::duplex(pipe);
        let (killed, mut killed_rx) = watch::channel(false);
        let (ended_tx, ended) = watch::channel(false);
        tokio::spawn(async move {
            let run = async {
                match behaviour {
                    Behaviour::Writes(out, err) => {
                        let _ = stdout_write.write_all(out).await;
                        let _ = stderr_write.write_all(err).await;
                    }
                    Behaviour::Floods { chunk, pause } => {
                        let bytes = vec![b'x'; chunk];
                        loop {
                            if stdout_write.write_all(&bytes).await.is_err() {
                                break;
                            }
                            tokio::time::sleep(pause).await;
                        }
                    }
                    Behaviour::Sleeps => std::future::pending().await,
                }
            };
            tokio::select! {
                () = run => {}
                _ = killed_rx.wait_for(|killed| *killed) => {}
            }
            drop((stdout_write, stderr_write));
            ended_tx.send_replace(true);
        });
        FakeJob {
            sandbox: FakeSandbox {
                ended,
                killed: killed.clone(),
                kills: Arc::new(AtomicUsize::new(0)),
                kill_works: true,
                kill_waits_for_end: false,
                dropped_running: Arc::new(AtomicBool::new(false)),
                kill_style: KillStyle::Signal,
            },
            source: PipeSource::new(stdout_read, stderr_read),
            killed,
        }
    }

    fn clock(started_at: Instant) -> Supervision<'static> {
        Supervision {
            job_id: "test",
            started_at,
            timeout: TIMEOUT,
            drain_timeout: DRAIN,
        }
    }

    async fn run(job: FakeJob, output: JobOutput) -> (Supervised<&'static str>, FakeSandbox) {
        let sandbox = job.sandbox.clone();
        let supervised = supervise(clock(Instant::now()), job.sandbox, job.source, output)
            .await
            .unwrap_or_else(|never| match never {});
        drop(job.killed);
        (supervised, sandbox)
    }

    #[tokio::test]
    async fn a_job_that_exits_is_read_whole_and_not_killed() {
        let job = start(Behaviour::Writes(b"out", b"err"), 1024);
        let (s, sandbox) = run(job, JobOutput::with_caps(100, 100, 1000, None)).await;
        assert_eq!(s.exit, Some("exited"));
        assert_eq!(s.limit_hit, None);
        assert_eq!(
            s.stdout,
            CapturedOutput {
                cap: 100,
                ..CapturedOutput::whole(b"out")
            }
        );
        assert_eq!(
            s.stderr,
            CapturedOutput {
                cap: 100,
                ..CapturedOutput::whole(b"err")
            }
        );
        assert_eq!(sandbox.kills.load(Ordering::SeqCst), 0);
        assert!(s.duration < SLACK, "{:?}", s.duration);
    }

    #[tokio::test]
    async fn the_deadline_kills_the_job_and_its_wall_time_ends_there() {
        let job = start(Behaviour::Sleeps, 1024);
        let started = Instant::now();
        let (s, sandbox) = run(job, JobOutput::with_caps(100, 100, 1000, None)).await;
        assert_eq!(s.limit_hit, Some(LimitHit::Timeout));
        assert_eq!(s.exit, Some("killed"));
        assert!(
            s.duration >= TIMEOUT && s.duration < TIMEOUT + SLACK,
            "{:?}",
            s.duration
        );
        assert_eq!(sandbox.kills.load(Ordering::SeqCst), 1);
        assert!(
            started.elapsed() < TIMEOUT + SLACK,
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_sandbox_that_ignores_the_kill_is_given_up_on_after_the_grace() {
        let mut job = start(Behaviour::Sleeps, 1024);
        job.sandbox.kill_works = false;
        let started = Instant::now();
        let (s, _) = run(job, JobOutput::with_caps(100, 100, 1000, None)).await;
        assert_eq!(s.limit_hit, Some(LimitHit::Timeout));
        assert_eq!(s.exit, None);
        // The wall time ends at the kill, not when airlock gave up waiting.
        assert!(
            s.duration >= TIMEOUT && s.duration < TIMEOUT + SLACK,
            "{:?}",
            s.duration
        );
        let elapsed = started.elapsed();
        assert!(
            elapsed >= TIMEOUT + GRACE && elapsed < TIMEOUT + GRACE + SLACK,
            "{elapsed:?}"
        );
    }

    #[tokio::test]
    async fn the_flood_limit_kills_at_once_and_counts_every_byte_read() {
        let job = start(
            Behaviour::Floods {
                chunk: 4096,
                pause: Duration::from_millis(1),
            },
            4096,
        );
        let (s, sandbox) = run(job, JobOutput::with_caps(10, 10, 100_000, None)).await;
        assert_eq!(s.limit_hit, Some(LimitHit::OutputFlood));
        assert_eq!(s.exit, Some("killed"));
        assert_eq!(sandbox.kills.load(Ordering::SeqCst), 1);
        // 25 chunks reach 102400 > 100000; the kill lands before the next write.
        assert!(s.stdout.total_bytes > 100_000, "{}", s.stdout.total_bytes);
        assert!(
            s.stdout.total_bytes <= 100_000 + 2 * 4096,
            "{}",
            s.stdout.total_bytes
        );
        assert!(s.stdout.truncated);
        assert!(s.duration < TIMEOUT, "{:?}", s.duration);
    }

    #[tokio::test]
    async fn the_flood_counts_both_streams_together() {
        let job = start(Behaviour::Writes(&[b'o'; 600], &[b'e'; 600]), 1024);
        let (s, _) = run(job, JobOutput::with_caps(10, 10, 1000, None)).await;
        assert_eq!(s.limit_hit, Some(LimitHit::OutputFlood));
        assert_eq!((s.stdout.total_bytes, s.stderr.total_bytes), (600, 600));
    }

    #[tokio::test]
    async fn a_flood_read_after_the_end_is_reported_but_not_killed() {
        let mut out = JobOutput::with_caps(10, 10, 5, None);
        assert!(!out.push(StreamKind::Stdout, b"12345"));
        assert!(out.push(StreamKind::Stderr, b"6"));
        // Only once.
        assert!(!out.push(StreamKind::Stderr, b"7"));
        assert!(out.flooded());
        assert_eq!(out.total(), 7);

        // The job exits (the sandbox says so) before its output is read.
        let job = start(Behaviour::Writes(&[b'o'; 2000], b""), 4096);
        let mut ended = job.sandbox.ended.clone();
        let _ = ended.wait_for(|e| *e).await;
        let (s, sandbox) = run(job, JobOutput::with_caps(10, 10, 1000, None)).await;
        assert_eq!(s.limit_hit, Some(LimitHit::OutputFlood));
        assert_eq!(s.exit, Some("exited"));
        assert_eq!(s.stdout.total_bytes, 2000);
        assert_eq!(sandbox.kills.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn reading_goes_on_while_the_kill_waits_for_the_output_to_be_taken() {
        // The producer blocks on a full pipe until it is read, and the kill request only
        // returns once the job is over: a core that stopped reading while the kill is
        // pending would wait out the grace (the Docker hang of issue 19).
        let mut job = start(
            Behaviour::Floods {
                chunk: 1024,
                pause: Duration::ZERO,
            },
            1024,
        );
        job.sandbox.kill_works = false;
        job.sandbox.kill_waits_for_end = true;
        let output = JobOutput::with_caps(10, 10, 10_000, None);
        let sandbox = job.sandbox.clone();
        let mut source = job.source;
        // The kill takes effect only once 64 KiB past the flood limit were read.
        let counted = CountingSource {
            inner: &mut source,
            seen: 0,
            end_after: 10_000 + 64 * 1024,
            ender: job.killed.clone(),
        };
        let started = Instant::now();
        let s = supervise(clock(started), job.sandbox, counted, output)
            .await
            .unwrap_or_else(|never| match never {});
        assert_eq!(s.limit_hit, Some(LimitHit::OutputFlood));
        assert_eq!(s.exit, Some("killed"), "the job was given up on");
        assert!(s.stdout.total_bytes >= 10_000 + 64 * 1024);
        assert!(started.elapsed() < GRACE, "{:?}", started.elapsed());
        assert_eq!(sandbox.kills.load(Ordering::SeqCst), 1);
    }

    /// Ends the fake job (as a kill taking effect late would) once `end_after` bytes were
    /// read through it.
    struct CountingSource<'a> {
        inner: &'a mut PipeSource<DuplexStream>,
        seen: usize,
        end_after: usize,
        ender: watch::Sender<bool>,
    }

    impl OutputSource<Infallible> for CountingSource<'_> {
        async fn next_chunk(&mut self) -> Result<Option<Chunk>, Infallible> {
            let chunk = OutputSource::<Infallible>::next_chunk(self.inner).await?;
            if let Some((_, bytes)) = &chunk {
                self.seen += bytes.len();
                if self.seen >= self.end_after {
                    self.ender.send_replace(true);
                }
            }
            Ok(chunk)
        }
    }

    #[tokio::test]
    async fn a_kill_on_return_ends_supervision_at_the_limit() {
        let mut job = start(
            Behaviour::Floods {
                chunk: 1000,
                pause: Duration::from_millis(1),
            },
            1024,
        );
        job.sandbox.kill_style = KillStyle::OnReturn;
        let (s, sandbox) = run(job, JobOutput::with_caps(10, 10, 5000, None)).await;
        assert_eq!(s.limit_hit, Some(LimitHit::OutputFlood));
        assert_eq!(s.exit, None);
        // Nothing read past the chunk that passed the limit.
        assert_eq!(s.stdout.total_bytes, 6000);
        assert_eq!(sandbox.kills.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn output_that_outlives_the_sandbox_is_cut_after_the_drain_timeout() {
        let (stdout_read, mut stdout_write) = tokio::io::duplex(64);
        let (stderr_read, _stderr_write) = tokio::io::duplex(64);
        stdout_write.write_all(b"left").await.unwrap_or(());
        let (_ended_tx, ended) = watch::channel(true);
        let (killed, _) = watch::channel(false);
        let sandbox = FakeSandbox {
            ended,
            killed,
            kills: Arc::new(AtomicUsize::new(0)),
            kill_works: true,
            kill_waits_for_end: false,
            dropped_running: Arc::new(AtomicBool::new(false)),
            kill_style: KillStyle::Signal,
        };
        let started = Instant::now();
        let s = supervise(
            clock(started),
            sandbox,
            PipeSource::new(stdout_read, stderr_read),
            JobOutput::with_caps(100, 100, 1000, None),
        )
        .await
        .unwrap_or_else(|never| match never {});
        assert_eq!(s.exit, Some("exited"));
        assert_eq!(s.stdout.kept, b"left");
        let elapsed = started.elapsed();
        assert!(elapsed >= DRAIN && elapsed < DRAIN + SLACK, "{elapsed:?}");
        assert!(s.duration < SLACK, "{:?}", s.duration);
    }

    #[tokio::test]
    async fn captures_stay_bounded_and_the_tap_sees_only_what_is_kept() {
        let tapped = Arc::new(Mutex::new(Vec::<(StreamKind, Vec<u8>)>::new()));
        let sink = tapped.clone();
        let tap: OutputTap = Arc::new(move |stream, bytes: &[u8]| {
            if let Ok(mut seen) = sink.lock() {
                seen.push((stream, bytes.to_vec()));
            }
        });
        let job = start(
            Behaviour::Floods {
                chunk: 3000,
                pause: Duration::from_millis(1),
            },
            4096,
        );
        let cap = 10;
        let (s, _) = run(job, JobOutput::with_caps(cap, cap, 100_000, Some(tap))).await;
        let keep = cap + REDACTION_LOOKAHEAD_BYTES;
        assert_eq!(s.stdout.kept.len(), keep);
        assert!(s.stdout.total_bytes > 100_000);
        let tapped = tapped.lock().map(|t| t.clone()).unwrap_or_default();
        let streamed: Vec<u8> = tapped.iter().flat_map(|(_, b)| b.clone()).collect();
        assert!(
            tapped
                .iter()
                .all(|(stream, _)| *stream == StreamKind::Stdout)
        );
        assert_eq!(streamed, s.stdout.kept);
    }

    #[tokio::test]
    async fn a_dropped_supervision_stops_reading_and_drops_the_sandbox_at_once() {
        let job = start(
            Behaviour::Floods {
                chunk: 1000,
                pause: Duration::from_millis(10),
            },
            1024,
        );
        let dropped = job.sandbox.dropped_running.clone();
        let kills = job.sandbox.kills.clone();
        let mut ended = job.sandbox.ended.clone();
        let supervision = supervise(
            clock(Instant::now()),
            job.sandbox,
            job.source,
            JobOutput::with_caps(10, 10, u64::MAX, None),
        );
        // The caller gives up before any limit.
        let given_up = tokio::time::timeout(TIMEOUT / 3, supervision).await;
        assert!(given_up.is_err());
        assert!(
            dropped.load(Ordering::SeqCst),
            "the sandbox's guard was not dropped"
        );
        assert_eq!(kills.load(Ordering::SeqCst), 0, "cancelling is not a limit");
        // The reader is gone: the job's next write fails and it ends.
        let _ = ended.wait_for(|e| *e).await;
        drop(job.killed);
    }
}
