//! Poller threads: each owns an io_uring that carries socket and disk I/O for
//! the connections pinned to it, and a registered buffer arena. Run to
//! completion, no locks on the I/O path; it sleeps in `io_uring_enter`.

use crate::subsystem::Registry;
use crate::transport::tcp::TcpConn;
use io_uring::{opcode, squeue, types, IoUring};
use rdmablk_common::mem::Arena;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often connections are checked for timeouts.
const TICK: Duration = Duration::from_millis(100);
/// How long a stopping poller waits for in-flight commands.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
const RING_ENTRIES: u32 = 1024;

/// What a completion belongs to, packed into the 64-bit user data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token {
    Recv(usize),
    Send(usize),
    /// A backend operation of command slot `.1` on connection `.0`.
    Backend(usize, u16),
    Tick,
    Wake,
}

impl Token {
    pub fn encode(self) -> u64 {
        let (kind, conn, slot) = match self {
            Token::Recv(c) => (1u64, c, 0),
            Token::Send(c) => (2, c, 0),
            Token::Backend(c, s) => (3, c, s),
            Token::Tick => (4, 0, 0),
            Token::Wake => (5, 0, 0),
        };
        kind << 56 | (conn as u64) << 16 | slot as u64
    }

    fn decode(v: u64) -> Option<Token> {
        let conn = ((v >> 16) & 0xff_ffff_ffff) as usize;
        let slot = v as u16;
        Some(match v >> 56 {
            1 => Token::Recv(conn),
            2 => Token::Send(conn),
            3 => Token::Backend(conn, slot),
            4 => Token::Tick,
            5 => Token::Wake,
            _ => return None,
        })
    }
}

/// What connection handlers get from their poller.
pub struct Io<'a> {
    pub arena: &'a mut Arena,
    /// Operations to submit after the handler returns.
    pub sq: &'a mut Vec<squeue::Entry>,
    pub registry: &'a Arc<Registry>,
    /// The daemon is stopping: take no new commands.
    pub stopping: bool,
}

/// State shared by all pollers.
pub struct Shared {
    pub registry: Arc<Registry>,
    pub stop: AtomicBool,
    /// Connections alive across all pollers.
    pub connections: AtomicUsize,
}

/// How other threads reach a poller: hand it connections, wake it.
pub struct PollerLink {
    sender: Sender<(TcpStream, std::net::SocketAddr)>,
    wake: Arc<OwnedFd>,
}

impl PollerLink {
    /// Hands a new connection to the poller.
    pub fn adopt(&self, sock: TcpStream, peer: std::net::SocketAddr) {
        if self.sender.send((sock, peer)).is_ok() {
            wake(&self.wake);
        }
    }

    /// Wakes the poller so it notices the stop flag.
    pub fn wake(&self) {
        wake(&self.wake);
    }
}

fn wake(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // An eventfd write only fails if the counter would overflow, which a
    // sleeping poller that drains it never lets happen.
    let _ = nix::unistd::write(fd, &one);
}

/// Creates a poller (ring, arena, registration) and starts its thread.
pub fn spawn(
    id: usize,
    shared: Arc<Shared>,
    arena_bytes: usize,
) -> io::Result<(PollerLink, JoinHandle<()>)> {
    let ring: IoUring = IoUring::builder().build(RING_ENTRIES)?;
    let arena = Arena::new(arena_bytes, true)?;
    let iov = libc::iovec {
        iov_base: arena.base().cast(),
        iov_len: arena.len(),
    };
    // SAFETY: the iovec describes the arena's mapping, which lives in the same
    // Poller as the ring and is declared after it, so it is unmapped only
    // after the ring (and its registration) is gone.
    unsafe { ring.submitter().register_buffers(&[iov]) }.map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("registering the {arena_bytes}-byte buffer arena with io_uring: {e}"),
        )
    })?;
    // SAFETY: eventfd returns a new descriptor that we own, or -1.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh, valid descriptor owned by nobody else.
    let wake_fd = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
    let (sender, incoming) = mpsc::channel();
    tracing::debug!(
        poller = id,
        arena = arena.len(),
        huge_pages = arena.is_huge(),
        "poller ready"
    );
    let poller_wake = wake_fd.clone();
    let make = move || Poller {
        ring,
        arena,
        id,
        conns: Vec::new(),
        incoming,
        wake_fd: poller_wake,
        wake_buf: [0; 8],
        tick: types::Timespec::from(TICK),
        shared,
        sq: Vec::new(),
        stop_at: None,
    };
    let thread = std::thread::Builder::new()
        .name(format!("poller-{id}"))
        .spawn(move || make().run())?;
    Ok((
        PollerLink {
            sender,
            wake: wake_fd,
        },
        thread,
    ))
}

struct Poller {
    // Field order matters: the ring must be dropped before the arena it has
    // registered.
    ring: IoUring,
    arena: Arena,
    id: usize,
    conns: Vec<Option<Box<TcpConn>>>,
    incoming: Receiver<(TcpStream, std::net::SocketAddr)>,
    wake_fd: Arc<OwnedFd>,
    wake_buf: [u8; 8],
    tick: types::Timespec,
    shared: Arc<Shared>,
    sq: Vec<squeue::Entry>,
    /// When the stop was noticed.
    stop_at: Option<Instant>,
}

impl Poller {
    fn run(mut self) {
        self.arm_wake();
        self.arm_tick();
        let mut completions: Vec<(u64, i32)> = Vec::with_capacity(RING_ENTRIES as usize);
        loop {
            if let Err(e) = self.submit_and_wait() {
                tracing::error!(poller = self.id, "io_uring failed: {e}; poller stops");
                break;
            }
            completions.clear();
            completions.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for &(ud, res) in &completions {
                self.dispatch(ud, res);
            }
            self.pump_all();
            if self.stop_at.is_some() && self.conns.iter().all(Option::is_none) {
                break;
            }
        }
        tracing::debug!(poller = self.id, "poller stopped");
    }

    /// Pushes queued operations and waits for at least one completion.
    fn submit_and_wait(&mut self) -> io::Result<()> {
        let mut pending = std::mem::take(&mut self.sq);
        for e in pending.drain(..) {
            // SAFETY: every entry points at memory that stays valid until its
            // completion: connection buffers and message headers live in boxed
            // connections that are freed only once no operation of theirs is in
            // flight, and arena buffers are released only after their
            // operations complete.
            while unsafe { self.ring.submission().push(&e) }.is_err() {
                self.ring.submit()?;
            }
        }
        self.sq = pending;
        match self.ring.submit_and_wait(1) {
            Ok(_) => Ok(()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Splits the poller into what connection handlers need and the connections.
    fn split(&mut self) -> (Io<'_>, &mut Vec<Option<Box<TcpConn>>>, &Shared) {
        (
            Io {
                arena: &mut self.arena,
                sq: &mut self.sq,
                registry: &self.shared.registry,
                stopping: self.stop_at.is_some(),
            },
            &mut self.conns,
            &self.shared,
        )
    }

    fn dispatch(&mut self, ud: u64, res: i32) {
        match Token::decode(ud) {
            Some(Token::Tick) => {
                self.on_tick();
                self.arm_tick();
            }
            Some(Token::Wake) => {
                self.on_wake();
                self.arm_wake();
            }
            Some(Token::Recv(c)) => {
                if let Some(conn) = self.conns.get_mut(c).and_then(Option::as_mut) {
                    conn.on_recv(res);
                }
            }
            Some(Token::Send(c)) => {
                let (mut io, conns, _) = self.split();
                if let Some(conn) = conns.get_mut(c).and_then(Option::as_mut) {
                    conn.on_send(res, &mut io);
                }
            }
            Some(Token::Backend(c, slot)) => {
                let (mut io, conns, _) = self.split();
                if let Some(conn) = conns.get_mut(c).and_then(Option::as_mut) {
                    conn.on_backend(slot, res, &mut io);
                }
            }
            None => tracing::error!(poller = self.id, ud, "completion with unknown user data"),
        }
    }

    /// Lets every connection make progress, and frees the finished ones.
    fn pump_all(&mut self) {
        let stop_at = self.stop_at;
        let (mut io, conns, shared) = self.split();
        for slot in conns.iter_mut() {
            let Some(conn) = slot else { continue };
            conn.pump(&mut io);
            if conn.can_free() {
                conn.teardown(&mut io);
                *slot = None;
                shared.connections.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if let Some(t) = stop_at {
            if t.elapsed() > DRAIN_TIMEOUT {
                for c in conns.iter_mut().flatten() {
                    c.close("drain timeout at shutdown");
                }
            }
        }
    }

    fn on_tick(&mut self) {
        for c in self.conns.iter_mut().flatten() {
            c.on_tick();
        }
    }

    fn on_wake(&mut self) {
        // The eventfd is readable: this read does not block.
        let _ = nix::unistd::read(self.wake_fd.as_raw_fd(), &mut self.wake_buf);
        if self.shared.stop.load(Ordering::Acquire) && self.stop_at.is_none() {
            self.stop_at = Some(Instant::now());
            tracing::debug!(
                poller = self.id,
                connections = self.conns.iter().flatten().count(),
                "draining"
            );
        }
        while let Ok((sock, peer)) = self.incoming.try_recv() {
            if self.stop_at.is_some() {
                continue; // dropping the socket closes it
            }
            let idx = self
                .conns
                .iter()
                .position(Option::is_none)
                .unwrap_or_else(|| {
                    self.conns.push(None);
                    self.conns.len() - 1
                });
            tracing::debug!(poller = self.id, %peer, "connection accepted");
            self.conns[idx] = Some(Box::new(TcpConn::new(sock, peer, idx)));
            self.shared.connections.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn arm_tick(&mut self) {
        let e = opcode::Timeout::new(&self.tick)
            .build()
            .user_data(Token::Tick.encode());
        self.sq.push(e);
    }

    fn arm_wake(&mut self) {
        let e = opcode::PollAdd::new(types::Fd(self.wake_fd.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(Token::Wake.encode());
        self.sq.push(e);
    }
}
