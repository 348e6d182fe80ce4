//! The per-thread event loop of the host: one io_uring carries an I/O
//! queue's socket and whatever its driver (a front-end or the benchmark)
//! does, with a registered buffer arena for data. No locks, no runtime.

use super::tcp::{Done, IoQueue};
use io_uring::{opcode, squeue, types, IoUring};
use rdmablk_common::mem::Arena;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::Duration;

const RING_ENTRIES: u32 = 512;
const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const KIND_FRONT: u64 = 3;
const KIND_TICK: u64 = 4;
const KIND_WAKE: u64 = 5;

/// What a driver may use while handling an event.
pub struct Cx<'a> {
    pub arena: &'a mut Arena,
    pub queue: &'a mut IoQueue,
    sq: &'a mut Vec<squeue::Entry>,
}

impl Cx<'_> {
    /// Queues a driver operation; its completion comes back to
    /// [`Driver::on_op`] with `token`.
    pub fn submit(&mut self, e: squeue::Entry, token: u32) {
        self.sq.push(e.user_data(KIND_FRONT << 56 | token as u64));
    }
}

/// The work an engine thread does on top of its I/O queue.
pub trait Driver {
    /// Starts or continues work. Returning false asks the engine to stop
    /// once the queue is idle and no driver operation is outstanding.
    fn pump(&mut self, cx: &mut Cx) -> bool;
    /// A command finished.
    fn on_done(&mut self, done: Done, cx: &mut Cx);
    /// An operation the driver submitted finished.
    fn on_op(&mut self, _token: u32, _res: i32, _cx: &mut Cx) {}
    /// Called every tick.
    fn on_tick(&mut self, _cx: &mut Cx) {}
    /// Another thread called [`Waker::wake`].
    fn on_wake(&mut self, _cx: &mut Cx) {}
    /// Driver operations still in the ring.
    fn ops_in_flight(&self) -> usize {
        0
    }
}

/// Wakes an engine from another thread.
#[derive(Clone)]
pub struct Waker(Arc<OwnedFd>);

impl Waker {
    pub fn wake(&self) {
        // Fails only if the counter would overflow; the engine drains it.
        let _ = nix::unistd::write(&*self.0, &1u64.to_ne_bytes());
    }
}

/// How an engine whose queue died gets a new one: it reports the loss
/// (engine index, generation of the lost queue) and waits for a replacement
/// (generation, queue); the other side wakes it through its [`Waker`].
pub struct Reconnect {
    pub index: usize,
    pub lost: Sender<(usize, u64)>,
    pub replacements: Receiver<(u64, IoQueue)>,
}

/// One engine: ring, arena and I/O queue.
pub struct Engine {
    // The ring goes before the arena it has registered.
    ring: IoUring,
    arena: Arena,
    queue: IoQueue,
    sq: Vec<squeue::Entry>,
    wake: Arc<OwnedFd>,
    wake_buf: [u8; 8],
    tick: types::Timespec,
    reconnect: Option<Reconnect>,
    /// Generation of the current queue, and whether its loss was reported.
    generation: u64,
    reported: bool,
    /// A replacement waiting for the old queue's operations to drain.
    next_queue: Option<(u64, IoQueue)>,
}

impl Engine {
    /// Builds an engine with an arena of `arena_bytes` registered with the ring.
    pub fn new(queue: IoQueue, arena_bytes: usize, tick: Duration) -> io::Result<Engine> {
        let ring = IoUring::builder().build(RING_ENTRIES)?;
        let arena = Arena::new(arena_bytes, true)?;
        let iov = libc::iovec {
            iov_base: arena.base().cast(),
            iov_len: arena.len(),
        };
        // SAFETY: the arena outlives the registration: it is declared after the
        // ring in Engine and so dropped after it.
        unsafe { ring.submitter().register_buffers(&[iov]) }?;
        // SAFETY: eventfd returns a new descriptor or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Engine {
            ring,
            arena,
            queue,
            sq: Vec::new(),
            // SAFETY: `raw` is a fresh descriptor owned by nobody else.
            wake: Arc::new(unsafe { OwnedFd::from_raw_fd(raw) }),
            wake_buf: [0; 8],
            tick: types::Timespec::from(tick),
            reconnect: None,
            generation: 0,
            reported: false,
            next_queue: None,
        })
    }

    /// Makes a lost queue wait for a replacement instead of ending the run.
    pub fn with_reconnect(mut self, r: Reconnect) -> Engine {
        self.reconnect = Some(r);
        self
    }

    /// Swaps in a replacement queue once the old one is idle in the ring;
    /// reports a loss once. Returns the error ending the run, if any.
    fn handle_loss(&mut self, driver: &dyn Driver) -> Option<String> {
        if self.next_queue.is_none() {
            if let Some(r) = &self.reconnect {
                if let Ok(q) = r.replacements.try_recv() {
                    self.next_queue = Some(q);
                }
            }
        }
        if self.next_queue.is_some() && self.queue.failed().is_none() {
            self.queue.fail("replaced by a new association".into());
        }
        let why = self.queue.failed()?.to_string();
        if self.queue.ops_in_flight() {
            return None;
        }
        if let Some((generation, q)) = self.next_queue.take() {
            tracing::info!(generation, "I/O queue replaced");
            self.queue = q;
            self.generation = generation;
            self.reported = false;
            return None;
        }
        match &self.reconnect {
            Some(r) => {
                if !self.reported {
                    self.reported = true;
                    let _ = r.lost.send((r.index, self.generation));
                }
                None
            }
            None if driver.ops_in_flight() == 0 => Some(why),
            None => None,
        }
    }

    pub fn waker(&self) -> Waker {
        Waker(self.wake.clone())
    }

    /// Runs `driver` until it is finished and the queue is idle, or the queue fails.
    pub fn run(mut self, driver: &mut dyn Driver) -> Result<(), String> {
        self.arm_tick();
        self.arm_wake();
        let mut done = Vec::new();
        let mut events: Vec<(u64, i32)> = Vec::new();
        let mut finished = false;
        loop {
            // Run the driver and the queue until neither has anything new:
            // a completion may let the driver reply or submit more.
            loop {
                let mut cx = Cx {
                    arena: &mut self.arena,
                    queue: &mut self.queue,
                    sq: &mut self.sq,
                };
                if !finished {
                    finished = !driver.pump(&mut cx);
                }
                cx.queue.pump(cx.sq, KIND_RECV << 56, KIND_SEND << 56);
                cx.queue.take_done(&mut done);
                if done.is_empty() {
                    break;
                }
                for d in done.drain(..) {
                    driver.on_done(d, &mut cx);
                }
            }
            if finished && self.queue.idle() && driver.ops_in_flight() == 0 {
                return Ok(());
            }
            if let Some(why) = self.handle_loss(driver) {
                return Err(why);
            }
            self.submit_and_wait()
                .map_err(|e| format!("io_uring: {e}"))?;
            events.clear();
            events.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
            for &(ud, res) in &events {
                let mut cx = Cx {
                    arena: &mut self.arena,
                    queue: &mut self.queue,
                    sq: &mut self.sq,
                };
                match ud >> 56 {
                    KIND_RECV => cx.queue.on_recv(res),
                    KIND_SEND => cx.queue.on_send(res),
                    KIND_FRONT => driver.on_op(ud as u32, res, &mut cx),
                    KIND_TICK => driver.on_tick(&mut cx),
                    KIND_WAKE => {
                        let _ = nix::unistd::read(self.wake.as_raw_fd(), &mut self.wake_buf);
                        driver.on_wake(&mut cx);
                    }
                    _ => {}
                }
                match ud >> 56 {
                    KIND_TICK => self.arm_tick(),
                    KIND_WAKE => self.arm_wake(),
                    _ => {}
                }
            }
        }
    }

    fn submit_and_wait(&mut self) -> io::Result<()> {
        let mut pending = std::mem::take(&mut self.sq);
        for e in pending.drain(..) {
            // SAFETY: entries point at memory that outlives their completion:
            // queue buffers live in the boxed I/O queue, data in the arena or
            // in driver state that waits for its operations.
            while unsafe { self.ring.submission().push(&e) }.is_err() {
                self.ring.submit()?;
            }
        }
        self.sq = pending;
        match self.ring.submit_and_wait(1) {
            Err(e) if e.raw_os_error() != Some(libc::EINTR) => Err(e),
            _ => Ok(()),
        }
    }

    fn arm_tick(&mut self) {
        let e = opcode::Timeout::new(&self.tick)
            .build()
            .user_data(KIND_TICK << 56);
        self.sq.push(e);
    }

    fn arm_wake(&mut self) {
        let e = opcode::PollAdd::new(types::Fd(self.wake.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(KIND_WAKE << 56);
        self.sq.push(e);
    }
}
