//! Network interface setup inside a fresh network namespace.

use std::io;
use std::os::fd::AsRawFd;

/// Sets the loopback interface `lo` up, as Docker's `--network none` does, so programs that
/// talk to themselves over 127.0.0.1 work. A fresh network namespace has `lo` down.
pub fn bring_up_loopback() -> io::Result<()> {
    let socket = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )?;
    // SAFETY: ifreq is a plain C struct for which all-zero bytes are a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: the socket is open, `request` is a valid ifreq naming "lo", and SIOCGIFFLAGS
    // writes only into its union.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut request) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union, which is read here.
    let current = unsafe { request.ifr_ifru.ifru_flags };
    request.ifr_ifru.ifru_flags = current | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: as above; SIOCSIFFLAGS reads the name and flags.
    if unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &request) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
