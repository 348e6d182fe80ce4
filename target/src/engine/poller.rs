//! Poller threads: each owns an io_uring that carries socket and disk I/O for
//! the connections pinned to it, and a registered buffer arena. Run to
//! completion, no locks on the I/O path; after its last work it keeps
//! polling for an adaptive window (`common::spin`), then sleeps in
//! `io_uring_enter`. While other threads carry out its operations (librbd's,
//! `base::sched`), it yields its CPU to them after each round that worked.

use crate::base::budget::PollerBudget;
use crate::base::completions::Completions;
use crate::base::metrics::PollerCounters;
use crate::nvme::subsystem::Registry;
use io_uring::{opcode, types};
use rdmablk_common::mem::Arena;
use rdmablk_common::ring::{Op, Ring, Submissions, Wakeup};
use rdmablk_common::spin::{PollMode, Spin};
use std::any::Any;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often connections are checked for timeouts.
pub const TICK: Duration = Duration::from_millis(100);
/// How long a stopping poller waits for in-flight commands.
const SHUTDOWN_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after the stop a poller gives up on queues still closing: their
/// backend operations never ended (a hung disk, a cluster out of reach, an
/// operation librbd cannot cancel). It leaves them, and the daemon stops
/// without them, within systemd's stop timeout.
const SHUTDOWN_GIVE_UP: Duration = Duration::from_secs(15);
const RING_ENTRIES: u32 = 1024;
/// What the backends submit besides the rings' common operations (the
/// transports add theirs).
const BACKEND_OPS: [Op; 4] = [
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
    Tick,
    Wake,
    /// The time of a command held back by QoS limits came.
    QosRelease,
    /// A cancellation of a closed queue's operation.
    Cancel,
    /// A backend operation of command `slot` of queue `queue` on endpoint `ep`.
    Backend {
        ep: u8,
        queue: u32,
        slot: u16,
    },
    /// An endpoint's own operation (socket I/O, a channel poll): `what`
    /// and `queue` are the endpoint's to interpret.
    Endpoint {
        ep: u8,
        queue: u32,
        what: u16,
    },
}

impl Token {
    pub fn encode(self) -> u64 {
        let (kind, ep, queue, low) = match self {
            Token::Tick => (1u64, 0, 0, 0),
            Token::Wake => (2, 0, 0, 0),
            Token::Cancel => (3, 0, 0, 0),
            Token::QosRelease => (6, 0, 0, 0),
            Token::Backend { ep, queue, slot } => (4, ep, queue, slot),
            Token::Endpoint { ep, queue, what } => (5, ep, queue, what),
        };
        kind << 56 | (ep as u64) << 48 | (queue as u64) << 16 | low as u64
    }

    fn decode(v: u64) -> Option<Token> {
        let ep = (v >> 48) as u8;
        let queue = (v >> 16) as u32;
        let low = v as u16;
        Some(match v >> 56 {
            1 => Token::Tick,
            2 => Token::Wake,
            3 => Token::Cancel,
            6 => Token::QosRelease,
            4 => Token::Backend {
                ep,
                queue,
                slot: low,
            },
            5 => Token::Endpoint {
                ep,
                queue,
                what: low,
            },
            _ => return None,
        })
    }
}

/// A transport's side of one poller: the queues it keeps there and what
/// it shares among them. The poller drives every endpoint the same way.
pub trait Endpoint {
    /// Takes a new queue its transport's listener handed over; returns
    /// whether one was added.
    fn adopt(&mut self, conn: Box<dyn Any + Send>, io: &mut Io) -> bool;
    /// One of the endpoint's own operations completed with `res`.
    fn on_completion(&mut self, queue: u32, what: u16, res: i32, io: &mut Io);
    /// A backend operation of command `slot` of `queue` completed.
    fn on_backend(&mut self, queue: u32, slot: u16, res: i32, io: &mut Io);
    /// Checks deadlines (every [`TICK`]); every queue is pumped next.
    fn on_tick(&mut self, io: &mut Io);
    /// Lets the queues that had an event or still have work make progress
    /// (every queue after a tick or while stopping: `engine::ready`), arms
    /// what must be polled, and frees closed queues; returns how many were
    /// freed.
    fn pump(&mut self, io: &mut Io) -> usize;
    /// While the poller spins: takes completions that arrive without a ring
    /// event; returns whether there were any.
    fn poll(&mut self, _io: &mut Io) -> bool {
        false
    }
    /// Queues alive.
    fn queues(&self) -> usize;
    /// Backend operations in flight for the queues' commands.
    fn backend_ops(&self) -> usize;
    /// Arena buffers the endpoint holds itself (standing receive buffers),
    /// not for commands.
    fn standing_buffers(&self) -> usize {
        0
    }
    /// Starts closing every queue.
    fn close_all(&mut self, why: &str);
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
    /// I/O commands this poller has answered (the stats file).
    pub answered: &'a mut u64,
    /// Socket sends it has made (each carries what its queue had to send).
    pub sends: &'a mut u64,
    /// The poller's index (its slot in namespaces' metrics).
    pub poller: usize,
    /// Where backend operations off the ring (librbd's) complete.
    pub completions: &'a Arc<Completions>,
    /// When the poller must wake at the latest (a command held back by
    /// QoS limits may go then).
    pub wake_at: &'a mut Option<Instant>,
    /// A time of held commands came (or a tick passed): queues holding
    /// some look at them this round.
    pub qos_release_due: bool,
}

impl Io<'_> {
    /// Makes the poller wake by `t`.
    pub fn wake_by(&mut self, t: Instant) {
        *self.wake_at = Some(self.wake_at.map_or(t, |w| w.min(t)));
    }
}

/// State shared by all pollers.
pub struct Shared {
    pub registry: Arc<Registry>,
    pub stop: AtomicBool,
    /// Connections alive across all pollers.
    pub connections: AtomicUsize,
    /// Arena buffers in use, per poller (for the stats file).
    pub buffers_in_use: Vec<AtomicUsize>,
    /// I/O commands answered, per poller (for the stats file).
    pub io_commands: Vec<AtomicU64>,
    /// Each poller's own metrics.
    pub pollers: Vec<PollerCounters>,
    /// How the pollers wait for work.
    pub poll_mode: PollMode,
    /// Queues that stopping pollers left with backend operations in flight.
    pub undrained: AtomicUsize,
    /// The backend operations in flight on those queues.
    pub undrained_ops: AtomicUsize,
}

/// A new queue for a poller, from the listener of the transport whose
/// endpoint index is `ep`.
struct Handover {
    ep: u8,
    conn: Box<dyn Any + Send>,
}

/// How other threads reach a poller: hand it queues, wake it.
pub struct PollerLink {
    sender: Sender<Handover>,
    wakeup: Wakeup,
}

impl PollerLink {
    /// Hands a new queue to the poller's endpoint `ep`, which knows its type.
    pub fn adopt(&self, ep: u8, conn: Box<dyn Any + Send>) {
        if self.sender.send(Handover { ep, conn }).is_ok() {
            self.wakeup.wake();
        }
    }

    /// Wakes the poller so it notices the stop flag.
    pub fn wake(&self) {
        self.wakeup.wake();
    }
}

/// What the transports bring to every poller (the application gathers it:
/// the poller names no transport).
pub struct Transports {
    /// The io_uring operations their endpoints submit (probed at start).
    pub ring_ops: Vec<Op>,
    /// The endpoints of poller `id`, one per transport, indexed as
    /// [`Token`]s name them.
    pub endpoints: fn(id: usize) -> Vec<Box<dyn Endpoint>>,
}

/// Creates a poller (ring, arena, registration) and starts its thread,
/// with an endpoint of every transport.
pub fn spawn(
    id: usize,
    shared: Arc<Shared>,
    arena_bytes: usize,
    mode: PollMode,
    transports: &Transports,
) -> io::Result<(PollerLink, JoinHandle<()>)> {
    let ops: Vec<Op> = BACKEND_OPS
        .into_iter()
        .chain(transports.ring_ops.iter().copied())
        .collect();
    let ring = Ring::new(RING_ENTRIES, arena_bytes, &ops)?;
    let wakeup = Wakeup::new()?;
    let (sender, incoming) = mpsc::channel();
    tracing::debug!(
        poller = id,
        arena = ring.arena.len(),
        huge_pages = ring.arena.is_huge(),
        "poller ready"
    );
    let poller_wakeup = wakeup.clone();
    let completions = Completions::new(wakeup.clone());
    let discovery_limit = shared.registry.admission.limits.discovery_buffer as usize;
    let endpoints = transports.endpoints;
    let make = move || Poller {
        endpoints: endpoints(id),
        budget: PollerBudget::new(discovery_limit),
        answered: 0,
        sends: 0,
        freed: 0,
        trimmed: Instant::now(),
        ring,
        spin: Spin::new(mode),
        id,
        incoming,
        wakeup: poller_wakeup,
        completions,
        off_ring: Vec::new(),
        tick: types::Timespec::from(TICK),
        wake_at: None,
        qos_release_due: false,
        qos_release_armed: None,
        qos_release_in: types::Timespec::new(),
        shared,
        stop_at: None,
        ends_seen: crate::nvme::controller::ends(),
    };
    let thread = std::thread::Builder::new()
        .name(format!("poller-{id}"))
        .spawn(move || make().run())?;
    Ok((PollerLink { sender, wakeup }, thread))
}

struct Poller {
    /// One per transport, indexed as `Token`s name them. Declared before
    /// the ring: their memory registrations go before the arena.
    endpoints: Vec<Box<dyn Endpoint>>,
    ring: Ring,
    budget: PollerBudget,
    /// I/O commands answered.
    answered: u64,
    /// Socket sends made.
    sends: u64,
    /// Queues freed since the heap was last trimmed, and when that was.
    freed: usize,
    trimmed: Instant,
    /// When it sleeps in io_uring_enter rather than polling.
    spin: Spin,
    id: usize,
    incoming: Receiver<Handover>,
    wakeup: Wakeup,
    /// Backend completions that arrive beside the ring; they wake it
    /// through `wakeup`.
    completions: Arc<Completions>,
    /// Those being dispatched (kept for its capacity).
    off_ring: Vec<(u64, i32)>,
    tick: types::Timespec,
    /// When a command held back by QoS limits may go next, as far as the
    /// queues said; whether that time (or a tick) came this round.
    wake_at: Option<Instant>,
    qos_release_due: bool,
    /// The earliest time a release timer is armed for, and its timeout.
    qos_release_armed: Option<Instant>,
    qos_release_in: types::Timespec,
    shared: Arc<Shared>,
    /// When the stop was noticed.
    stop_at: Option<Instant>,
    /// Controllers ended (`nvme::controller::ends`) as last looked at.
    ends_seen: u64,
}

impl Poller {
    fn run(mut self) {
        self.arm_wake();
        self.arm_tick();
        let mut completions: Vec<(u64, i32)> = Vec::with_capacity(RING_ENTRIES as usize);
        let mut sleep = false;
        loop {
            // SAFETY: every pending operation was queued through
            // `Submissions::push`, where its caller argued that its memory
            // stays valid until its completion.
            let submitted = if sleep {
                // SAFETY: as above.
                unsafe { self.ring.submit_and_wait() }
            } else {
                // SAFETY: as above.
                unsafe { self.ring.submit() }
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
            let mut worked = false;
            for &(ud, res) in &completions {
                worked |= self.dispatch(ud, res);
            }
            if !sleep {
                let (mut io, endpoints, _) = self.split();
                for e in endpoints.iter_mut() {
                    worked |= e.poll(&mut io);
                }
            }
            self.pump_endpoints();
            self.arm_qos_release();
            sleep = self.spin.sleep_next(worked);
            if !sleep && worked && self.completions.away() > 0 {
                // Threads that carry out this poller's operations wait for
                // its CPU (`base::sched`): they finish what arrived, and it
                // comes back together, next round.
                std::thread::yield_now();
            }
            if sleep {
                let counters = &self.shared.pollers[self.id];
                counters.sleeps.set(self.spin.sleeps());
                counters
                    .spin_window_ns
                    .set(self.spin.window().as_nanos() as u64);
            }
            let Some(stop_at) = self.stop_at else {
                continue;
            };
            let left: usize = self.endpoints.iter().map(|e| e.queues()).sum();
            if left == 0 {
                break;
            }
            if stop_at.elapsed() > SHUTDOWN_GIVE_UP {
                tracing::error!(
                    poller = self.id,
                    queues = left,
                    "backend operations still in flight {}s after the stop; leaving their queues",
                    SHUTDOWN_GIVE_UP.as_secs()
                );
                self.shared.undrained.fetch_add(left, Ordering::AcqRel);
                let ops = self.endpoints.iter().map(|e| e.backend_ops()).sum();
                self.shared.undrained_ops.fetch_add(ops, Ordering::AcqRel);
                // Those operations may still read or fill arena buffers and
                // complete on the ring: both stay for the process's life.
                std::mem::forget(self);
                return;
            }
        }
        tracing::debug!(poller = self.id, "poller stopped");
    }

    /// Splits the poller into what endpoints need and the endpoints.
    fn split(&mut self) -> (Io<'_>, &mut Vec<Box<dyn Endpoint>>, &Shared) {
        let (arena, sq) = self.ring.arena_and_submissions();
        (
            Io {
                arena,
                budget: &mut self.budget,
                sq,
                registry: &self.shared.registry,
                stopping: self.stop_at.is_some(),
                answered: &mut self.answered,
                sends: &mut self.sends,
                poller: self.id,
                completions: &self.completions,
                wake_at: &mut self.wake_at,
                qos_release_due: self.qos_release_due,
            },
            &mut self.endpoints,
            &self.shared,
        )
    }

    /// Hands a completion to what it belongs to; returns whether it was
    /// I/O work (a queue's or a backend's) rather than the poller's own.
    fn dispatch(&mut self, ud: u64, res: i32) -> bool {
        match Token::decode(ud) {
            Some(Token::Tick) => {
                // (Also lets go commands whose limits were replaced.)
                self.qos_release_due = true;
                self.on_tick();
                self.arm_tick();
            }
            Some(Token::Wake) => {
                self.on_wake();
                let worked = self.dispatch_off_ring();
                self.arm_wake();
                return worked;
            }
            Some(Token::Cancel) => return false,
            Some(Token::QosRelease) => {
                // Queues let their commands go when pumped, next.
                self.qos_release_due = true;
                if self.qos_release_armed.is_some_and(|t| t <= Instant::now()) {
                    self.qos_release_armed = None;
                }
            }
            Some(Token::Backend { ep, queue, slot }) => {
                let (mut io, endpoints, _) = self.split();
                if let Some(e) = endpoints.get_mut(ep as usize) {
                    e.on_backend(queue, slot, res, &mut io);
                }
                return true;
            }
            Some(Token::Endpoint { ep, queue, what }) => {
                let (mut io, endpoints, _) = self.split();
                if let Some(e) = endpoints.get_mut(ep as usize) {
                    e.on_completion(queue, what, res, &mut io);
                }
                return true;
            }
            None => tracing::error!(poller = self.id, ud, "completion with unknown user data"),
        }
        false
    }

    /// Lets the endpoints' queues make progress, and frees the finished
    /// ones.
    fn pump_endpoints(&mut self) {
        let stop_at = self.stop_at;
        let id = self.id;
        // Queues with held commands look at them when a time came, and
        // say when the next may go.
        if self.qos_release_due {
            self.wake_at = None;
        }
        let (mut io, endpoints, shared) = self.split();
        let mut freed = 0;
        for e in endpoints.iter_mut() {
            freed += e.pump(&mut io);
        }
        shared.connections.fetch_sub(freed, Ordering::AcqRel);
        // Buffers held by commands: the endpoints' standing ones aside.
        let standing: usize = endpoints.iter().map(|e| e.standing_buffers()).sum();
        let in_use = io.arena.buffers_in_use() - standing;
        shared.buffers_in_use[id].store(in_use, Ordering::Relaxed);
        // Bytes include standing receive buffers (NVMe/RDMA's SRQ).
        shared.pollers[id]
            .arena_bytes
            .set(io.arena.bytes_in_use() as u64);
        shared.io_commands[id].store(*io.answered, Ordering::Relaxed);
        shared.pollers[id].sends.set(*io.sends);
        if stop_at.is_some_and(|t| t.elapsed() > SHUTDOWN_DRAIN_TIMEOUT) {
            for e in endpoints.iter_mut() {
                e.close_all("drain timeout at shutdown");
            }
        }
        self.freed += freed;
        self.qos_release_due = false;
    }

    /// Dispatches the backend completions recorded beside the ring (after
    /// the wake-up they raised was drained, so none is missed); returns
    /// whether there were any.
    fn dispatch_off_ring(&mut self) -> bool {
        let mut done = std::mem::take(&mut self.off_ring);
        self.completions.take(&mut done);
        for &(ud, res) in &done {
            self.dispatch(ud, res);
        }
        let any = !done.is_empty();
        done.clear();
        self.off_ring = done;
        any
    }

    fn on_tick(&mut self) {
        let busy = rdmablk_common::usage::thread_cpu().as_nanos() as u64;
        self.shared.pollers[self.id].busy_ns.set(busy);
        let (mut io, endpoints, _) = self.split();
        for e in endpoints.iter_mut() {
            e.on_tick(&mut io);
        }
        self.trim_heap();
    }

    /// After queues went (a flood, a storm of reconnects), gives the heap
    /// pages they used back to the system, at most once a second.
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
        // A controller ended: its queues here close now, not at the tick.
        let ends = crate::nvme::controller::ends();
        if ends != self.ends_seen {
            self.ends_seen = ends;
            self.on_tick();
        }
        if self.shared.stop.load(Ordering::Acquire) && self.stop_at.is_none() {
            self.stop_at = Some(Instant::now());
            tracing::debug!(
                poller = self.id,
                queues = self.endpoints.iter().map(|e| e.queues()).sum::<usize>(),
                "draining"
            );
        }
        while let Ok(inc) = self.incoming.try_recv() {
            let (mut io, endpoints, shared) = self.split();
            let Some(e) = endpoints.get_mut(inc.ep as usize) else {
                continue;
            };
            // While stopping, endpoints refuse what arrives.
            if e.adopt(inc.conn, &mut io) {
                shared.connections.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    fn arm_tick(&mut self) {
        let e = opcode::Timeout::new(&self.tick)
            .build()
            .user_data(Token::Tick.encode());
        // SAFETY: the timespec is a field of this poller, which `run` owns
        // and does not move until the thread ends.
        unsafe { self.ring.submissions().push(e) };
    }

    /// Arms a timer for the next held command, unless one that fires
    /// earlier is armed.
    fn arm_qos_release(&mut self) {
        let Some(at) = self.wake_at else { return };
        if self.qos_release_armed.is_some_and(|armed| armed <= at) {
            return;
        }
        self.qos_release_in = types::Timespec::from(at.saturating_duration_since(Instant::now()));
        let e = opcode::Timeout::new(&self.qos_release_in)
            .build()
            .user_data(Token::QosRelease.encode());
        // SAFETY: the timespec is a field of this poller, which `run` owns
        // and does not move until the thread ends; it is not changed before
        // the next submission, which reads it (at most one arm per round).
        unsafe { self.ring.submissions().push(e) };
        self.qos_release_armed = Some(at);
    }

    fn arm_wake(&mut self) {
        let e = self.wakeup.poll(Token::Wake.encode());
        // SAFETY: a poll points at no memory; the eventfd lives in `wakeup`.
        unsafe { self.ring.submissions().push(e) };
    }
}

#[cfg(test)]
mod tests {
    use super::Token;

    #[test]
    fn tokens_survive_the_user_data() {
        for t in [
            Token::Tick,
            Token::Wake,
            Token::Cancel,
            Token::QosRelease,
            Token::Backend {
                ep: 1,
                queue: u32::MAX,
                slot: 255,
            },
            Token::Endpoint {
                ep: 255,
                queue: 7,
                what: u16::MAX,
            },
        ] {
            assert_eq!(Token::decode(t.encode()), Some(t));
        }
    }
}
