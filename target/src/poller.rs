//! Poller threads: each owns an io_uring that carries socket and disk I/O for
//! the connections pinned to it, and a registered buffer arena. Run to
//! completion, no locks on the I/O path; it sleeps in `io_uring_enter`.

use crate::admission::Permit;
use crate::budget::PollerBudget;
use crate::subsystem::Registry;
use crate::transport::rdma::{self, Endpoint};
use crate::transport::tcp::TcpConn;
use io_uring::{opcode, squeue, types};
use rdmablk_common::mem::Arena;
use rdmablk_common::ring::{Op, Ring, Wakeup};
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
const RING_ENTRIES: u32 = 1024;
/// What the pollers submit besides the rings' common operations: socket
/// I/O, the backends' I/O, and polls of RDMA completion and CM channels.
const RING_OPS: [Op; 6] = [
    Op(opcode::Recv::CODE, "RECV"),
    Op(opcode::SendMsg::CODE, "SENDMSG"),
    Op(opcode::ReadFixed::CODE, "READ_FIXED"),
    Op(opcode::WriteFixed::CODE, "WRITE_FIXED"),
    Op(opcode::Fsync::CODE, "FSYNC"),
    Op(opcode::Fallocate::CODE, "FALLOCATE"),
];
/// How often at most the heap is trimmed after connections went.
const TRIM_INTERVAL: Duration = Duration::from_secs(1);

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
    /// A cancellation of a closed connection's socket operation.
    Cancel,
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
            Token::Cancel => (9, 0, 0),
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
            9 => Token::Cancel,
            _ => return None,
        })
    }
}

/// Operations to push to the poller's ring at its next submit. Queueing one
/// is unsafe: the kernel reads and writes what it points to until its
/// completion is reaped, so each caller argues, where it queues, that the
/// memory stays valid and in place until then.
pub struct Submissions<'a>(&'a mut Vec<squeue::Entry>);

impl Submissions<'_> {
    /// Queues `e`.
    ///
    /// # Safety
    /// Every buffer, iovec, message header or timespec `e` points to stays
    /// valid and in place until the completion carrying `e`'s user data has
    /// been reaped.
    pub unsafe fn push(&mut self, e: squeue::Entry) {
        self.0.push(e);
    }
}

/// What connection handlers get from their poller.
pub struct Io<'a> {
    pub arena: &'a mut Arena,
    /// What the queues of this poller hold together.
    pub budget: &'a mut PollerBudget,
    /// Operations to submit after the handler returns.
    pub sq: Submissions<'a>,
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
    Tcp(TcpStream, std::net::SocketAddr, Permit),
    Rdma(rdma::Incoming),
}

/// How other threads reach a poller: hand it connections, wake it.
pub struct PollerLink {
    sender: Sender<Incoming>,
    wakeup: Wakeup,
}

impl PollerLink {
    /// Hands a new NVMe/TCP connection (holding a pending place) to the poller.
    pub fn adopt(&self, sock: TcpStream, peer: std::net::SocketAddr, pending: Permit) {
        self.send(Incoming::Tcp(sock, peer, pending));
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
    let ring = Ring::new(RING_ENTRIES, arena_bytes, &RING_OPS)?;
    let wakeup = Wakeup::new()?;
    let (sender, incoming) = mpsc::channel();
    tracing::debug!(
        poller = id,
        arena = ring.arena.len(),
        huge_pages = ring.arena.is_huge(),
        "poller ready"
    );
    let poller_wakeup = wakeup.clone();
    let discovery_limit = shared.registry.admission.limits.discovery_buffer as usize;
    let make = move || Poller {
        budget: PollerBudget::new(discovery_limit),
        freed: 0,
        trimmed: Instant::now(),
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
    budget: PollerBudget,
    /// Connections freed since the heap was last trimmed, and when that was.
    freed: usize,
    trimmed: Instant,
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
            // SAFETY: every pending operation was queued through
            // `Submissions::push` (or `arm_tick`/`arm_wake`), where its caller
            // argued that its memory stays valid until its completion.
            let submitted = if self.busy_poll {
                // SAFETY: as above.
                unsafe { self.ring.submit() }
            } else {
                // SAFETY: as above.
                unsafe { self.ring.submit_and_wait() }
            };
            if let Err(e) = submitted {
                // Operations in flight point into memory this poller owns:
                // neither unwinding nor carrying on is safe. End the process
                // (systemd restarts it) rather than leave a half-alive daemon.
                tracing::error!(poller = self.id, "io_uring failed: {e}; the daemon aborts");
                std::process::abort();
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
                budget: &mut self.budget,
                sq: Submissions(&mut self.ring.pending),
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
            Some(Token::Cancel) => {}
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
        rdma.arm(&mut io.sq);
        let rdma_closed = rdma_before - rdma.connections();
        shared.connections.fetch_sub(rdma_closed, Ordering::AcqRel);
        let mut freed = rdma_closed;
        for slot in conns.iter_mut() {
            let Some(conn) = slot else { continue };
            conn.pump(&mut io);
            if conn.can_free() {
                conn.teardown(&mut io);
                *slot = None;
                shared.connections.fetch_sub(1, Ordering::AcqRel);
                freed += 1;
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
        }
        self.freed += freed;
    }

    fn on_tick(&mut self) {
        let (mut io, conns, _, rdma) = self.split();
        for c in conns.iter_mut().flatten() {
            c.on_tick(&mut io);
        }
        rdma.on_tick(&mut io);
        self.trim_heap();
    }

    /// After connections went (a flood, a storm of reconnects), gives the
    /// heap pages they used back to the system, at most once a second.
    fn trim_heap(&mut self) {
        if self.freed == 0 || self.trimmed.elapsed() < TRIM_INTERVAL {
            return;
        }
        self.freed = 0;
        self.trimmed = Instant::now();
        // SAFETY: malloc_trim only releases free heap pages; it touches no
        // memory in use.
        unsafe { libc::malloc_trim(0) };
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
                Incoming::Tcp(sock, peer, pending) => {
                    if self.stop_at.is_some() {
                        continue; // dropping the socket closes it
                    }
                    let idx = crate::queue::vacant(&mut self.conns);
                    match TcpConn::new(sock, peer, idx, pending) {
                        Ok(c) => {
                            tracing::debug!(poller = self.id, %peer, "connection accepted");
                            self.conns[idx] = Some(Box::new(c));
                            self.shared.connections.fetch_add(1, Ordering::AcqRel);
                        }
                        Err(e) => tracing::warn!(%peer, "connection refused: {e}"),
                    }
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
        // SAFETY: the timespec is a field of this poller, which `run` owns
        // and does not move until the thread ends.
        unsafe { Submissions(&mut self.ring.pending).push(e) };
    }

    fn arm_wake(&mut self) {
        let e = self.wakeup.poll(Token::Wake.encode());
        // SAFETY: a poll points at no memory; the eventfd lives in `wakeup`.
        unsafe { Submissions(&mut self.ring.pending).push(e) };
    }
}
