//! Handing a warm container's job the pipes its stdout and stderr go to, so that the host
//! reads its output itself rather than through the engine (whose attach stream ends only
//! once the daemon has handled the container's exit: docs/docker.md, "How a warm
//! container's job ends").
//!
//! The host makes two pipes and listens on a Unix socket in the container's `/work`
//! ([`python::WARM_OUTPUT_SOCKET_NAME`]); the bootstrap, told so by its message, connects,
//! and the host checks that the peer is the container's first process, removes the
//! socket, then sends the two write ends (`SCM_RIGHTS`) and closes its own copies. The job
//! then runs with anonymous pipes on descriptors 1 and 2, as a cold container's job does,
//! and finds nothing of the handoff in `/work`; its output ends when the last of its
//! processes is gone.

use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_core::warm::python;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};

/// How long the bootstrap may take to connect once its message is sent (it does so
/// before anything else; the engine relays the message).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A handoff under way: the listening socket and both pipes.
pub(crate) struct OutputHandoff {
    listener: tokio::net::UnixListener,
    /// The socket's path, until it is removed.
    path: Option<PathBuf>,
    /// Read ends, stdout's then stderr's (taken when the handoff completes).
    readers: Option<[OwnedFd; 2]>,
    /// Write ends, handed to the container.
    writers: [OwnedFd; 2],
}

impl OutputHandoff {
    /// Makes the pipes and listens in `work` (the host directory bound at `/work`).
    pub(crate) fn listen(work: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let pipe = || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC);
        let (stdout_read, stdout_write) = pipe()?;
        let (stderr_read, stderr_write) = pipe()?;
        let path = work.join(python::WARM_OUTPUT_SOCKET_NAME);
        // bind never follows a link at the last component (it fails on any existing name).
        let listener = tokio::net::UnixListener::bind(&path)?;
        // The job's uid connects; nobody else reaches the container's /work. Before anything
        // of the job runs: nothing in the container can have replaced the name yet.
        if let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)) {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        Ok(Self {
            listener,
            path: Some(path),
            readers: Some([stdout_read, stderr_read]),
            writers: [stdout_write, stderr_write],
        })
    }

    /// Removes the socket, once: after the handoff the name is the job's (its own file of
    /// that name must not be removed).
    fn remove_socket(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Waits for the container's first process (`pid`, its host pid) to connect, removes
    /// the socket, hands it the write ends, and returns the read ends.
    pub(crate) async fn complete(mut self, pid: u32) -> Result<[OwnedFd; 2], String> {
        let accepted = tokio::time::timeout(CONNECT_TIMEOUT, self.listener.accept()).await;
        self.remove_socket();
        let (stream, _) = accepted
            .map_err(|_| format!("it did not connect within {CONNECT_TIMEOUT:?}"))?
            .map_err(|e| format!("accept: {e}"))?;
        let peer = stream
            .peer_cred()
            .map_err(|e| format!("read the peer's credentials: {e}"))?
            .pid();
        if peer != i32::try_from(pid).ok() {
            return Err(format!(
                "process {peer:?} connected, not the container's {pid}"
            ));
        }
        let fds = [self.writers[0].as_fd(), self.writers[1].as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err("no room for two descriptors".into());
        }
        // One byte into an empty socket's buffer: it does not block.
        rustix::net::sendmsg(
            &stream,
            &[IoSlice::new(b"o")],
            &mut control,
            SendFlags::empty(),
        )
        .map_err(|e| format!("send the pipes: {e}"))?;
        self.readers
            .take()
            .ok_or_else(|| "handed over twice".to_owned())
    }
}

impl Drop for OutputHandoff {
    fn drop(&mut self) {
        self.remove_socket();
    }
}
