//! The per-thread event loop of the host: one io_uring carries the I/O
//! queues of the engine's paths (one per path to the namespace) and
//! whatever its driver (a front-end or the benchmark) does, with a
//! registered buffer arena for data. No locks, no runtime. After its last
//! work it keeps polling for an adaptive window (`common::spin`), then
//! sleeps in the ring.

use super::driver_io::DriverIo;
pub use super::driver_io::{RxId, TxId};
use super::paths::Paths;
use super::{Data, Done, HostError, IoQueue};
use io_uring::{opcode, types};
use libublk::sys;
use rdmablk_common::mem::{Arena, ArenaBuf};
use rdmablk_common::ring::{Op, Ring, Submissions};
use rdmablk_common::spin::{PollMode, Spin};
use std::os::fd::RawFd;
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

const RING_ENTRIES: u32 = 512;
/// What engines submit besides the rings' common operations: socket I/O
/// (NVMe/TCP queues, NBD clients). ublk's commands are checked by its
/// front-end, which needs a kernel with ublk anyway.
const RING_OPS: [Op; 2] = [
    Op(opcode::Recv::CODE, "RECV"),
    Op(opcode::SendMsg::CODE, "SENDMSG"),
];
const KIND_RECV: u64 = 1;
const KIND_SEND: u64 = 2;
const KIND_FRONT: u64 = 3;
const KIND_TICK: u64 = 4;
const KIND_WAKE: u64 = 5;
const KIND_CANCEL: u64 = 6;
/// A driver's receive into one of its engine's buffers, whose index is in
/// bits 32 to 55 (the driver's token below).
const KIND_FRONT_RECV: u64 = 7;
/// A driver's send of one of its engine's queues, indexed as above.
const KIND_FRONT_SEND: u64 = 8;
const SLAB_SHIFT: u64 = 32;
const SLAB_MASK: u64 = 0xff_ffff;
/// Queue operations carry their path (bits 32 to 47) and the low bits of
/// their queue's generation: a late completion of a replaced queue's
/// operation is recognized and dropped.
const GENERATION_MASK: u64 = 0xffff_ffff;
const PATH_SHIFT: u64 = 32;
const PATH_MASK: u64 = 0xffff;

/// The user data of path `path`'s operation of kind `kind` in generation
/// `generation`.
fn queue_ud(kind: u64, path: usize, generation: u64) -> u64 {
    kind << 56 | (path as u64 & PATH_MASK) << PATH_SHIFT | generation & GENERATION_MASK
}

/// What a driver may use while handling an event.
pub struct Cx<'a> {
    /// The engine's arena, for the driver's data. Its queues and ring ops
    /// use it until their completions: a driver that put another arena in
    /// its place ends the process (see `Drop`).
    pub arena: &'a mut Arena,
    /// The namespace's I/O queues, one per path.
    pub paths: &'a mut Paths,
    sq: Submissions<'a>,
    io: &'a mut DriverIo,
    now: Option<Instant>,
    /// The arena's mapping when lent.
    base: *mut u8,
}

impl<'a> Cx<'a> {
    fn new(
        arena: &'a mut Arena,
        paths: &'a mut Paths,
        sq: Submissions<'a>,
        io: &'a mut DriverIo,
    ) -> Self {
        let base = arena.base();
        Cx {
            arena,
            paths,
            sq,
            io,
            now: None,
            base,
        }
    }

    /// Bytes `at..at + len` of the arena buffer `buf`, as the data of a
    /// command for [`Paths::submit`].
    ///
    /// # Panics
    /// When the range is not inside `buf`, or `buf` not in the arena.
    pub fn data(&self, buf: &ArenaBuf, at: usize, len: usize) -> Data<'a> {
        assert_eq!(
            self.arena.base(),
            self.base,
            "the engine's arena was replaced"
        );
        Data::in_arena(self.arena, buf, at, len)
    }

    /// The time, read once per round of the event loop: the completions
    /// handed over in one round arrived together.
    pub fn now(&mut self) -> Instant {
        *self.now.get_or_insert_with(Instant::now)
    }

    /// A receive buffer of `len` bytes that the engine keeps.
    pub fn rx_open(&mut self, len: usize) -> RxId {
        self.io.rx_open(len)
    }

    /// The bytes of buffer `id` the driver may use: all of them, or, while
    /// a receive into it is in flight, those before where it writes.
    pub fn rx(&mut self, id: &RxId) -> &mut [u8] {
        self.io.rx(id)
    }

    /// [`Cx::rx`] and the arena, to copy between them.
    pub fn rx_and_arena(&mut self, id: &RxId) -> (&mut [u8], &mut Arena) {
        (self.io.rx(id), &mut *self.arena)
    }

    /// Gives buffer `id` back (freed once a receive into it completes).
    pub fn rx_close(&mut self, id: RxId) {
        self.io.rx_close(id)
    }

    /// Queues a receive from socket `fd` into buffer `id` from byte `at`
    /// on; its completion comes back to [`Driver::on_op`] with `token`.
    ///
    /// # Panics
    /// When a receive into `id` is in flight, or `at` is past its end.
    pub fn recv(&mut self, fd: RawFd, id: &RxId, at: usize, token: u32) {
        let (ptr, len) = self.io.rx_start(id, at);
        let e = opcode::Recv::new(types::Fd(fd), ptr, len as u32).build();
        let ud = KIND_FRONT_RECV << 56 | (id.index() as u64) << SLAB_SHIFT | token as u64;
        // SAFETY: the receive writes into the buffer's tail, which the
        // engine keeps (`DriverIo`, dropped after the ring) and does not
        // lend until `rx_end` when this completion is reaped.
        unsafe { self.sq.push(e.user_data(ud)) };
    }

    /// Queues a receive from socket `fd` into `data`, in the arena; its
    /// completion comes back to [`Driver::on_op`] with `token`.
    pub fn recv_data(&mut self, fd: RawFd, data: Data<'_>, token: u32) {
        let e = opcode::Recv::new(types::Fd(fd), data.ptr(), data.size() as u32).build();
        // SAFETY: the receive writes into the engine's arena (`Data`), which
        // the ring drops after it has ended every operation.
        unsafe { self.sq.push(e.user_data(KIND_FRONT << 56 | token as u64)) };
    }

    /// A send queue that the engine keeps.
    pub fn tx_open(&mut self) -> TxId {
        self.io.tx_open()
    }

    /// A vector to encode a message's head into: see [`TxQueue::buf`].
    ///
    /// [`TxQueue::buf`]: rdmablk_common::tcp::stream::TxQueue::buf
    pub fn tx_buf(&mut self, id: &TxId) -> Vec<u8> {
        self.io.tx(id).buf()
    }

    /// Queues `head` on `id`; `token` comes back from [`Cx::tx_advance`]
    /// once it is sent.
    pub fn tx_push(&mut self, id: &TxId, head: Vec<u8>, token: Option<u64>) {
        self.io.tx(id).push(head, token)
    }

    /// Queues `head` followed by `data` on `id`, as [`Cx::tx_push`]. The
    /// data is sent from the arena, where the driver keeps it unchanged
    /// until the token comes back.
    pub fn tx_push_data(&mut self, id: &TxId, head: Vec<u8>, data: Data<'_>, token: Option<u64>) {
        self.io
            .tx(id)
            .push_with_body(head, data.ptr(), data.size(), None, token)
    }

    /// Whether nothing waits to be sent on `id`.
    pub fn tx_is_empty(&mut self, id: &TxId) -> bool {
        self.io.tx(id).is_empty()
    }

    /// Records that the send of `id` moved `n` bytes; the tokens of what is
    /// now all sent are appended to `done`.
    ///
    /// # Panics
    /// When a send of `id` is in flight.
    pub fn tx_advance(&mut self, id: &TxId, n: usize, done: &mut Vec<u64>) {
        self.io.tx_advance(id, n, done)
    }

    /// Gives queue `id` back (freed once its send completes).
    pub fn tx_close(&mut self, id: TxId) {
        self.io.tx_close(id)
    }

    /// Queues a send (MSG_NOSIGNAL) of what `id` holds on socket `fd`; its
    /// completion comes back to [`Driver::on_op`] with `token`.
    ///
    /// # Panics
    /// When a send of `id` is in flight.
    pub fn send(&mut self, fd: RawFd, id: &TxId, token: u32) {
        let msg = self.io.tx_start(id);
        let e = opcode::SendMsg::new(types::Fd(fd), msg)
            .flags(libc::MSG_NOSIGNAL as u32)
            .build();
        let ud = KIND_FRONT_SEND << 56 | (id.index() as u64) << SLAB_SHIFT | token as u64;
        // SAFETY: the message header, its iovecs and the heads they point to
        // are the queue's, which the engine keeps (`DriverIo`, dropped after
        // the ring) and lets no one rebuild or advance until `tx_end` when
        // this completion is reaped (pushing more leaves them in place:
        // `TxQueue::message`); bodies are in the arena (`Cx::tx_push_data`).
        unsafe { self.sq.push(e.user_data(ud)) };
    }

    /// Queues the ublk io command `op` (`UBLK_U_IO_FETCH_REQ` or
    /// `UBLK_U_IO_COMMIT_AND_FETCH_REQ`) `cmd` on the ublk char device
    /// `cdev`, its data buffer the arena buffer `buf` (whatever `cmd.addr`
    /// says); its completion comes back to [`Driver::on_op`] with `token`.
    pub fn ublk_io_cmd(
        &mut self,
        cdev: RawFd,
        op: u32,
        cmd: sys::ublksrv_io_cmd,
        buf: &ArenaBuf,
        token: u32,
    ) {
        let addr = self.data(buf, 0, buf.capacity()).ptr() as u64;
        let mut bytes = [0u8; 16];
        bytes[0..2].copy_from_slice(&cmd.q_id.to_ne_bytes());
        bytes[2..4].copy_from_slice(&cmd.tag.to_ne_bytes());
        bytes[4..8].copy_from_slice(&cmd.result.to_ne_bytes());
        bytes[8..16].copy_from_slice(&addr.to_ne_bytes());
        let e = opcode::UringCmd16::new(types::Fd(cdev), op)
            .cmd(bytes)
            .build();
        // SAFETY: the command is copied into the SQE; the only memory it
        // names is `buf`, in the engine's arena, which the ring drops after
        // it has ended every operation (`Ring`'s field order) and which
        // `Drop` keeps from being replaced meanwhile.
        unsafe { self.sq.push(e.user_data(KIND_FRONT << 56 | token as u64)) };
    }
}

impl Drop for Cx<'_> {
    fn drop(&mut self) {
        if self.arena.base() != self.base {
            // Queues and ring operations still use the old arena, which the
            // driver now owns and may unmap: nothing may run after this.
            eprintln!("rdmablk: a driver replaced its engine's arena");
            std::process::abort();
        }
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
    /// The engine stopped; what it did meanwhile.
    fn on_end(&mut self, _activity: Activity) {}
    /// Driver operations still in the ring.
    fn ops_in_flight(&self) -> usize {
        0
    }
}

/// How an engine's run went, for the benchmark's batching figures.
#[derive(Clone, Copy, Debug, Default)]
pub struct Activity {
    /// Times it slept in its ring (each ended by a wake-up).
    pub sleeps: u64,
    /// Socket sends its NVMe/TCP queues made.
    pub sends: u64,
}

/// Wakes an engine from another thread.
pub use rdmablk_common::ring::Wakeup as Waker;

/// A lost queue: (engine index, path, generation of the lost queue).
pub type Lost = (usize, usize, u64);
/// What the keeper of a path tells the engines.
pub enum PathChange {
    /// The path's association is gone (its keep-alive failed, say): its
    /// queue fails now, and its commands go to another path.
    Lost(usize),
    /// A new queue for the path: (path, generation, queue).
    Replaced(usize, u64, IoQueue),
}

/// How an engine whose queue on a path died gets a new one: it reports the
/// loss and waits for a replacement; the other side wakes it through its
/// [`Waker`].
pub struct Reconnect {
    pub index: usize,
    pub lost: Sender<Lost>,
    pub changes: Receiver<PathChange>,
}

/// One engine: ring, arena and the I/O queues of its paths.
pub struct Engine {
    /// Declared before the ring: a queue's memory registration goes before
    /// the arena.
    paths: Paths,
    ring: Ring,
    /// Declared after the ring: its operations point into it.
    io: DriverIo,
    wakeup: Waker,
    tick: types::Timespec,
    reconnect: Reconnect,
    /// When it sleeps in the ring rather than polling.
    spin: Spin,
}

impl Engine {
    /// Builds an engine with an arena of `arena_bytes` registered with the
    /// ring; a lost queue is reported, and replaced, through `reconnect`.
    pub fn new(
        mut paths: Paths,
        arena_bytes: usize,
        tick: Duration,
        reconnect: Reconnect,
    ) -> Result<Engine, HostError> {
        let ring = Ring::new(RING_ENTRIES, arena_bytes, &RING_OPS)?;
        // SAFETY: the engine owns both and drops the paths first.
        unsafe { paths.register_arena(&ring.arena) }?;
        Ok(Engine {
            ring,
            paths,
            io: DriverIo::default(),
            wakeup: Waker::new()?,
            tick: types::Timespec::from(tick),
            reconnect,
            spin: Spin::new(PollMode::default()),
        })
    }

    /// How the engine waits: busy polling never sleeps (and NVMe/RDMA
    /// queues arm no completion channel); adaptive polling spins for a
    /// window after the last work, then sleeps.
    pub fn with_poll_mode(mut self, mode: PollMode) -> Engine {
        self.spin = Spin::new(mode);
        self.paths.set_busy_poll(self.spin.busy());
        self
    }

    /// Takes replacement queues; swaps them in once the old ones are idle
    /// in the ring; reports each loss once. Returns the error ending the
    /// run, if any.
    fn handle_loss(&mut self) -> Option<String> {
        while let Ok(change) = self.reconnect.changes.try_recv() {
            match change {
                PathChange::Lost(path) => self.paths.fail(path, "its association was lost"),
                PathChange::Replaced(path, generation, q) => {
                    self.paths.replace(path, generation, q)
                }
            }
        }
        let (ring, r) = (&mut self.ring, &self.reconnect);
        let mut cancels = Vec::new();
        // SAFETY: the engine owns both and drops the paths first.
        let settled = unsafe {
            self.paths.settle_losses(
                &ring.arena,
                self.spin.busy(),
                |path, generation| {
                    let _ = r.lost.send((r.index, path, generation));
                },
                |path, old| cancels.push((path, old)),
            )
        };
        for (path, old) in cancels {
            // The replaced queue's polls that may still be in the ring.
            for kind in [KIND_RECV, KIND_SEND] {
                let cancel = opcode::AsyncCancel::new(queue_ud(kind, path, old))
                    .build()
                    .user_data(KIND_CANCEL << 56);
                // SAFETY: a cancellation names its target by user data and
                // points at no memory.
                unsafe { ring.submissions().push(cancel) };
            }
        }
        settled.err()
    }

    pub fn waker(&self) -> Waker {
        self.wakeup.clone()
    }

    /// Runs `driver` until it is finished and the queue is idle, or the queue fails.
    pub fn run(mut self, driver: &mut dyn Driver) -> Result<(), String> {
        self.arm_tick();
        self.arm_wake();
        let mut done = Vec::new();
        let mut events: Vec<(u64, i32)> = Vec::new();
        let mut finished = false;
        // Whether the last round reaped anything: a polling engine whose
        // ring had nothing new goes straight back to it.
        let mut news = true;
        let mut sleep = false;
        loop {
            if news {
                self.settle(driver, &mut finished, &mut done);
            }
            if finished && self.paths.idle() && driver.ops_in_flight() == 0 {
                driver.on_end(Activity {
                    sleeps: self.spin.sleeps(),
                    sends: self.paths.sends(),
                });
                return Ok(());
            }
            if let Some(why) = self.handle_loss() {
                return Err(why);
            }
            // SAFETY: queued operations point at memory that outlives their
            // completion: queue buffers live in the boxed I/O queue (swapped
            // only once idle in the ring), data in the arena or in driver state
            // that waits for its operations, the tick timespec in the Engine.
            let submitted = unsafe {
                if sleep {
                    self.ring.submit_and_wait()
                } else {
                    self.ring.submit()
                }
            };
            submitted.map_err(|e| format!("io_uring: {e}"))?;
            events.clear();
            self.ring.reap(&mut events);
            let mut worked = events.iter().any(|&(ud, _)| {
                matches!(
                    ud >> 56,
                    KIND_RECV | KIND_SEND | KIND_FRONT | KIND_FRONT_RECV | KIND_FRONT_SEND
                )
            });
            if !sleep && self.paths.poll_direct() {
                worked = true;
            }
            news = worked || !events.is_empty() || sleep;
            for &(ud, res) in &events {
                let (arena, sq) = self.ring.arena_and_submissions();
                let mut cx = Cx::new(arena, &mut self.paths, sq, &mut self.io);
                let path = (ud >> PATH_SHIFT & PATH_MASK) as usize;
                let current = |cx: &Cx| {
                    path < cx.paths.len()
                        && ud & GENERATION_MASK == cx.paths.generation(path) & GENERATION_MASK
                };
                match ud >> 56 {
                    KIND_RECV | KIND_SEND if !current(&cx) => {
                        // An operation of a replaced queue.
                    }
                    KIND_RECV => cx.paths.on_receive_done(path, res),
                    KIND_SEND => cx.paths.on_send_done(path, res),
                    KIND_FRONT => driver.on_op(ud as u32, res, &mut cx),
                    KIND_FRONT_RECV => {
                        cx.io.rx_end((ud >> SLAB_SHIFT & SLAB_MASK) as u32);
                        driver.on_op(ud as u32, res, &mut cx);
                    }
                    KIND_FRONT_SEND => {
                        cx.io.tx_end((ud >> SLAB_SHIFT & SLAB_MASK) as u32);
                        driver.on_op(ud as u32, res, &mut cx);
                    }
                    KIND_TICK => driver.on_tick(&mut cx),
                    KIND_WAKE => {
                        self.wakeup.drain();
                        driver.on_wake(&mut cx);
                    }
                    _ => {}
                }
                drop(cx);
                match ud >> 56 {
                    KIND_TICK => self.arm_tick(),
                    KIND_WAKE => self.arm_wake(),
                    _ => {}
                }
            }
            sleep = self.spin.sleep_next(worked);
        }
    }

    /// Runs the driver and the queue until neither has anything new: a
    /// completion may let the driver reply or submit more.
    fn settle(&mut self, driver: &mut dyn Driver, finished: &mut bool, done: &mut Vec<Done>) {
        loop {
            let (arena, sq) = self.ring.arena_and_submissions();
            let mut cx = Cx::new(arena, &mut self.paths, sq, &mut self.io);
            if !*finished {
                *finished = !driver.pump(&mut cx);
            }
            cx.paths.pump(&mut cx.sq, |path, generation| {
                (
                    queue_ud(KIND_RECV, path, generation),
                    queue_ud(KIND_SEND, path, generation),
                )
            });
            cx.paths.take_done(done);
            if done.is_empty() {
                return;
            }
            for d in done.drain(..) {
                driver.on_done(d, &mut cx);
            }
        }
    }

    fn arm_tick(&mut self) {
        let e = opcode::Timeout::new(&self.tick)
            .build()
            .user_data(KIND_TICK << 56);
        // SAFETY: the timespec is a field of the engine, which `run` holds in
        // place while it drives the ring; the ring is dropped first (field
        // order).
        unsafe { self.ring.submissions().push(e) };
    }

    fn arm_wake(&mut self) {
        let e = self.wakeup.poll(KIND_WAKE << 56);
        // SAFETY: a poll points at no memory; the eventfd lives in `wakeup`.
        unsafe { self.ring.submissions().push(e) };
    }
}
