//! The export's front door: one thread accepts clients and runs every
//! handshake at once on non-blocking sockets, each within one deadline for
//! the whole handshake, and turns away clients beyond the export's limit.
//!
//! Handshakes are bounded apart from the clients served: a client takes a
//! place among the export's clients only once it speaks (its first bytes
//! after the greeting), and when the handshakes in progress reach their
//! bound, a new connection takes the place of the oldest one still silent
//! (greeted before the accepts at hand: one greeted among them has had no
//! chance to answer yet; with none, the newcomer is refused).
//! Clients that connect and say nothing, however many and however often,
//! neither fill the export nor keep a client that speaks out.
//!
//! The handshake itself (`handshake.rs`) is written against a blocking
//! stream. Here it is replayed over the bytes a client has sent so far: a
//! read past them is `WouldBlock`, which ends the replay until the bytes it
//! asked for have arrived; the replies it produced beyond those already
//! sent go out. The handshake is deterministic, so each replay repeats the
//! last one and goes further. Input is bounded (`MAX_INPUT`), and a replay
//! runs only once the input it asked for is there, so a client trickling
//! bytes costs one replay per option at most.

use super::handoff::{NewClient, Seat};
use super::handshake::{negotiate, Export, HandshakeError, Negotiated, Outcome};
use crate::host::engine::Waker;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a client may take over its whole handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes a client may send during its handshake: room for every option it
/// may send (`MAX_OPTIONS` of them, each well under 8 KiB) is not needed;
/// a real client sends a few hundred bytes.
const MAX_INPUT: usize = 128 << 10;
/// Handshakes in progress at least, whatever `--nbd-max-clients`.
const MIN_HANDSHAKES: usize = 1024;
/// How often the stop flag is looked at.
const STOP_CHECK: Duration = Duration::from_millis(500);

/// What the greeter hands clients to, and its limits.
pub struct Greeter {
    pub export: Arc<Export>,
    pub engines: Vec<(Sender<NewClient>, Waker)>,
    /// Clients the export serves at most (those in their handshake that
    /// spoke included).
    pub max_clients: usize,
    pub stop: Arc<AtomicBool>,
}

/// A listening socket the greeter accepts on.
pub trait Accept {
    /// The listening descriptor, non-blocking.
    fn listening(&self) -> std::os::fd::BorrowedFd<'_>;
    /// A new connection (non-blocking), its peer, and whether it is TCP;
    /// `Ok(None)` when none is waiting.
    fn accept_one(&self) -> io::Result<Option<(OwnedFd, String, bool)>>;
}

/// A client in its handshake.
struct Pending {
    sock: std::fs::File,
    peer: String,
    /// Its place among the export's clients, taken when it first spoke,
    /// and whether it may be served (the export was not full then).
    seat: Option<(Seat, bool)>,
    accepted: Instant,
    input: Vec<u8>,
    /// The client closed its side.
    eof: bool,
    /// Input length the last replay needs before it can go further.
    need: usize,
    /// Reply bytes produced so far, and those of them not yet written.
    produced: usize,
    unsent: Vec<u8>,
    deadline: Instant,
    /// The handshake ended with the client choosing the export: it is
    /// handed over once `unsent` is written.
    chosen: Option<Negotiated>,
}

/// The client's bytes so far, as a stream: reading past them would block
/// (or is the end, once the client closed); replies are collected.
struct Replay<'a> {
    input: &'a [u8],
    at: usize,
    eof: bool,
    /// What the read that found no more input asked for.
    wanted: usize,
    out: Vec<u8>,
}

impl Read for Replay<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = &self.input[self.at..];
        if left.is_empty() && !buf.is_empty() {
            if self.eof {
                return Ok(0);
            }
            self.wanted = buf.len();
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = left.len().min(buf.len());
        buf[..n].copy_from_slice(&left[..n]);
        self.at += n;
        Ok(n)
    }
}

impl Write for Replay<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What one step of a pending handshake led to.
enum Step {
    Wait,
    /// Done with the client: refused or gone.
    Done,
    /// The client chose the export and has all its replies.
    Chosen(Negotiated),
}

impl Greeter {
    /// Accepts and greets clients until the stop flag is set.
    pub fn run(&self, listener: &dyn Accept) {
        let clients = Arc::new(AtomicUsize::new(0));
        let mut pending: Vec<Pending> = Vec::new();
        let mut next_engine = 0;
        while !self.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            let wait = pending
                .iter()
                .map(|p| p.deadline.saturating_duration_since(now))
                .min()
                .unwrap_or(STOP_CHECK)
                .min(STOP_CHECK);
            let (listen_ready, ready) = {
                let mut fds = vec![PollFd::new(listener.listening(), PollFlags::POLLIN)];
                for p in &pending {
                    let mut ev = PollFlags::POLLIN;
                    if !p.unsent.is_empty() {
                        ev |= PollFlags::POLLOUT;
                    }
                    fds.push(PollFd::new(p.sock.as_fd(), ev));
                }
                let ms = PollTimeout::try_from(wait.as_millis().max(1) as i32)
                    .unwrap_or(PollTimeout::MAX);
                match poll(&mut fds, ms) {
                    Ok(_) => {}
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => {
                        tracing::error!("NBD export: poll failed: {e}");
                        return;
                    }
                }
                let revents = |f: &PollFd| f.revents().unwrap_or(PollFlags::empty());
                let ready: Vec<PollFlags> = fds[1..].iter().map(revents).collect();
                (!revents(&fds[0]).is_empty(), ready)
            };
            // Handshakes first (their descriptors line up with `ready`).
            let mut i = 0;
            let mut ready = ready.into_iter();
            while i < pending.len() {
                let ev = ready.next().unwrap_or(PollFlags::empty());
                let step = if pending[i].deadline <= Instant::now() {
                    let p = &pending[i];
                    tracing::warn!(peer = %p.peer, "NBD client did not finish its handshake within {}s; closing", HANDSHAKE_TIMEOUT.as_secs());
                    Step::Done
                } else if ev.is_empty() {
                    Step::Wait
                } else {
                    self.progress(&mut pending[i], &clients)
                };
                match step {
                    Step::Wait => i += 1,
                    Step::Done => {
                        pending.swap_remove(i);
                    }
                    Step::Chosen(negotiated) => {
                        let p = pending.swap_remove(i);
                        self.hand_over(p, negotiated, &mut next_engine);
                    }
                }
            }
            if listen_ready {
                self.accept_all(listener, &clients, &mut pending);
            }
        }
    }

    /// Takes every connection waiting on the listener (a full backlog
    /// would turn clients away before they are seen).
    fn accept_all(
        &self,
        listener: &dyn Accept,
        clients: &Arc<AtomicUsize>,
        pending: &mut Vec<Pending>,
    ) {
        // Only clients greeted before these accepts can be silent: one
        // greeted among them has had no chance to answer yet.
        let burst = Instant::now();
        loop {
            let (fd, peer, tcp) = match listener.accept_one() {
                Ok(Some(c)) => c,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!("NBD accept failed: {e}");
                    return;
                }
            };
            // Handshakes are bounded: the oldest silent one makes room, or
            // the newcomer is refused when none is.
            if pending.len() >= self.max_handshakes() {
                let silent = (0..pending.len())
                    .filter(|&i| pending[i].seat.is_none() && pending[i].accepted < burst)
                    .min_by_key(|&i| pending[i].accepted);
                match silent {
                    Some(i) => {
                        let old = pending.swap_remove(i);
                        tracing::debug!(peer = %old.peer, "NBD client silent since it connected, closed for a new one");
                    }
                    None => {
                        tracing::warn!(%peer, "NBD client refused: too many handshakes in progress");
                        continue;
                    }
                }
            }
            if tcp {
                let nodelay = nix::sys::socket::sockopt::TcpNoDelay;
                let _ = nix::sys::socket::setsockopt(&fd, nodelay, &true);
            }
            let mut p = Pending {
                sock: std::fs::File::from(fd),
                peer,
                seat: None,
                accepted: Instant::now(),
                input: Vec::new(),
                eof: false,
                need: 0,
                produced: 0,
                unsent: Vec::new(),
                deadline: Instant::now() + HANDSHAKE_TIMEOUT,
                chosen: None,
            };
            // The greeting goes out at once.
            if let Step::Wait = self.replay(&mut p, clients) {
                if flush(&mut p).is_ok() {
                    pending.push(p);
                }
            }
        }
    }

    /// Reads what arrived, replays the handshake when it can go further,
    /// writes what it answered, and hands a client that chose the export
    /// over to an engine.
    fn progress(&self, p: &mut Pending, clients: &Arc<AtomicUsize>) -> Step {
        if p.chosen.is_none() {
            let mut buf = [0u8; 4096];
            loop {
                match p.sock.read(&mut buf) {
                    Ok(0) => {
                        p.eof = true;
                        break;
                    }
                    Ok(n) => {
                        if p.input.len() + n > MAX_INPUT {
                            tracing::warn!(peer = %p.peer, "NBD client sent more than {MAX_INPUT} bytes of handshake; closing");
                            return Step::Done;
                        }
                        p.input.extend_from_slice(&buf[..n]);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::debug!(peer = %p.peer, "NBD client left during the handshake: {e}");
                        return Step::Done;
                    }
                }
            }
            if p.input.len() >= p.need || p.eof {
                if let Step::Done = self.replay(p, clients) {
                    return Step::Done;
                }
            }
        }
        if flush(p).is_err() {
            return Step::Done;
        }
        match p.chosen {
            Some(negotiated) if p.unsent.is_empty() => Step::Chosen(negotiated),
            _ => Step::Wait,
        }
    }

    /// Handshakes in progress at most: four times the clients served, at
    /// least [`MIN_HANDSHAKES`].
    fn max_handshakes(&self) -> usize {
        (4 * self.max_clients).max(MIN_HANDSHAKES)
    }

    /// Runs the handshake over the input so far; queues the new replies.
    /// A client that spoke takes its place among the export's clients (the
    /// greeting, all it had before, does not depend on it).
    fn replay(&self, p: &mut Pending, clients: &Arc<AtomicUsize>) -> Step {
        if p.seat.is_none() && !p.input.is_empty() {
            let (seat, seated) = Seat::claim(clients);
            let admitted = seated <= self.max_clients;
            if !admitted {
                tracing::warn!(peer = %p.peer, max = self.max_clients, "NBD export is full; the client is told so");
            }
            p.seat = Some((seat, admitted));
        }
        let admitted = p.seat.as_ref().is_some_and(|(_, a)| *a);
        let mut r = Replay {
            input: &p.input,
            at: 0,
            eof: p.eof,
            wanted: 0,
            out: Vec::new(),
        };
        let result = negotiate(&mut r, &self.export, admitted);
        let (at, wanted) = (r.at, r.wanted);
        p.unsent
            .extend_from_slice(&r.out[p.produced.min(r.out.len())..]);
        p.produced = p.produced.max(r.out.len());
        match result {
            Err(HandshakeError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                p.need = at + wanted;
                Step::Wait
            }
            Ok(Outcome::Serve(negotiated)) => {
                if at < p.input.len() {
                    tracing::warn!(peer = %p.peer, "NBD client sent requests before its handshake ended; closing");
                    return Step::Done;
                }
                p.chosen = Some(negotiated);
                Step::Wait
            }
            Ok(Outcome::Closed) => {
                let _ = flush(p);
                tracing::debug!(peer = %p.peer, "NBD client left during the handshake");
                Step::Done
            }
            Err(e) => {
                let _ = flush(p);
                tracing::warn!(peer = %p.peer, "NBD handshake failed: {e}");
                Step::Done
            }
        }
    }

    /// Gives a client that chose the export to the next engine, its socket
    /// blocking again (the engine's io_uring waits on it).
    fn hand_over(&self, p: Pending, negotiated: Negotiated, next: &mut usize) {
        // A client that chose the export spoke, so it has its place.
        let Pending {
            sock,
            peer,
            seat: Some((seat, _)),
            ..
        } = p
        else {
            return;
        };
        if let Err(e) = set_nonblocking(&sock, false) {
            tracing::warn!(%peer, "NBD client dropped: {e}");
            return;
        }
        let (tx, waker) = &self.engines[*next % self.engines.len()];
        *next += 1;
        let client = NewClient {
            fd: OwnedFd::from(sock),
            negotiated,
            peer,
            seat,
        };
        if tx.send(client).is_ok() {
            waker.wake();
        }
    }
}

/// Writes what a pending client was answered, as far as its socket takes.
fn flush(p: &mut Pending) -> io::Result<()> {
    while !p.unsent.is_empty() {
        match p.sock.write(&p.unsent) {
            Ok(n) => {
                p.unsent.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sets or clears O_NONBLOCK.
pub fn set_nonblocking(fd: &impl AsRawFd, on: bool) -> io::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let raw = fd.as_raw_fd();
    let flags = fcntl(raw, FcntlArg::F_GETFL).map_err(io::Error::from)?;
    let mut flags = OFlag::from_bits_truncate(flags);
    flags.set(OFlag::O_NONBLOCK, on);
    fcntl(raw, FcntlArg::F_SETFL(flags)).map_err(io::Error::from)?;
    Ok(())
}
