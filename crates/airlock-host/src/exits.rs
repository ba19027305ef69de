//! Exit statuses from the kernel's process events (the proc connector,
//! `NETLINK_CONNECTOR`): how airlock learns that a process it is not the parent of (a
//! container's first process, whose parent is its engine's shim) has ended, and how, the
//! moment it has, without waiting for the engine to handle the exit.
//!
//! The kernel sends an event for every fork and every thread's exit of the host, with the
//! exiting thread's exit code (a wait status), to the sockets that subscribed. Subscribing
//! takes `CAP_NET_ADMIN` in the initial user namespace, and the events reach only sockets
//! of the initial network namespace: [`ExitEvents::shared`] checks both once per process
//! (the kernel's acknowledgement must come back) and says why not when they fail. One
//! socket per process, read by a thread of its own.
//!
//! A status is given only when it is the one the process's parent reaps. That is the
//! leading thread's exit code when the process had a single thread, which holds if it had
//! one when it was watched and no fork of a thread of it was seen before the leader's exit:
//! its first new thread can only be made by that one thread, and so is announced on the
//! socket before that thread's own exit. A process with more threads (its leader can exit
//! on its own while another thread later ends the process another way) gets
//! [`ProcessEnd::Unknown`], as does one whose events may have been lost (the socket's
//! buffer overflowed): the caller asks the process's parent then.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use airlock_core::Termination;
use rustix::io::Errno;
use rustix::net::netlink::SocketAddrNetlink;
use rustix::net::{AddressFamily, RecvFlags, SendFlags, SocketType, sockopt};
use tokio::sync::Notify;

/// The connector's index and value of the process events (`CN_IDX_PROC`, `CN_VAL_PROC`);
/// the index is also the multicast group.
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
/// `PROC_CN_MCAST_LISTEN`. The subscription lasts as long as the process (it is
/// [`ExitEvents::shared`]), so it is never dropped.
const MCAST_LISTEN: u32 = 1;
/// `NLMSG_DONE`: every connector message is one.
const NLMSG_DONE: u16 = 3;
/// `struct proc_event`'s `what`.
const PROC_EVENT_NONE: u32 = 0;
const PROC_EVENT_FORK: u32 = 1;
const PROC_EVENT_EXIT: u32 = 0x8000_0000;
/// Offsets in one message: `nlmsghdr` (16 bytes), `cn_msg` (20), then `proc_event`, whose
/// `event_data` starts 16 bytes in (after `what`, `cpu` and the 8-aligned timestamp).
const CN_MSG_AT: usize = 16;
const EVENT_AT: usize = CN_MSG_AT + 20;
const DATA_AT: usize = EVENT_AT + 16;
/// How long the kernel's acknowledgement of the subscription may take.
const ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// The socket's receive buffer: every process of the host forks and exits through it.
const RECEIVE_BUFFER_BYTES: usize = 4 << 20;

/// How a watched process ended, as far as its events tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEnd {
    /// Its wait status, the one its parent reaps.
    Status(i32),
    /// Not known from its events; why.
    Unknown(&'static str),
}

/// How a process with wait status `status` ended (`WIFEXITED`/`WTERMSIG`), as a backend
/// reports it.
pub fn termination(status: i32) -> Termination {
    match status & 0x7f {
        0 => Termination::Exited((status >> 8) & 0xff),
        signal => Termination::Signaled(signal),
    }
}

/// The process events of this host, as one subscribed socket read by a thread.
#[derive(Debug)]
pub struct ExitEvents {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    watched: HashMap<u32, Watched>,
    /// The socket failed for good: every watch from now on is [`ProcessEnd::Unknown`].
    broken: bool,
}

#[derive(Debug)]
struct Watched {
    /// The leader's exit code, once its exit was seen.
    status: Option<i32>,
    /// It had, or made, another thread.
    threaded: bool,
    /// Events may have been missed while it was watched.
    lost: bool,
    notify: Arc<Notify>,
}

impl ExitEvents {
    /// This process's subscription, made the first time it is asked for; the reason it
    /// could not be made, every time, otherwise.
    pub fn shared() -> Result<Arc<ExitEvents>, String> {
        static SHARED: OnceLock<Result<Arc<ExitEvents>, String>> = OnceLock::new();
        SHARED.get_or_init(Self::subscribe).clone()
    }

    fn subscribe() -> Result<Arc<ExitEvents>, String> {
        let socket = rustix::net::socket(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            Some(rustix::net::netlink::CONNECTOR),
        )
        .map_err(|e| format!("open a process-events socket: {e}"))?;
        rustix::net::bind(&socket, &SocketAddrNetlink::new(0, CN_IDX_PROC)).map_err(|e| {
            if e == Errno::PERM {
                "the process events need CAP_NET_ADMIN in the host's user namespace (airlock as root)".to_owned()
            } else {
                format!("join the process-events group: {e}")
            }
        })?;
        // Only honoured with CAP_NET_ADMIN, which binding needed anyway; a smaller buffer
        // only makes an overflow (and the engine's answer) likelier.
        let _ = sockopt::set_socket_recv_buffer_size_force(&socket, RECEIVE_BUFFER_BYTES);
        send_op(&socket, MCAST_LISTEN).map_err(|e| format!("subscribe to process events: {e}"))?;
        wait_for_ack(&socket)?;
        let events = Arc::new(ExitEvents {
            table: Mutex::new(Table::default()),
        });
        let reader = events.clone();
        std::thread::Builder::new()
            .name("airlock-exits".into())
            .spawn(move || read_events(&socket, &reader))
            .map_err(|e| format!("start the process-events thread: {e}"))?;
        Ok(events)
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches process `pid` (a process's id, its leader's) from now on. Call it while the
    /// process is known to run (a pidfd of it not yet readable): an exit before this call
    /// is not seen, and [`ExitWatch::ended`] would wait for it.
    pub fn watch(self: &Arc<Self>, pid: u32) -> ExitWatch {
        let notify = Arc::new(Notify::new());
        {
            let mut table = self.table();
            let broken = table.broken;
            table.watched.insert(
                pid,
                Watched {
                    status: None,
                    threaded: false,
                    lost: broken,
                    notify: notify.clone(),
                },
            );
        }
        // Read after the registration: a thread made since is announced on the socket.
        let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map(Iterator::count);
        if threads.map_or(true, |n| n != 1) {
            let mut table = self.table();
            if let Some(watched) = table.watched.get_mut(&pid) {
                watched.threaded = true;
            }
        }
        ExitWatch {
            events: self.clone(),
            pid,
            notify,
        }
    }

    /// Applies one message of the socket.
    fn apply(&self, message: &[u8]) {
        let Some(event) = Event::parse(message) else {
            return;
        };
        let mut table = self.table();
        match event {
            Event::Exit {
                pid,
                tgid,
                exit_code,
            } => {
                if let Some(watched) = table.watched.get_mut(&tgid) {
                    if pid == tgid {
                        watched.status = Some(exit_code);
                        watched.notify.notify_one();
                    } else {
                        watched.threaded = true;
                    }
                }
            }
            Event::ThreadMade { tgid } => {
                if let Some(watched) = table.watched.get_mut(&tgid) {
                    watched.threaded = true;
                }
            }
        }
    }

    /// Events were lost (`broken`: and will be): every watch gives up on its status.
    fn lose(&self, broken: bool) {
        let mut table = self.table();
        table.broken |= broken;
        for watched in table.watched.values_mut() {
            watched.lost = true;
            watched.notify.notify_one();
        }
    }
}

/// One process watched for its exit; stops watching when dropped.
#[derive(Debug)]
pub struct ExitWatch {
    events: Arc<ExitEvents>,
    pid: u32,
    notify: Arc<Notify>,
}

impl ExitWatch {
    /// Resolves once the process's leader has exited (or its events were lost). Call it
    /// once its pidfd is readable (every thread of it gone): the leader's event is sent
    /// right after that, if not before.
    pub async fn ended(&self) -> ProcessEnd {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(end) = self.end() {
                return end;
            }
            notified.await;
        }
    }

    /// What is known of its end now.
    fn end(&self) -> Option<ProcessEnd> {
        let table = self.events.table();
        let watched = table.watched.get(&self.pid)?;
        if watched.lost {
            return Some(ProcessEnd::Unknown("process events were lost"));
        }
        let status = watched.status?;
        Some(if watched.threaded {
            ProcessEnd::Unknown("it had more than one thread")
        } else {
            ProcessEnd::Status(status)
        })
    }
}

impl Drop for ExitWatch {
    fn drop(&mut self) {
        let mut table = self.events.table();
        if table
            .watched
            .get(&self.pid)
            .is_some_and(|w| Arc::ptr_eq(&w.notify, &self.notify))
        {
            table.watched.remove(&self.pid);
        }
    }
}

/// The events that matter here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// Thread `pid` of process `tgid` exited with `exit_code`.
    Exit { pid: u32, tgid: u32, exit_code: i32 },
    /// A new thread of process `tgid` (not a new process).
    ThreadMade { tgid: u32 },
}

impl Event {
    /// One netlink message of the connector; `None` for anything else.
    fn parse(message: &[u8]) -> Option<Event> {
        let u32_at = |at| u32_at(message, at);
        if u32_at(CN_MSG_AT)? != CN_IDX_PROC || u32_at(CN_MSG_AT + 4)? != CN_VAL_PROC {
            return None;
        }
        match u32_at(EVENT_AT)? {
            PROC_EVENT_EXIT => Some(Event::Exit {
                pid: u32_at(DATA_AT)?,
                tgid: u32_at(DATA_AT + 4)?,
                exit_code: u32_at(DATA_AT + 8)? as i32,
            }),
            PROC_EVENT_FORK => {
                let (child_pid, child_tgid) = (u32_at(DATA_AT + 8)?, u32_at(DATA_AT + 12)?);
                (child_pid != child_tgid).then_some(Event::ThreadMade { tgid: child_tgid })
            }
            _ => None,
        }
    }
}

/// The native-endian word at `at` of a message.
fn u32_at(message: &[u8], at: usize) -> Option<u32> {
    let bytes = message.get(at..at.checked_add(4)?)?;
    Some(u32::from_ne_bytes(bytes.try_into().ok()?))
}

/// The netlink messages of one datagram.
fn messages(datagram: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = datagram;
    std::iter::from_fn(move || {
        let length = u32_at(rest, 0)? as usize;
        if length < 16 || length > rest.len() {
            return None;
        }
        let (message, tail) = rest.split_at(length);
        rest = tail
            .get(length.next_multiple_of(4) - length..)
            .unwrap_or(&[]);
        Some(message)
    })
}

/// Sends a multicast operation to the connector.
fn send_op(socket: &OwnedFd, op: u32) -> io::Result<()> {
    let mut message = Vec::with_capacity(EVENT_AT + 4);
    message.extend_from_slice(&((EVENT_AT + 4) as u32).to_ne_bytes());
    message.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
    message.extend_from_slice(&0u16.to_ne_bytes()); // flags
    message.extend_from_slice(&0u32.to_ne_bytes()); // sequence
    message.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel's is 0
    message.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
    message.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
    message.extend_from_slice(&0u32.to_ne_bytes()); // sequence
    message.extend_from_slice(&0u32.to_ne_bytes()); // ack
    message.extend_from_slice(&4u16.to_ne_bytes()); // length of the data
    message.extend_from_slice(&0u16.to_ne_bytes()); // flags
    message.extend_from_slice(&op.to_ne_bytes());
    rustix::net::sendto(
        socket,
        &message,
        SendFlags::empty(),
        &SocketAddrNetlink::new(0, 0),
    )?;
    Ok(())
}

/// Waits for the kernel's acknowledgement of the subscription (`PROC_EVENT_NONE`): it
/// comes back only if events reach this socket at all (not from another network
/// namespace), and carries the kernel's refusal if there was one.
fn wait_for_ack(socket: &OwnedFd) -> Result<(), String> {
    sockopt::set_socket_timeout(
        socket,
        sockopt::Timeout::Recv,
        Some(Duration::from_millis(100)),
    )
    .map_err(|e| format!("set a receive timeout on the process-events socket: {e}"))?;
    let deadline = Instant::now() + ACK_TIMEOUT;
    let mut buffer = vec![0u8; 64 << 10];
    while Instant::now() < deadline {
        let n = match rustix::net::recv(socket, &mut buffer[..], RecvFlags::empty()) {
            Ok((n, _)) => n,
            Err(Errno::AGAIN | Errno::INTR | Errno::NOBUFS) => continue,
            Err(e) => return Err(format!("read the process-events socket: {e}")),
        };
        for message in messages(&buffer[..n]) {
            let u32_at = |at| u32_at(message, at);
            if u32_at(CN_MSG_AT) == Some(CN_IDX_PROC) && u32_at(EVENT_AT) == Some(PROC_EVENT_NONE) {
                return match u32_at(DATA_AT) {
                    Some(0) => sockopt::set_socket_timeout(socket, sockopt::Timeout::Recv, None)
                        .map_err(|e| format!("clear the receive timeout: {e}")),
                    Some(err) => Err(format!(
                        "the kernel refused the process-events subscription: {}",
                        io::Error::from_raw_os_error(err as i32)
                    )),
                    None => Err("a short acknowledgement from the kernel".to_owned()),
                };
            }
        }
    }
    Err(format!(
        "the kernel did not acknowledge the process-events subscription within {ACK_TIMEOUT:?} (airlock in a network namespace other than the host's?)"
    ))
}

/// The socket's reader: applies every event, for the life of the process.
fn read_events(socket: &OwnedFd, events: &ExitEvents) {
    let mut buffer = vec![0u8; 64 << 10];
    loop {
        match rustix::net::recv(socket, &mut buffer[..], RecvFlags::empty()) {
            Ok((n, _)) => {
                for message in messages(&buffer[..n]) {
                    if message.get(4..6) == Some(&NLMSG_DONE.to_ne_bytes()[..]) {
                        events.apply(message);
                    }
                }
            }
            Err(Errno::INTR | Errno::AGAIN) => {}
            Err(Errno::NOBUFS) => {
                tracing::debug!(
                    "process events overflowed the socket's buffer; the statuses of the processes watched now come from their engines"
                );
                events.lose(false);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the process-events socket failed; exit statuses come from the engines from now on");
                events.lose(true);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::process::{Command, Stdio};

    /// A message of the connector as the kernel sends it: `what` and four words of data.
    fn message(what: u32, data: [u32; 4]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((DATA_AT + 16) as u32).to_ne_bytes());
        m.extend_from_slice(&NLMSG_DONE.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
        m.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
        m.extend_from_slice(&[0; 12]);
        m.extend_from_slice(&what.to_ne_bytes());
        m.extend_from_slice(&[0; 12]);
        for word in data {
            m.extend_from_slice(&word.to_ne_bytes());
        }
        m
    }

    #[test]
    fn exits_and_new_threads_are_read_and_new_processes_are_not_threads() {
        assert_eq!(
            Event::parse(&message(PROC_EVENT_EXIT, [7, 7, 0x300, 17])),
            Some(Event::Exit {
                pid: 7,
                tgid: 7,
                exit_code: 0x300
            })
        );
        assert_eq!(
            Event::parse(&message(PROC_EVENT_FORK, [7, 7, 9, 7])),
            Some(Event::ThreadMade { tgid: 7 })
        );
        assert_eq!(Event::parse(&message(PROC_EVENT_FORK, [7, 7, 9, 9])), None);
        assert_eq!(
            Event::parse(&message(PROC_EVENT_EXIT, [7, 7, 0, 0])[..40]),
            None
        );
        let two: Vec<u8> = [
            message(PROC_EVENT_NONE, [0; 4]),
            message(PROC_EVENT_EXIT, [1, 1, 0, 0]),
        ]
        .concat();
        assert_eq!(messages(&two).count(), 2);
        assert_eq!(termination(0x300), Termination::Exited(3));
        assert_eq!(termination(9), Termination::Signaled(9));
        assert_eq!(termination(0x80 | 11), Termination::Signaled(11));
    }

    /// Skips the calling test (through the testkit: logged, and failed under
    /// `AIRLOCK_REQUIRE_ALL=1`) where this host gives airlock no process events.
    macro_rules! require_events {
        () => {
            let shared = ExitEvents::shared();
            airlock_testkit::require!(shared.is_ok(), shared.err().unwrap_or_default());
        };
    }

    /// Runs `program` in python3 after it reads a line, watched from before that line.
    async fn watched_end(program: &str) -> (ProcessEnd, std::process::ExitStatus) {
        let events = ExitEvents::shared().expect("checked by the caller (require_events)");
        let mut child = Command::new("python3")
            .args([
                "-c",
                &format!("import sys\nsys.stdin.readline()\n{program}"),
            ])
            .stdin(Stdio::piped())
            .spawn()
            .unwrap();
        let watch = events.watch(child.id());
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let end = tokio::time::timeout(Duration::from_secs(20), watch.ended())
            .await
            .expect("the exit's event came");
        (end, child.wait().unwrap())
    }

    #[tokio::test]
    async fn a_single_threaded_processes_status_is_the_one_its_parent_reaps() {
        require_events!();
        use std::os::unix::process::ExitStatusExt;
        for (program, expected) in [
            ("sys.exit(3)", Termination::Exited(3)),
            ("pass", Termination::Exited(0)),
            (
                "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
                Termination::Signaled(9),
            ),
        ] {
            let (end, reaped) = watched_end(program).await;
            let ProcessEnd::Status(status) = end else {
                panic!("{program}: {end:?}");
            };
            assert_eq!(termination(status), expected, "{program}");
            assert_eq!(status, reaped.into_raw(), "{program}");
        }
    }

    #[tokio::test]
    async fn a_process_with_another_thread_gets_no_status_from_its_events() {
        require_events!();
        // The leader exits on its own (SYS_exit, 60 on x86-64, 93 on arm64), leaving a
        // thread that ends the process with another status: the leader's exit code is not
        // what the parent reaps.
        let program = "import ctypes, os, threading, time\n\
                       threading.Thread(target=lambda: (time.sleep(0.3), os._exit(5))).start()\n\
                       import platform\n\
                       ctypes.CDLL(None).syscall(93 if platform.machine() == 'aarch64' else 60, 0)";
        let (end, reaped) = watched_end(program).await;
        assert_eq!(reaped.code(), Some(5));
        assert_eq!(end, ProcessEnd::Unknown("it had more than one thread"));
        let (end, _) =
            watched_end("import threading\nthreading.Thread(target=print).start()").await;
        assert_eq!(end, ProcessEnd::Unknown("it had more than one thread"));
    }
}
