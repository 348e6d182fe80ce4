//! A queue's commands, whatever its transport: the one state machine that
//! takes each command from its capsule to its response ([`State`]), the
//! rules every capsule meets on arrival, a queue's deadlines, and what it
//! gives back when it goes. A transport contributes a [`Wire`]: how data is
//! asked of the host, and how data and responses go back to it.
//!
//! Here the queue, its state machine and the [`Wire`] with the types a
//! transport hands in and gets back; `intake` (a capsule's arrival),
//! `completion` (a command's end and its slot freed), `throttle` (QoS
//! holds) and `upkeep` (deadlines, pumping, the send watch).

use crate::backend::BackendOp;
use crate::engine::binding::Binding;
use crate::engine::poller::{Io, Token};
use crate::nvme::command::{Command, Connected, Entries, Progress, State, Work};
use crate::nvme::fabric::{TransportCaps, ADMIN_QUEUE_SIZE};
use crate::nvme::port::Arrival;
use rdmablk_common::fabrics::{invalid_param_dw0, ConnectCmd};
use rdmablk_common::mem::ArenaBuf;
use rdmablk_common::nvme::{Cqe, Sqe, Status};
use std::collections::VecDeque;
use std::time::Instant;

mod completion;
mod intake;
mod throttle;
mod upkeep;
pub use upkeep::SendWatch;

/// The transport's half of a queue, as the state machine uses it.
pub trait Wire {
    /// Why a queue closes whose host did not deliver the data asked of it
    /// within `limits.data_timeout`.
    const DATA_OVERDUE: &'static str;

    /// Why a queue closes whose host did not take what was sent to it
    /// within `limits.send_timeout`.
    const SENDS_STALLED: &'static str;

    /// What the transport serves; capsules are checked against it.
    fn caps(&self) -> TransportCaps;

    /// Where the host reached the target (its listener's ANA states, the
    /// local address).
    fn arrival(&self) -> &Arrival;

    /// Entries the transport connection was made for, when it was: a
    /// Connect may not ask for more (NVMe/RDMA's HSQSIZE sizes the queue
    /// pair's send queue).
    fn queue_entries(&self) -> Option<u16> {
        None
    }

    /// Asks the host for (more of) the data of the command in `slot`, which
    /// has its buffer (R2T, RDMA READ); its arrival comes back through
    /// [`Queue::data_arrived`]. `cmd.requested` counts what was asked.
    fn fetch(&mut self, slot: u16, cmd: &mut Command, io: &mut Io);

    /// Sends a command's data (when it returns any) and its response. The
    /// slot comes back through [`Queue::sent`] once all of it is sent.
    fn respond(&mut self, r: Response<'_>, io: &mut Io);

    /// Whether the queue is closing (nothing new starts).
    fn closing(&self) -> bool;

    /// Starts closing: operations in flight are made to end (a socket shut
    /// down, a queue pair moved to error); the endpoint frees the queue
    /// once none is left.
    fn shut(&mut self);

    /// The progress of the wire's sends.
    fn sends(&self) -> &SendWatch;

    /// Called before a queue closes whose host stopped taking what is
    /// sent: what it did not take may be dropped rather than kept for it.
    fn abandon_unsent(&mut self) {}

    /// Whether all that was queued for the host has gone (a queue that
    /// closes by itself waits for it).
    fn drained(&self) -> bool;

    /// Whether no operation of the wire is in flight (a closed queue is
    /// freed only then).
    fn idle(&self) -> bool;
}

/// A command's data and response, for the wire to send.
pub struct Response<'a> {
    /// The command's slot; `None` for a command refused before it had one.
    pub slot: Option<u16>,
    pub sqe: &'a Sqe,
    pub cqe: Cqe,
    /// Data to return before the response: the command's buffer, and how
    /// many of its bytes.
    pub data: Option<(&'a ArenaBuf, usize)>,
}

/// In-capsule data, as a transport received it.
pub enum InCapsule<'a> {
    /// Bytes in a receive buffer, copied to the command's buffer (NVMe/TCP),
    /// and whether their digest matched.
    Bytes { data: &'a [u8], digest_ok: bool },
    /// `len` bytes in an arena buffer the command takes over (a shared
    /// receive queue's buffer, which then gets a new one).
    Buffer {
        buf: &'a mut Option<ArenaBuf>,
        len: usize,
    },
}

impl InCapsule<'_> {
    fn len(&self) -> usize {
        match self {
            InCapsule::Bytes { data, .. } => data.len(),
            InCapsule::Buffer { len, .. } => *len,
        }
    }
}

/// What became of a capsule.
#[derive(Debug, PartialEq, Eq)]
pub enum Intake {
    /// Taken: planned, refused with a status, or on its way.
    Taken,
    /// Not taken for now: no room to hold it (staging at the poller's
    /// bound, or as many refusals unsent as the queue has entries). A
    /// transport that can leave it in its stream does; others close.
    Stall,
    /// The host sent more commands than its queue holds: the queue closes.
    Overrun,
}

/// Queue entries before a Connect says how many (the admin maximum).
const INITIAL_DEPTH: u16 = ADMIN_QUEUE_SIZE;

/// The commands of one queue and what they hold.
pub struct Queue {
    pub bind: Binding,
    pub peer: String,
    /// Endpoint and queue index, for the tokens of backend operations.
    token: (u8, u32),
    /// The queue id: from the transport's handshake, then its Connect.
    pub qid: u16,
    /// Since when the queue waits for a Connect (its start or a Disconnect).
    since: Instant,
    /// Command slots: twice the queue's depth at most, as a response's
    /// send may complete here after the host already reused its entry.
    cmds: Vec<Option<Command>>,
    /// Slots of `cmds` in use.
    in_slots: usize,
    /// Held Asynchronous Event Requests, and the controller generation
    /// they were held in (a reset aborts them).
    held_aers: Vec<(Sqe, u32)>,
    /// Submission queue head reported in responses.
    sq_head: u16,
    /// Commands waiting for arena space, in arrival order.
    awaiting_buffer: VecDeque<u16>,
    /// Commands held back by QoS limits, in arrival order.
    throttled: Vec<u16>,
    /// Backend operations in flight.
    backend_ops: usize,
    /// Responses to commands refused before they had a slot, not yet sent.
    unslotted: usize,
    /// A Disconnect whose response waits for the queue's other commands.
    disconnecting: Option<u16>,
    /// The first command of a fused operation, until its second arrives.
    fused_first: Option<u16>,
    /// The first of a fused operation ended (refused, or failed) before
    /// its second came: the next capsule, if a second, fails with it.
    first_refused: bool,
}

impl Queue {
    /// A queue on endpoint `ep` at index `idx`, with queue id `qid` as far
    /// as the transport knows it before Connect.
    pub fn new(binding: Binding, peer: String, ep: u8, idx: u32, qid: u16) -> Queue {
        Queue {
            bind: binding,
            peer,
            token: (ep, idx),
            qid,
            since: Instant::now(),
            cmds: Vec::new(),
            in_slots: 0,
            held_aers: Vec::new(),
            sq_head: 0,
            awaiting_buffer: VecDeque::new(),
            throttled: Vec::new(),
            backend_ops: 0,
            unslotted: 0,
            disconnecting: None,
            fused_first: None,
            first_refused: false,
        }
    }

    /// Queue entries: what Connect negotiated, or the admin maximum before.
    pub fn depth(&self) -> u16 {
        self.bind.assoc.as_ref().map_or(INITIAL_DEPTH, |a| a.depth)
    }

    /// Commands in progress (held AERs excluded).
    pub fn busy(&self) -> usize {
        self.in_slots
    }

    /// Whether the queue has nothing to do until its wire brings
    /// something: no command in progress, no refusal unsent.
    pub fn quiet(&self) -> bool {
        self.in_slots == 0 && self.unslotted == 0
    }

    /// Whether no backend operation refers to the queue's commands.
    pub fn idle_backend(&self) -> bool {
        self.backend_ops() == 0
    }

    /// Backend operations in flight for the queue's commands.
    pub fn backend_ops(&self) -> usize {
        self.backend_ops
    }

    /// The command in `slot`, if live.
    pub fn command(&self, slot: u16) -> Option<&Command> {
        self.cmds.get(slot as usize).and_then(Option::as_ref)
    }

    /// Whether a command holding a buffer still waits for data that may
    /// follow in the stream (so the stream must not stop).
    pub fn awaits_stream_data(&self) -> bool {
        self.cmds
            .iter()
            .flatten()
            .any(|c| c.buf.is_some() && !c.to_host && c.received < c.len)
    }

    /// Starts closing the queue, saying why (once).
    pub fn close<W: Wire>(&self, w: &mut W, why: &str) {
        if w.closing() {
            return;
        }
        match &self.bind.assoc {
            Some(a) => {
                tracing::info!(peer = %self.peer, cntlid = a.ctrl.cntlid, qid = a.qid, "queue closed: {why}")
            }
            // A connection that never connected a queue: a flood of them
            // would flood the log too.
            None => tracing::debug!(peer = %self.peer, qid = self.qid, "connection closed: {why}"),
        }
        w.shut();
    }

    /// Moves a command on as far as it goes now: a buffer for its data,
    /// the data from the host, then execution. The one place where
    /// commands before the backend change state.
    pub fn advance<W: Wire>(&mut self, slot: u16, io: &mut Io, w: &mut W) {
        let Some(cmd) = self.cmds.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if cmd.state == State::Received {
            if let Some(until) = throttle::hold(cmd) {
                enter(cmd, State::Throttled, &self.peer);
                self.throttled.push(slot);
                io.wake_by(until);
                return;
            }
        }
        if matches!(
            cmd.state,
            State::Received | State::Throttled | State::AwaitingBuffer
        ) {
            if cmd.len > 0 && cmd.buf.is_none() {
                cmd.buf = self.bind.alloc(cmd.buffer_len(), io);
            }
            if cmd.len > 0 && cmd.buf.is_none() {
                // The arena is full: wait without blocking the stream,
                // which carries the data that lets other commands finish.
                if cmd.state != State::AwaitingBuffer {
                    enter(cmd, State::AwaitingBuffer, &self.peer);
                    self.awaiting_buffer.push_back(slot);
                }
                return;
            }
            self.bind.unstage_into(cmd, io);
            if !cmd.to_host && cmd.received < cmd.len {
                enter(cmd, State::FetchingData, &self.peer);
            }
        }
        if cmd.state == State::FetchingData && cmd.received < cmd.len {
            if cmd.requested == cmd.received {
                w.fetch(slot, cmd, io);
                cmd.since = Instant::now();
            }
            return;
        }
        self.run(slot, io, w);
    }

    /// Gives freed arena space to the commands waiting for it, in order.
    fn grant_buffers<W: Wire>(&mut self, io: &mut Io, w: &mut W) {
        while let Some(&slot) = self.awaiting_buffer.front() {
            let waiting = self
                .cmds
                .get(slot as usize)
                .and_then(Option::as_ref)
                .filter(|c| c.state == State::AwaitingBuffer);
            let Some(cmd) = waiting else {
                self.awaiting_buffer.pop_front();
                continue;
            };
            match self.bind.alloc(cmd.buffer_len(), io) {
                Some(b) => {
                    self.awaiting_buffer.pop_front();
                    let cmd = self.cmds[slot as usize].as_mut().expect("checked above");
                    cmd.buf = Some(b);
                    self.advance(slot, io, w);
                }
                None => return,
            }
        }
    }

    /// Data of the command in `slot` arrived up to byte `end`; `digest_ok`
    /// says whether its digest matched. The transport checked `end` against
    /// what was asked.
    pub fn data_arrived<W: Wire>(
        &mut self,
        slot: u16,
        end: usize,
        digest_ok: bool,
        io: &mut Io,
        w: &mut W,
    ) {
        let Some(cmd) = self.cmds.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        cmd.received = end;
        if !digest_ok {
            tracing::warn!(peer = %self.peer, cid = cmd.sqe.cid(), "data digest mismatch");
            cmd.status = Status::TRANSIENT_TRANSPORT_ERROR;
        }
        self.advance(slot, io, w);
    }

    /// Executes a command whose data (if any) has arrived.
    fn run<W: Wire>(&mut self, slot: u16, io: &mut Io, w: &mut W) {
        let cmd = self.cmds[slot as usize]
            .as_mut()
            .expect("running a live slot");
        if !cmd.status.is_success() {
            return self.complete(slot, io, w);
        }
        if matches!(cmd.work, Work::Connect) {
            let asked = ConnectCmd::from_sqe(&cmd.sqe).sqsize as u32 + 1;
            match w.queue_entries() {
                Some(made) if asked > made as u32 => {
                    // Connect Invalid Parameters, naming SQSIZE (bytes 44-45
                    // of the command), as for a size out of range.
                    tracing::warn!(peer = %self.peer, "Connect refused: a queue of {asked} entries on a connection made for {made}");
                    cmd.status = Status::CONNECT_INVALID_PARAMETERS;
                    cmd.dw0 = invalid_param_dw0(false, 44);
                }
                _ => {
                    if let Connected::Yes(a) =
                        cmd.connect(io.registry, io.arena, w.caps(), w.arrival(), &self.peer)
                    {
                        self.qid = a.qid;
                        self.bind.connected(a, io);
                    }
                }
            }
            return self.complete(slot, io, w);
        }
        if cmd.sqe.fuse() != 0 && cmd.partner_buf.is_none() && matches!(cmd.work, Work::Io(_)) {
            return self.run_fused(slot, io, w);
        }
        // A command planned before its queue was deleted (by a Disconnect, or
        // a controller reset) does not execute: it is aborted.
        let Some(a) = self.bind.assoc.as_ref().filter(|a| !a.is_deleted()) else {
            cmd.status = Status::ABORTED_SQ_DELETION;
            return self.complete(slot, io, w);
        };
        match cmd.execute(a, io.arena, self.held_aers.len()) {
            Progress::Complete if cmd.is_disconnect() && cmd.status.is_success() => {
                // The connection stays (NVMe Base 2.1, 6.4) but has no queue:
                // it gets the Connect deadline again.
                self.bind.disconnected(io, &self.peer);
                self.since = Instant::now();
                // Its completion is the queue's last: commands that have not
                // started are aborted now, and those on the backend or
                // receiving data answer before it.
                self.abort_unstarted(slot, io, w);
                self.disconnecting = Some(slot);
                self.finish_disconnect(io, w);
            }
            Progress::Complete => self.complete(slot, io, w),
            Progress::Held => {
                self.held_aers.push((cmd.sqe, a.ctrl.generation()));
                self.free(slot, io);
            }
            Progress::Waiting(entries) => {
                enter(cmd, State::OnBackend, &self.peer);
                self.submit_backend(slot, entries, io);
            }
        }
    }

    /// Queues a command's backend operations.
    fn submit_backend(&mut self, slot: u16, entries: Entries, io: &mut Io) {
        let token = Token::Backend {
            ep: self.token.0,
            queue: self.token.1,
            slot,
        };
        for op in entries {
            // SAFETY (both arms): a backend operation reads or writes the
            // command's arena buffer (fixed buffer 0, mapped as long as the
            // poller's ring), which the command keeps until its operations
            // have completed: its slot is freed only after `on_backend` saw
            // the last one, and the queue only once `backend_ops` is zero.
            // The command also holds its namespace, whose backend the
            // operation uses. Or it touches no memory (flush, zeroing).
            match op {
                // SAFETY: as above.
                BackendOp::Ring(e) => unsafe { io.sq.push(e.user_data(token.encode())) },
                // SAFETY: as above.
                BackendOp::Rbd(r) => unsafe { r.start(token.encode(), io.completions) },
                BackendOp::Offload(job) => job.start(token.encode(), io.completions),
                BackendOp::Later(later) => later.start(token.encode(), io.completions),
            }
            self.backend_ops += 1;
        }
    }

    /// A backend operation of the command in `slot` completed with `res`.
    pub fn on_backend<W: Wire>(&mut self, slot: u16, res: i32, io: &mut Io, w: &mut W) {
        self.backend_ops -= 1;
        let Some(cmd) = self.cmds.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if !matches!(cmd.work, Work::Io(_)) {
            cmd.ops_in_flight -= 1;
            if cmd.persisted(res) {
                return self.complete(slot, io, w);
            }
            // Work it needed ran off the poller (authentication): it
            // executes again and finds the result.
            return self.run(slot, io, w);
        }
        // Only a timeout asks (the controller's state is locked for it).
        let acre = || self.bind.acre();
        let more = cmd.on_backend_done(res, io.arena, acre);
        if !more.is_empty() {
            // The rest of a short transfer, the other way of zeroing, what a
            // write gate let through, a Compare and Write's write.
            self.submit_backend(slot, more, io);
        } else if cmd.ops_in_flight == 0 {
            self.complete(slot, io, w);
        }
    }
}

/// Moves a command to its next state, traced.
fn enter(cmd: &mut Command, to: State, peer: &str) {
    tracing::trace!(peer, cid = cmd.sqe.cid(), from = ?cmd.state, ?to, "command");
    cmd.state = to;
}

/// Index of a free entry of `slots`, growing it when none is.
pub fn vacant<T>(slots: &mut Vec<Option<T>>) -> usize {
    slots.iter().position(Option::is_none).unwrap_or_else(|| {
        slots.push(None);
        slots.len() - 1
    })
}

#[cfg(test)]
mod tests;
