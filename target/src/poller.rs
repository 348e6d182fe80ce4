//! Poller threads: each owns an io_uring that carries socket and disk I/O for
//! the connections pinned to it, and a registered buffer arena. Run to
//! completion, no locks on the I/O path; it sleeps in `io_uring_enter`.

use crate::subsystem::Registry;
use crate::transport::rdma::{self, Endpoint};
use crate::transport::tcp::TcpConn;
use io_uring::{opcode, squeue, types};
use rdmablk_common::mem::Arena;
use rdmablk_common::ring::{Ring, Wakeup};
use std::io;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often connections are checked for timeouts.
const TICK: Duration = Duration::from_millis(100);
/// How long a stopping poller waits for in-flight commands.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long closed RDMA queues may wait for their flushes at shutdown
/// (a removed device may never deliver them).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
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
    /// The completion channel of RDMA device `.0` is readable.
    RdmaCq(usize),
    /// The RDMA CM channel is readable.
    RdmaCm,
    /// A backend operation of command slot `.1` on RDMA queue `.0`.
    RdmaBackend(usize, u16),
}

impl Token {
    pub fn encode(self) -> u64 {
        let (kind, conn, slot) = match self {
            Token::Recv(c) => (1u64, c, 0),
            Token::Send(c) => (2, c, 0),
            Token::Backend(c, s) => (3, c, s),
            Token::Tick => (4, 0, 0),
            Token::Wake => (5, 0, 0),
            Token::RdmaCq(d) => (6, d, 0),
            Token::RdmaCm => (7, 0, 0),
            Token::RdmaBackend(c, s) => (8, c, s),
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
            6 => Token::RdmaCq(conn),
            7 => Token::RdmaCm,
            8 => Token::RdmaBackend(conn, slot),
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
    /// Arena buffers in use, per poller (for the stats file).
    pub buffers_in_use: Vec<AtomicUsize>,
}

/// A new connection for a poller.
enum Incoming {
    Tcp(TcpStream, std::net::SocketAddr),
    Rdma(rdma::Incoming),
}

/// How other threads reach a poller: hand it connections, wake it.
pub struct PollerLink {
    sender: Sender<Incoming>,
    wakeup: Wakeup,
}

impl PollerLink {
    /// Hands a new NVMe/TCP connection to the poller.
    pub fn adopt(&self, sock: TcpStream, peer: std::net::SocketAddr) {
        self.send(Incoming::Tcp(sock, peer));
    }

    /// Hands an NVMe/RDMA connect request to the poller.
    pub fn adopt_rdma(&self, inc: rdma::Incoming) {
        self.send(Incoming::Rdma(inc));
    }

    fn send(&self, inc: Incoming) {
        if self.sender.send(inc).is_ok() {
            self.wakeup.wake();
        }
    }

    /// Wakes the poller so it notices the stop flag.
    pub fn wake(&self) {
        self.wakeup.wake();
    }
}

/// Creates a poller (ring, arena, registration) and starts its thread.
pub fn spawn(
    id: usize,
    shared: Arc<Shared>,
    arena_bytes: usize,
    busy_poll: bool,
) -> io::Result<(PollerLink, JoinHandle<()>)> {
    let ring = Ring::new(RING_ENTRIES, arena_bytes)?;
    let wakeup = Wakeup::new()?;
    let (sender, incoming) = mpsc::channel();
    tracing::debug!(
        poller = id,
        arena = ring.arena.len(),
        huge_pages = ring.arena.is_huge(),
        "poller ready"
    );
    let poller_wakeup = wakeup.clone();
    let make = move || Poller {
        rdma: Endpoint::new(id),
        ring,
        busy_poll,
        id,
        conns: Vec::new(),
        incoming,
        wakeup: poller_wakeup,
        tick: types::Timespec::from(TICK),
        shared,
        stop_at: None,
    };
    let thread = std::thread::Builder::new()
        .name(format!("poller-{id}"))
        .spawn(move || make().run())?;
    Ok((PollerLink { sender, wakeup }, thread))
}

struct Poller {
    /// Declared before the ring: its memory registrations go before the arena.
    rdma: Endpoint,
    ring: Ring,
    /// Spin instead of sleeping in io_uring_enter (a dedicated core).
    busy_poll: bool,
    id: usize,
    conns: Vec<Option<Box<TcpConn>>>,
    incoming: Receiver<Incoming>,
    wakeup: Wakeup,
    tick: types::Timespec,
    shared: Arc<Shared>,
    /// When the stop was noticed.
    stop_at: Option<Instant>,
}

impl Poller {
    fn run(mut self) {
        self.arm_wake();
        self.arm_tick();
        let mut completions: Vec<(u64, i32)> = Vec::with_capacity(RING_ENTRIES as usize);
        loop {
            // SAFETY: every queued operation points at memory that stays valid
            // until its completion: connection buffers and message headers live
            // in boxed connections freed only once no operation of theirs is in
            // flight, arena buffers are released only after their operations
            // complete, and the tick timespec lives in the Poller.
            let submitted = if self.busy_poll {
                // SAFETY: as above.
                unsafe { self.ring.submit() }
            } else {
                // SAFETY: as above.
                unsafe { self.ring.submit_and_wait() }
            };
            if let Err(e) = submitted {
                tracing::error!(poller = self.id, "io_uring failed: {e}; poller stops");
                break;
            }
            completions.clear();
            self.ring.reap(&mut completions);
            for &(ud, res) in &completions {
                self.dispatch(ud, res);
            }
            if self.busy_poll {
                let (mut io, _, _, rdma) = self.split();
                rdma.poll_all(&mut io);
            }
            self.pump_all();
            if self.stop_at.is_some()
                && self.conns.iter().all(Option::is_none)
                && self.rdma.connections() == 0
            {
                break;
            }
        }
        tracing::debug!(poller = self.id, "poller stopped");
    }

    /// Splits the poller into what connection handlers need and the connections.
    fn split(
        &mut self,
    ) -> (
        Io<'_>,
        &mut Vec<Option<Box<TcpConn>>>,
        &Shared,
        &mut Endpoint,
    ) {
        (
            Io {
                arena: &mut self.ring.arena,
                sq: &mut self.ring.pending,
                registry: &self.shared.registry,
                stopping: self.stop_at.is_some(),
            },
            &mut self.conns,
            &self.shared,
            &mut self.rdma,
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
                let (mut io, conns, _, _) = self.split();
                if let Some(conn) = conns.get_mut(c).and_then(Option::as_mut) {
                    conn.on_send(res, &mut io);
                }
            }
            Some(Token::Backend(c, slot)) => {
                let (mut io, conns, _, _) = self.split();
                if let Some(conn) = conns.get_mut(c).and_then(Option::as_mut) {
                    conn.on_backend(slot, res, &mut io);
                }
            }
            Some(Token::RdmaCq(d)) => {
                let (mut io, _, _, rdma) = self.split();
                rdma.on_cq(d, &mut io);
            }
            Some(Token::RdmaCm) => self.rdma.on_cm(),
            Some(Token::RdmaBackend(c, slot)) => {
                let (mut io, _, _, rdma) = self.split();
                rdma.on_backend(c, slot, res, &mut io);
            }
            None => tracing::error!(poller = self.id, ud, "completion with unknown user data"),
        }
    }

    /// Lets every connection make progress, and frees the finished ones.
    fn pump_all(&mut self) {
        let stop_at = self.stop_at;
        let id = self.id;
        let (mut io, conns, shared, rdma) = self.split();
        let rdma_before = rdma.connections();
        rdma.pump(&mut io);
        rdma.arm(io.sq);
        let rdma_closed = rdma_before - rdma.connections();
        shared.connections.fetch_sub(rdma_closed, Ordering::AcqRel);
        for slot in conns.iter_mut() {
            let Some(conn) = slot else { continue };
            conn.pump(&mut io);
            if conn.can_free() {
                conn.teardown(&mut io);
                *slot = None;
                shared.connections.fetch_sub(1, Ordering::AcqRel);
            }
        }
        // Buffers held by commands: the SRQs' standing receive buffers aside.
        let in_use = io.arena.buffers_in_use() - rdma.recv_buffers();
        shared.buffers_in_use[id].store(in_use, Ordering::Relaxed);
        if let Some(t) = stop_at {
            if t.elapsed() > DRAIN_TIMEOUT {
                for c in conns.iter_mut().flatten() {
                    c.close("drain timeout at shutdown");
                }
                rdma.close_all("drain timeout at shutdown");
            }
            if t.elapsed() > DRAIN_TIMEOUT + FLUSH_TIMEOUT {
                let before = rdma.connections();
                rdma.force_free(&mut io);
                shared
                    .connections
                    .fetch_sub(before - rdma.connections(), Ordering::AcqRel);
            }
        }
    }

    fn on_tick(&mut self) {
        for c in self.conns.iter_mut().flatten() {
            c.on_tick();
        }
        self.rdma.on_tick();
    }

    fn on_wake(&mut self) {
        self.wakeup.drain();
        if self.shared.stop.load(Ordering::Acquire) && self.stop_at.is_none() {
            self.stop_at = Some(Instant::now());
            tracing::debug!(
                poller = self.id,
                connections = self.conns.iter().flatten().count(),
                "draining"
            );
        }
        while let Ok(inc) = self.incoming.try_recv() {
            match inc {
                Incoming::Tcp(sock, peer) => {
                    if self.stop_at.is_some() {
                        continue; // dropping the socket closes it
                    }
                    let idx = crate::queue::vacant(&mut self.conns);
                    tracing::debug!(poller = self.id, %peer, "connection accepted");
                    self.conns[idx] = Some(Box::new(TcpConn::new(sock, peer, idx)));
                    self.shared.connections.fetch_add(1, Ordering::AcqRel);
                }
                Incoming::Rdma(inc) => {
                    let (mut io, _, shared, rdma) = self.split();
                    if rdma.adopt(inc, &mut io) {
                        shared.connections.fetch_add(1, Ordering::AcqRel);
                    }
                }
            }
        }
    }

    fn arm_tick(&mut self) {
        let e = opcode::Timeout::new(&self.tick)
            .build()
            .user_data(Token::Tick.encode());
        self.ring.pending.push(e);
    }

    fn arm_wake(&mut self) {
        self.ring
            .pending
            .push(self.wakeup.poll(Token::Wake.encode()));
    }
}
