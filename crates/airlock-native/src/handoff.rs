//! Receiving the descriptors the sandbox init hands the supervisor before the job starts
//! (an open `/out`, the egress proxy's listening socket).

use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;

/// Receives the descriptors the init handed over, without waiting: they were sent before
/// the job started, so they are queued by the time the supervisor hears it started.
pub fn receive_handoff(socket: &OwnedFd) -> Vec<OwnedFd> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    // Room for the sender's credentials too: a zygote's child sends on a socket whose
    // receiving end passes them (crate::zygote), and descriptors that do not fit are lost.
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2), ScmCredentials(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut received = Vec::new();
    if rustix::net::recvmsg(
        socket,
        &mut iov,
        &mut control,
        RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
    )
    .is_err()
    {
        return received;
    }
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            received.extend(fds);
        }
    }
    received
}
