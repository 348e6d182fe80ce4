//! An engine's I/O queues to one namespace: one per path (an association
//! with one controller of the subsystem, through one gateway), and the
//! choice among them, following ANA (NVMe Base 2.1, 8.1.3).
//!
//! A command goes to the live path whose ANA state is optimized and which
//! has the fewest commands outstanding (the most free slots): with equal
//! gateways that spreads I/O evenly, and a slower or busier gateway gets
//! less of it, which round-robin would not do. Non-optimized paths are used
//! only while no optimized path is live; inaccessible, persistent-loss and
//! changing ones never. A command that fails for a path reason (a path
//! status, SCT 3h; a queue that died) is sent again on another usable path
//! before its driver sees it; with none, the driver gets it back as a
//! transient transport error and waits, as it does for a lost association.

use super::io_queue::Cmd;
use super::{Data, Done, IoQueue};
use rdmablk_common::mem::Arena;
use rdmablk_common::nvme::ana::AnaState;
use rdmablk_common::nvme::{Cqe, Sqe, Status};
use rdmablk_common::ring::Submissions;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

/// Times one command is sent again on another path before its driver gets
/// the path's error.
const MAX_REROUTES: u8 = 8;

/// What the keeper and an engine share of a path: the ANA state of the
/// namespace's group on it (read from its ANA log by the keeper) and a
/// request to read the log again (set by an engine after a path status).
#[derive(Debug)]
pub struct PathState {
    ana: AtomicU8,
    recheck: AtomicBool,
}

impl Default for PathState {
    fn default() -> Self {
        PathState {
            ana: AtomicU8::new(AnaState::Optimized as u8),
            recheck: AtomicBool::new(false),
        }
    }
}

impl PathState {
    /// The state the host last learnt.
    pub fn ana(&self) -> AnaState {
        AnaState::from_code(self.ana.load(Ordering::Acquire)).unwrap_or(AnaState::Inaccessible)
    }

    pub fn set_ana(&self, s: AnaState) {
        self.ana.store(s as u8, Ordering::Release);
    }

    /// Whether an engine asked for the ANA log to be read again (and clears it).
    pub fn take_recheck(&self) -> bool {
        self.recheck.swap(false, Ordering::AcqRel)
    }

    /// A path status came back: the state is not what the host thinks.
    fn distrust(&self, status: Status) {
        let now = match status {
            Status::ANA_PERSISTENT_LOSS => AnaState::PersistentLoss,
            Status::ANA_TRANSITION => AnaState::Change,
            _ => AnaState::Inaccessible,
        };
        self.set_ana(now);
        self.recheck.store(true, Ordering::Release);
    }
}

/// One path of an engine.
struct Path {
    /// Its I/O queue (None before the first and between losses, never in
    /// practice: a lost queue stays until its replacement comes).
    queue: IoQueue,
    state: Arc<PathState>,
    /// Generation of the queue: operations of a replaced one are dropped.
    generation: u64,
    /// Its loss was reported to the keeper.
    reported: bool,
    /// A replacement waiting for the old queue's operations to drain.
    next: Option<(u64, IoQueue)>,
}

impl Path {
    fn live(&self) -> bool {
        self.queue.failed().is_none()
    }
}

/// The I/O queues of one engine, one per path, as its driver submits to
/// them.
pub struct Paths {
    paths: Vec<Path>,
    /// Commands not yet completed to the driver, with the driver's tags,
    /// by slot (the tag the queues see).
    cmds: Vec<Option<Cmd>>,
    free: Vec<u32>,
    /// Commands that failed on a path and wait for another.
    rerouted: VecDeque<u32>,
    /// Completions the driver gets.
    done: Vec<Done>,
    /// Scratch for one queue's completions.
    scratch: Vec<Done>,
}

// SAFETY: the commands' raw buffer pointers point into the engine's arena
// (see `Data`), which the engine may use from any thread; nothing is tied
// to the creating thread.
unsafe impl Send for Paths {}

/// Which paths take new commands: the optimized live ones, else the
/// non-optimized live ones.
fn preferred(paths: &[Path]) -> Option<AnaState> {
    [AnaState::Optimized, AnaState::NonOptimized]
        .into_iter()
        .find(|s| paths.iter().any(|p| p.live() && p.state.ana() == *s))
}

impl Paths {
    /// The paths `queues` (with the states the keeper keeps for them).
    pub fn new(queues: Vec<(IoQueue, Arc<PathState>)>) -> Paths {
        Paths {
            paths: queues
                .into_iter()
                .map(|(queue, state)| Path {
                    queue,
                    state,
                    generation: 0,
                    reported: false,
                    next: None,
                })
                .collect(),
            cmds: Vec::new(),
            free: Vec::new(),
            rerouted: VecDeque::new(),
            done: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Number of paths.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// Always false: an engine has at least one path.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// Commands that can be submitted now: the free slots of the paths
    /// that take new commands (none while commands wait to be rerouted).
    pub fn free_slots(&self) -> usize {
        if !self.rerouted.is_empty() {
            return 0;
        }
        let Some(tier) = preferred(&self.paths) else {
            return 0;
        };
        self.paths
            .iter()
            .filter(|p| p.live() && p.state.ana() == tier)
            .map(|p| p.queue.free_slots())
            .sum()
    }

    /// Why no command can be sent now, if none can: no path is live and
    /// usable (the driver waits for one, or gives up with the keeper).
    pub fn failed(&self) -> Option<&str> {
        match preferred(&self.paths) {
            Some(_) => None,
            None if self.paths.iter().any(Path::live) => Some("no path is usable (ANA)"),
            None => Some("every path is lost"),
        }
    }

    /// Socket sends the paths' current queues made.
    pub fn sends(&self) -> u64 {
        self.paths.iter().map(|p| p.queue.sends()).sum()
    }

    /// Whether nothing is in flight or waiting.
    pub fn idle(&self) -> bool {
        self.rerouted.is_empty()
            && self.done.is_empty()
            && self.paths.iter().all(|p| p.queue.idle())
    }

    /// Whether completions wait to be taken.
    pub fn has_done(&self) -> bool {
        !self.done.is_empty() || self.paths.iter().any(|p| p.queue.has_done())
    }

    /// Submits command `sqe` moving `data` (to the host when `to_host`) on
    /// the path that takes it; its completion comes back with `tag`.
    /// Returns false when no path can take it.
    pub fn submit(&mut self, sqe: Sqe, data: Data<'_>, to_host: bool, tag: u64) -> bool {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.cmds.push(None);
                self.cmds.len() as u32 - 1
            }
        };
        self.cmds[slot as usize] = Some(Cmd::new(sqe, data, to_host, tag));
        if self.send(slot) {
            true
        } else {
            self.cmds[slot as usize] = None;
            self.free.push(slot);
            false
        }
    }

    /// Sends the command in `slot` on the usable path with the most free
    /// slots.
    fn send(&mut self, slot: u32) -> bool {
        let Some(tier) = preferred(&self.paths) else {
            return false;
        };
        let cmd = self.cmds[slot as usize].expect("a command in the slot");
        let best = self
            .paths
            .iter_mut()
            .filter(|p| p.live() && p.state.ana() == tier && p.queue.free_slots() > 0)
            .max_by_key(|p| p.queue.free_slots());
        let Some(p) = best else {
            return false;
        };
        p.queue.submit(cmd.retagged(slot as u64))
    }

    /// Completions for the driver. A command that failed for a path reason
    /// goes to another path instead, when one is usable.
    pub fn take_done(&mut self, out: &mut Vec<Done>) {
        for i in 0..self.paths.len() {
            let mut scratch = std::mem::take(&mut self.scratch);
            self.paths[i].queue.take_done(&mut scratch);
            let lost = !self.paths[i].live();
            for d in scratch.drain(..) {
                self.completed(i, d, lost);
            }
            self.scratch = scratch;
        }
        self.reroute();
        out.append(&mut self.done);
    }

    /// Command completion `d` from path `i` (`lost`: its queue failed).
    fn completed(&mut self, i: usize, d: Done, lost: bool) {
        let slot = d.tag as u32;
        let Some(cmd) = self.cmds.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        let st = d.cqe.status();
        let path_error = st.sct == 3 || (lost && !st.is_success());
        if path_error && cmd.again < MAX_REROUTES {
            cmd.again += 1;
            if st.sct == 3 {
                self.paths[i].state.distrust(st);
            }
            tracing::debug!(path = i, status = %st, "command sent again on another path");
            self.rerouted.push_back(slot);
            return;
        }
        self.finish(slot, d.cqe);
    }

    /// Completes the command in `slot` to the driver.
    fn finish(&mut self, slot: u32, cqe: Cqe) {
        if let Some(cmd) = self.cmds[slot as usize].take() {
            self.done.push(Done { tag: cmd.tag, cqe });
            self.free.push(slot);
        }
    }

    /// Sends the rerouted commands on usable paths. With none usable but
    /// one connected (its ANA group moving to it: a gateway group's
    /// failover) they wait here; with none connected they go back to their
    /// driver as transient transport errors (it waits for a path as for a
    /// lost association, and gives up after ctrl-loss-tmo).
    fn reroute(&mut self) {
        while let Some(&slot) = self.rerouted.front() {
            if self.send(slot) {
                self.rerouted.pop_front();
                continue;
            }
            if preferred(&self.paths).is_some() || self.paths.iter().any(Path::live) {
                return; // a usable path without a free slot, or one soon
            }
            self.rerouted.pop_front();
            let cqe = Cqe {
                status: Status::TRANSIENT_TRANSPORT_ERROR.to_field(0),
                ..Default::default()
            };
            self.finish(slot, cqe);
        }
    }

    /// Keeps each path's operations in the ring, their user data made by
    /// `ud(path, generation)` for the receive and the send.
    pub fn pump(&mut self, sq: &mut Submissions, ud: impl Fn(usize, u64) -> (u64, u64)) {
        self.reroute();
        for (i, p) in self.paths.iter_mut().enumerate() {
            let (receive, send) = ud(i, p.generation);
            p.queue.pump(sq, receive, send);
        }
    }

    /// The generation of path `i`'s queue.
    pub fn generation(&self, i: usize) -> u64 {
        self.paths[i].generation
    }

    /// The receive operation of path `i` completed.
    pub fn on_receive_done(&mut self, i: usize, res: i32) {
        self.paths[i].queue.on_receive_done(res);
    }

    /// The send operation of path `i` completed.
    pub fn on_send_done(&mut self, i: usize, res: i32) {
        self.paths[i].queue.on_send_done(res);
    }

    /// See [`IoQueue::set_busy_poll`].
    pub fn set_busy_poll(&mut self, on: bool) {
        for p in &mut self.paths {
            p.queue.set_busy_poll(on);
        }
    }

    /// See [`IoQueue::poll_direct`]: whether anything arrived on a path.
    pub fn poll_direct(&mut self) -> bool {
        let mut any = false;
        for p in &mut self.paths {
            any |= p.queue.poll_direct();
        }
        any
    }

    /// Makes `arena` usable for every path's data.
    ///
    /// # Safety
    /// The arena must outlive the paths.
    pub unsafe fn register_arena(&mut self, arena: &Arena) -> Result<(), super::HostError> {
        for p in &mut self.paths {
            // SAFETY: the caller's guarantee.
            unsafe { p.queue.register_arena(arena) }?;
        }
        Ok(())
    }

    /// Fails path `i`'s queue (its commands complete with errors, and go to
    /// another path).
    pub fn fail(&mut self, i: usize, why: &str) {
        if self.paths[i].live() {
            self.paths[i].queue.fail(why.to_string());
        }
    }

    /// A replacement queue for path `i` (of `generation`): taken once the
    /// old one is idle in the ring.
    pub fn replace(&mut self, i: usize, generation: u64, queue: IoQueue) {
        self.paths[i].next = Some((generation, queue));
    }

    /// For each path whose queue failed: swaps in its replacement once the
    /// old queue has nothing in the ring, registering `arena` with it and
    /// calling `swapped(path, old generation)`; otherwise reports the loss
    /// once through `lost(path, generation)`. Returns an error when a new
    /// queue cannot use the arena.
    ///
    /// # Safety
    /// The arena must outlive the paths.
    pub unsafe fn settle_losses(
        &mut self,
        arena: &Arena,
        busy_poll: bool,
        mut lost: impl FnMut(usize, u64),
        mut swapped: impl FnMut(usize, u64),
    ) -> Result<(), String> {
        for i in 0..self.paths.len() {
            let p = &mut self.paths[i];
            if p.next.is_some() && p.live() {
                p.queue.fail("replaced by a new association".into());
            }
            if p.live() || p.queue.ops_in_flight() || p.queue.has_done() {
                continue;
            }
            match p.next.take() {
                Some((generation, q)) => {
                    let old = std::mem::replace(&mut p.queue, q);
                    drop(old);
                    p.queue.set_busy_poll(busy_poll);
                    // SAFETY: the caller's guarantee.
                    unsafe { p.queue.register_arena(arena) }
                        .map_err(|e| format!("the new I/O queue cannot use the arena: {e}"))?;
                    swapped(i, p.generation);
                    tracing::info!(path = i, generation, "I/O queue replaced");
                    p.generation = generation;
                    p.reported = false;
                }
                None if !p.reported => {
                    p.reported = true;
                    lost(i, p.generation);
                }
                None => {}
            }
        }
        Ok(())
    }
}
