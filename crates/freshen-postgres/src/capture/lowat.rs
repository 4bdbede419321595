//! The replication socket's wake-up threshold (`SO_RCVLOWAT`, Linux), on a connection
//! to this host.
//!
//! A reader waiting on its socket is woken for every message the walsender sends, and on
//! loopback the walsender pays for that wake-up and for the receive work behind it. The
//! reader already pauses between reads of a busy stream (`reader.rs`), but after each
//! pause it waited on the socket again and was woken per message until it caught up.
//! With the threshold raised the kernel wakes it only once `bytes` have queued (or its
//! receive memory nears full), and once the unread bytes fill the window the walsender's
//! sends only append to its send queue, which is cheap. Lowering it to one byte makes the
//! kernel signal whatever is queued at once, so a stream that slows down is read within
//! the reader's own deadline (`read_gap`), never left waiting for bytes that do not come.
//! Raising it does not shrink the receive window, so the walsender keeps sending while
//! the reader pauses: Linux grows the receive buffer to hold `bytes` if it must and only
//! ever raises the window clamp (since 21b29e74ffe5; before it the clamp could fall to
//! `bytes`, and only where the buffer had to grow). The window keeps autotuning: 2–5 MB
//! receive buffers while one huge transaction streams. An explicit `SO_RCVBUF` would stop
//! that autotuning; it measured inconclusively (BENCHMARKS.md, capture) and is not set.
//! Over a network the threshold is not used: there the walsender does not pay for the
//! reader's wake-ups.
//!
//! ```text
//!            data came, threshold low                      raise: wake at `bytes`
//!   ┌──────────┐ ───────────────────────────────────────► ┌──────────┐
//!   │   low    │                                          │  raised  │ ◄─┐ data came
//!   │ (1 byte) │ ◄─────────────────────────────────────── │ (bytes)  │ ──┘ before the deadline
//!   └──────────┘   no data for read_gap: lower, and the   └──────────┘
//!                  kernel signals what is queued at once
//! ```
//!
//! pgwire-replication owns the connection, so the socket is found among this process's
//! descriptors by its two ports, which the server reports (`inet_client_port()`,
//! `inet_server_port()`), and duplicated: the duplicate names the same socket for as long
//! as this value lives, whatever happens to descriptor numbers meanwhile. Where the ports
//! do not identify exactly one socket (TLS through the bridge, a Unix socket, not Linux),
//! there is no threshold and the reader only pauses.

use std::net::TcpStream;

/// A duplicate of the replication connection's socket, and its wake-up threshold.
#[derive(Debug)]
pub(crate) struct Lowat {
    sock: TcpStream,
    bytes: i32,
    raised: bool,
}

impl Lowat {
    /// The TCP socket of this process whose local port is `local` and whose peer's port is
    /// `peer`, when exactly one is; `bytes` (at least 2) is the threshold while raised.
    pub(crate) fn find(local: u16, peer: u16, bytes: usize) -> Option<Lowat> {
        let bytes = i32::try_from(bytes).ok().filter(|b| *b > 1)?;
        let mut found = sys::sockets()
            .filter(|s| {
                s.local_addr().is_ok_and(|a| a.port() == local)
                    && s.peer_addr().is_ok_and(|a| a.port() == peer)
            })
            .take(2);
        let sock = found.next()?;
        if found.next().is_some() {
            return None;
        }
        Some(Lowat {
            sock,
            bytes,
            raised: false,
        })
    }

    /// Whether the threshold is raised.
    pub(crate) fn is_raised(&self) -> bool {
        self.raised
    }

    /// Wake the reader only once the threshold's bytes have queued.
    pub(crate) fn raise(&mut self) {
        if !self.raised {
            self.raised = sys::set_rcvlowat(&self.sock, self.bytes).is_ok();
        }
    }

    /// Wake the reader for any byte; the kernel signals what is already queued at once.
    pub(crate) fn lower(&mut self) {
        if self.raised {
            // A failure leaves the threshold where it was: keep saying so, and the next
            // deadline tries again.
            self.raised = sys::set_rcvlowat(&self.sock, 1).is_err();
        }
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod sys {
    use std::net::TcpStream;
    use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

    /// Duplicates of this process's socket descriptors (`/proc/self/fd`).
    pub(super) fn sockets() -> impl Iterator<Item = TcpStream> {
        std::fs::read_dir("/proc/self/fd")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|t| t.as_os_str().as_encoded_bytes().starts_with(b"socket:"))
            })
            .filter_map(|e| e.file_name().to_str()?.parse::<RawFd>().ok())
            .filter_map(|fd| {
                // SAFETY: the borrow lives only for the `dup` below. Should the descriptor
                // have been closed since it was listed, `dup` fails (EBADF); should its
                // number have been reused, the duplicate names another file, which the
                // caller's port checks reject. Nothing is read or written through it here.
                let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
                borrowed.try_clone_to_owned().ok().map(TcpStream::from)
            })
    }

    /// `setsockopt(SOL_SOCKET, SO_RCVLOWAT)`: no maintained crate wraps it.
    pub(super) fn set_rcvlowat(sock: &TcpStream, bytes: i32) -> std::io::Result<()> {
        // SAFETY: a valid descriptor owned by `sock`, and a pointer to an `int` with its
        // size, as setsockopt(2) requires for SO_RCVLOWAT.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&bytes as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// `getsockopt(level, opt)` of an `int` option, for the tests.
    #[cfg(test)]
    pub(super) fn get(sock: &TcpStream, level: i32, opt: i32) -> i32 {
        let mut v: i32 = -1;
        let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
        // SAFETY: a valid descriptor owned by `sock`, and a pointer to an `int` with its
        // length, as getsockopt(2) requires for these options.
        let rc = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                level,
                opt,
                (&mut v as *mut i32).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "getsockopt: {}", std::io::Error::last_os_error());
        v
    }

    /// `setsockopt(IPPROTO_TCP, TCP_WINDOW_CLAMP)`, for the tests.
    #[cfg(test)]
    pub(super) fn set_window_clamp(sock: &TcpStream, bytes: i32) {
        // SAFETY: as in `set_rcvlowat`.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_WINDOW_CLAMP,
                (&bytes as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        assert_eq!(
            rc,
            0,
            "TCP_WINDOW_CLAMP: {}",
            std::io::Error::last_os_error()
        );
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::net::TcpStream;

    pub(super) fn sockets() -> impl Iterator<Item = TcpStream> {
        std::iter::empty()
    }

    pub(super) fn set_rcvlowat(_: &TcpStream, _: i32) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    fn ports(s: &TcpStream) -> (u16, u16) {
        (
            s.local_addr().unwrap().port(),
            s.peer_addr().unwrap().port(),
        )
    }

    #[test]
    fn finds_the_socket_by_its_two_ports_and_not_another() {
        let (client, _server) = pair();
        let (local, peer) = ports(&client);
        assert!(Lowat::find(local, peer, 4096).is_some());
        assert!(Lowat::find(local, peer.wrapping_add(1), 4096).is_none());
    }

    #[test]
    fn a_threshold_of_one_byte_is_no_threshold() {
        let (client, _server) = pair();
        let (local, peer) = ports(&client);
        assert!(Lowat::find(local, peer, 1).is_none());
        assert!(Lowat::find(local, peer, 0).is_none());
    }

    /// What the reader relies on: with the threshold raised, readiness (epoll, as tokio
    /// waits) is not reported for fewer bytes than the threshold; lowering it reports
    /// what is queued at once, without another byte arriving.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "current_thread")]
    async fn raised_holds_back_a_small_message_and_lowering_releases_it() {
        let (client, mut server) = pair();
        let (local, peer) = ports(&client);
        client.set_nonblocking(true).unwrap();
        let client = tokio::net::TcpStream::from_std(client).unwrap();
        let mut lowat = Lowat::find(local, peer, 4096).unwrap();
        lowat.raise();
        assert!(lowat.is_raised());
        server.write_all(b"small").unwrap();
        let held = tokio::time::timeout(Duration::from_millis(300), client.readable()).await;
        assert!(held.is_err(), "5 bytes woke a reader waiting for 4096");
        lowat.lower();
        assert!(!lowat.is_raised());
        tokio::time::timeout(Duration::from_secs(10), client.readable())
            .await
            .expect("lowering the threshold signals the queued bytes")
            .unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(client.try_read(&mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"small");
    }

    /// What the reader relies on while it pauses: raising the threshold never shrinks
    /// the receive window, so the walsender keeps sending while nobody reads. Linux
    /// grows the buffer to hold the threshold and, since 21b29e74ffe5 ("tcp: take care
    /// of zero tp->window_clamp in tcp_set_rcvlowat()"), only ever raises the window
    /// clamp; before it the clamp fell to the threshold. That happens only when the
    /// buffer must grow for the threshold, so this test raises one four times the
    /// buffer's default window over a clamp set above it, as autotuning leaves a busy
    /// stream's.
    #[cfg(target_os = "linux")]
    #[test]
    fn raising_the_threshold_never_shrinks_the_receive_window() {
        let (client, _server) = pair();
        let (local, peer) = ports(&client);
        sys::set_window_clamp(&client, 1 << 20);
        let clamp = || sys::get(&client, libc::IPPROTO_TCP, libc::TCP_WINDOW_CLAMP);
        let rcvbuf = || sys::get(&client, libc::SOL_SOCKET, libc::SO_RCVBUF);
        let (clamp0, rcvbuf0) = (clamp(), rcvbuf());
        assert!(clamp0 >= 1 << 20, "the clamp was not set: {clamp0}");
        let mut lowat = Lowat::find(local, peer, 256 * 1024).unwrap();
        lowat.raise();
        assert!(lowat.is_raised());
        assert!(
            clamp() >= clamp0,
            "raising the threshold lowered the window clamp from {clamp0} to {}",
            clamp()
        );
        assert!(rcvbuf() >= rcvbuf0, "the receive buffer shrank");
        lowat.lower();
        assert!(clamp() >= clamp0, "lowering it lowered the window clamp");
    }
}
