//! A queue's commands, whatever its transport: the one state machine that
//! takes each command from its capsule to its response ([`State`]), the
//! rules every capsule meets on arrival, a queue's deadlines, and what it
//! gives back when it goes. A transport contributes a [`Wire`]: how data is
//! asked of the host, and how data and responses go back to it.

use crate::backend::BackendOp;
use crate::base::budget::Staged;
use crate::engine::binding::{self, end_association, Binding};
use crate::engine::poller::{Io, Token};
use crate::nvme::command::{self, Command, Connected, Entries, Progress, State, Work};
use crate::nvme::fabric::{TransportCaps, ADMIN_QUEUE_SIZE};
use crate::nvme::port::Arrival;
use rdmablk_common::fabrics::{invalid_param_dw0, ConnectCmd};
use rdmablk_common::mem::ArenaBuf;
use rdmablk_common::nvme::identify::sgls;
use rdmablk_common::nvme::{fuse, Cqe, ReadWriteCmd, Sgl, Sqe, Status};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

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
        self.cmds.iter().filter(|c| c.is_some()).count()
    }

    /// Whether no backend operation refers to the queue's commands.
    pub fn idle_backend(&self) -> bool {
        self.backend_ops == 0
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

    /// A command capsule arrived: the two commands of a fused operation
    /// come one after the other (NVMe Base 2.1, 3.4.2): a first without its
    /// second is aborted with Missing Fused Command, as is a second without
    /// a first (Failed Fused Command after a first that was refused), and
    /// a first ends with its second when that is refused.
    pub fn receive<W: Wire>(
        &mut self,
        sqe: &Sqe,
        data: InCapsule<'_>,
        io: &mut Io,
        w: &mut W,
    ) -> Intake {
        if self.unslotted >= self.depth() as usize {
            // As many refusals unsent as the queue has entries: a host that
            // keeps sending bad capsules without taking them waits for them.
            return Intake::Stall;
        }
        let io_queue = self.bind.assoc.as_ref().is_some_and(|a| a.qid != 0);
        let fused = if io_queue { sqe.fuse() } else { 0 };
        if fused != fuse::SECOND {
            if let Some(first) = self.fused_first.take() {
                self.end_fused(first, Status::ABORTED_MISSING_FUSED, io, w);
            }
        }
        let refused_first = std::mem::take(&mut self.first_refused);
        if fused == fuse::SECOND && self.fused_first.is_none() {
            let st = if refused_first {
                Status::ABORTED_FAILED_FUSED
            } else {
                Status::ABORTED_MISSING_FUSED
            };
            return self.refuse(sqe, st, io, w);
        }
        let intake = self.receive_one(sqe, data, io, w);
        if intake == Intake::Taken {
            match fused {
                fuse::FIRST if self.fused_first.is_none() => self.first_refused = true,
                fuse::SECOND => {
                    if let Some(first) = self.fused_first.take() {
                        self.end_fused(first, Status::ABORTED_FAILED_FUSED, io, w);
                    }
                }
                _ => {}
            }
        }
        intake
    }

    /// [`Queue::receive`] for one capsule: the rules of NVMe over Fabrics
    /// 1.1 and NVMe Base 2.1 on its SGL and in-capsule data, then the
    /// command's plan, then its slot.
    fn receive_one<W: Wire>(
        &mut self,
        sqe: &Sqe,
        data: InCapsule<'_>,
        io: &mut Io,
        w: &mut W,
    ) -> Intake {
        let cid = sqe.cid();
        let caps = w.caps();
        let sgl = sqe.sgl();
        let arrived = data.len();
        // Descriptors the transport does not take, SGL Descriptor Type
        // Invalid (NVMe Base 2.1, Figure 102: 11h); in-capsule data is at
        // offset 0 (ICDOFF 0; SGL Offset Invalid, 16h) and is exactly what
        // arrived, within IOCCSZ (Data SGL Length Invalid, 0Fh).
        let status = match sgl {
            Sgl::InCapsule { offset, .. } if offset != 0 => Some(Status::SGL_OFFSET_INVALID),
            Sgl::InCapsule { len, .. } if len as usize != arrived || len > caps.in_capsule_data => {
                Some(Status::SGL_DATA_LENGTH_INVALID)
            }
            Sgl::InCapsule { .. } => None,
            Sgl::Keyed { .. } if !caps.takes(sgls::KEYED) => {
                Some(Status::SGL_DESCRIPTOR_TYPE_INVALID)
            }
            Sgl::Transport { .. } if !caps.takes(sgls::TRANSPORT) => {
                Some(Status::SGL_DESCRIPTOR_TYPE_INVALID)
            }
            Sgl::Unsupported(_) => Some(Status::SGL_DESCRIPTOR_TYPE_INVALID),
            _ if arrived > 0 => Some(Status::SGL_DATA_LENGTH_INVALID),
            _ => None,
        };
        if let Some(st) = status {
            return self.refuse(sqe, st, io, w);
        }
        let mut cmd = match command::plan(self.bind.assoc.as_ref(), sqe, sgl.len(), io.poller) {
            Ok(c) => c,
            Err(st) => return self.refuse(sqe, st, io, w),
        };
        // The SGL covers what the command moves (a longer one is allowed
        // where the command says so: Dataset Management, Set Features);
        // data to the host never travels in the capsule.
        let in_capsule = matches!(sgl, Sgl::InCapsule { .. });
        if (sgl.len() as usize) < cmd.len || in_capsule && cmd.to_host {
            return self.refuse_planned(&cmd, Status::SGL_DATA_LENGTH_INVALID, io, w);
        }
        let Some(slot) = self.vacant() else {
            return Intake::Overrun;
        };
        // A command whose buffer holds more than its data (a Compare) does
        // not take over a receive buffer: its data is copied.
        let copied;
        let mut data = match data {
            InCapsule::Buffer { buf: Some(b), len } if cmd.buffer_len() > cmd.len => {
                let mut v = vec![0u8; len];
                io.arena.read(b, 0, &mut v);
                copied = v;
                InCapsule::Bytes {
                    data: &copied,
                    digest_ok: true,
                }
            }
            d => d,
        };
        if in_capsule && cmd.len > 0 {
            match &mut data {
                InCapsule::Buffer { buf, .. } => {
                    // The data is used in place: the receive gets a new buffer.
                    cmd.buf = buf.take();
                    if let Some(b) = &cmd.buf {
                        self.bind.adopt(b, io);
                    }
                }
                InCapsule::Bytes { data, digest_ok } => {
                    let data = &data[..cmd.len];
                    cmd.buf = self.bind.alloc(cmd.buffer_len(), io);
                    match &cmd.buf {
                        Some(b) => io.arena.write(b, 0, data),
                        None => {
                            // Commands holding buffers while their data is
                            // still to come: it may be behind this capsule,
                            // so the stream must not stop here.
                            let must = self.awaits_stream_data();
                            match self.bind.stage(data, must, io) {
                                Staged::Copy(d) => cmd.staged = Some(d),
                                Staged::Stall => return Intake::Stall,
                                Staged::Refuse => {
                                    let st = self.bind.retry_later();
                                    return self.refuse_planned(&cmd, st, io, w);
                                }
                            }
                        }
                    }
                    if !*digest_ok {
                        cmd.status = Status::TRANSIENT_TRANSPORT_ERROR;
                    }
                }
            }
            cmd.received = cmd.len;
            cmd.requested = cmd.len;
        }
        self.sq_head = (self.sq_head + 1) % self.depth();
        tracing::trace!(peer = %self.peer, cid, slot, opcode = sqe.opcode(), len = cmd.len, "command received");
        if matches!(cmd.work, Work::Io(_)) {
            match sqe.fuse() {
                fuse::FIRST => self.fused_first = Some(slot),
                fuse::SECOND => self.pair(slot, &mut cmd),
                _ => {}
            }
        }
        self.cmds[slot as usize] = Some(cmd);
        self.advance(slot, io, w);
        Intake::Taken
    }

    /// Pairs `cmd` (in `slot`), the second command of a fused operation,
    /// with the first, which must name the same blocks (NVM Command Set
    /// 2.1, 3.3.1: else Invalid Field, and the second fails with it).
    fn pair(&mut self, slot: u16, cmd: &mut Command) {
        let Some(first) = self.fused_first.take() else {
            return;
        };
        let Some(f) = self.cmds.get_mut(first as usize).and_then(Option::as_mut) else {
            cmd.status = Status::ABORTED_FAILED_FUSED;
            return;
        };
        let same = match (&f.work, &cmd.work) {
            (Work::Io(a), Work::Io(b)) => {
                Arc::ptr_eq(&a.ns, &b.ns) && a.offset == b.offset && a.len == b.len
            }
            _ => false,
        };
        if !same {
            if f.status.is_success() {
                f.status = Status::INVALID_FIELD;
            }
            cmd.status = Status::ABORTED_FAILED_FUSED;
        }
        f.partner = Some(slot);
        cmd.partner = Some(first);
    }

    /// Ends the command in `slot`, one of a fused operation, with `status`
    /// (unless it failed already): at once if it does not wait for data,
    /// else once its data arrived.
    fn end_fused<W: Wire>(&mut self, slot: u16, status: Status, io: &mut Io, w: &mut W) {
        let Some(cmd) = self.cmds.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        if cmd.status.is_success() {
            cmd.status = status;
        }
        if matches!(
            cmd.state,
            State::Received | State::Throttled | State::AwaitingBuffer | State::AwaitingPartner
        ) {
            self.complete(slot, io, w);
        }
    }

    /// A command of a fused operation whose data arrived: it waits for the
    /// other; once both are ready, the first runs them both, with the
    /// second's data.
    fn run_fused<W: Wire>(&mut self, slot: u16, io: &mut Io, w: &mut W) {
        let cmd = self.cmds[slot as usize].as_mut().expect("a live slot");
        enter(cmd, State::AwaitingPartner, &self.peer);
        let (first, second) = match (cmd.sqe.fuse(), cmd.partner) {
            (fuse::FIRST, p) => (slot, p),
            (_, Some(p)) => (p, Some(slot)),
            (_, None) => {
                // Its first ended before it (a second is paired when it
                // arrives, so this does not happen; but never wait forever).
                cmd.status = Status::ABORTED_FAILED_FUSED;
                return self.complete(slot, io, w);
            }
        };
        let ready = |q: &Queue, s: Option<u16>| {
            s.and_then(|s| q.command(s))
                .is_some_and(|c| c.state == State::AwaitingPartner)
        };
        if !ready(self, Some(first)) || !ready(self, second) {
            return;
        }
        let second = second.expect("ready");
        let s = self.cmds[second as usize].as_mut().expect("ready");
        let (data, fua) = (s.buf.take(), ReadWriteCmd::from_sqe(&s.sqe).fua);
        let f = self.cmds[first as usize].as_mut().expect("ready");
        f.partner_buf = data;
        f.fused_fua = fua;
        enter(f, State::OnBackend, &self.peer);
        self.run(first, io, w);
    }

    /// A free slot, the table growing up to twice the depth.
    fn vacant(&mut self) -> Option<u16> {
        if let Some(i) = self.cmds.iter().position(Option::is_none) {
            return Some(i as u16);
        }
        if self.cmds.len() >= 2 * self.depth() as usize {
            return None;
        }
        self.cmds.push(None);
        Some(self.cmds.len() as u16 - 1)
    }

    /// Answers a command that never got a slot.
    fn refuse<W: Wire>(&mut self, sqe: &Sqe, status: Status, io: &mut Io, w: &mut W) -> Intake {
        tracing::debug!(peer = %self.peer, cid = sqe.cid(), %status, "command refused before it ran");
        self.sq_head = (self.sq_head + 1) % self.depth();
        self.answer_unslotted(sqe, status, 0, io, w);
        Intake::Taken
    }

    /// Completes held AERs: with the events their controller has for them,
    /// or, after a controller reset, as Command Aborted due to SQ Deletion
    /// (the reset aborts outstanding commands, NVMe Base 2.1, 3.7.2).
    fn deliver_events<W: Wire>(&mut self, io: &mut Io, w: &mut W) {
        if self.held_aers.is_empty() {
            return;
        }
        let Some(ctrl) = self.bind.assoc.as_ref().map(|a| a.ctrl.clone()) else {
            return;
        };
        let generation = ctrl.generation();
        let (stale, live): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held_aers)
            .into_iter()
            .partition(|&(_, g)| g != generation);
        self.held_aers = live;
        for (sqe, _) in stale {
            self.answer_unslotted(&sqe, Status::ABORTED_SQ_DELETION, 0, io, w);
        }
        while !self.held_aers.is_empty() {
            let Some(dw0) = ctrl.take_event() else {
                break;
            };
            let (sqe, _) = self.held_aers.remove(0);
            tracing::info!(peer = %self.peer, cntlid = ctrl.cntlid, dw0 = format_args!("{dw0:#x}"), "asynchronous event reported");
            self.answer_unslotted(&sqe, Status::SUCCESS, dw0, io, w);
        }
    }

    /// Sends the completion of a command that has no slot: one refused on
    /// arrival, or a held AER (whose SQ entry was consumed when it arrived).
    fn answer_unslotted<W: Wire>(
        &mut self,
        sqe: &Sqe,
        status: Status,
        dw0: u32,
        io: &mut Io,
        w: &mut W,
    ) {
        self.unslotted += 1;
        let cqe = binding::response(
            &self.bind,
            (sqe.cid(), status),
            (dw0, 0),
            self.sq_head,
            self.qid,
        );
        w.respond(
            Response {
                slot: None,
                sqe,
                cqe,
                data: None,
            },
            io,
        );
    }

    /// [`Queue::refuse`] for a command already planned: an I/O command's
    /// namespace counts the refusal.
    fn refuse_planned<W: Wire>(
        &mut self,
        cmd: &Command,
        status: Status,
        io: &mut Io,
        w: &mut W,
    ) -> Intake {
        if let Work::Io(req) = &cmd.work {
            req.ns.metrics.of(io.poller).refused(req.op(), status);
        }
        self.refuse(&cmd.sqe, status, io, w)
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

    /// Hands a finished command's data (for reads) and response to the wire.
    fn complete<W: Wire>(&mut self, slot: u16, io: &mut Io, w: &mut W) {
        let cmd = self.cmds[slot as usize]
            .as_mut()
            .expect("completing a live slot");
        cmd.leave_gate();
        if self.fused_first == Some(slot) {
            // A first that ended before its second came: that one fails.
            self.fused_first = None;
            self.first_refused = true;
        }
        // The other command of a fused operation ends with this one: with
        // the outcome of its write, or failed with it.
        let partner = cmd.partner.take().map(|p| {
            let st = if cmd.status.is_success() {
                cmd.fused_write_status
            } else {
                Status::ABORTED_FAILED_FUSED
            };
            (p, st)
        });
        // A Connect answers for the queue it asked for.
        let sqid = match &cmd.work {
            Work::Connect => ConnectCmd::from_sqe(&cmd.sqe).qid,
            _ => self.qid,
        };
        if !cmd.status.is_success() {
            tracing::debug!(peer = %self.peer, cid = cmd.sqe.cid(), status = %cmd.status, "command failed");
        }
        if let Work::Io(req) = &cmd.work {
            *io.answered += 1;
            let bytes = req.data_to_host().max(req.data_to_controller()) as u64;
            let latency = cmd.arrived.elapsed();
            req.ns
                .metrics
                .of(io.poller)
                .answered(req.op(), bytes, latency, cmd.status);
        }
        let cqe = binding::response(
            &self.bind,
            (cmd.sqe.cid(), cmd.status),
            (cmd.dw0, cmd.dw1),
            self.sq_head,
            sqid,
        );
        let returns_data =
            cmd.to_host && cmd.status.is_success() && cmd.len > 0 && cmd.buf.is_some();
        let to = if returns_data {
            State::ReturningData
        } else {
            State::Responding
        };
        enter(cmd, to, &self.peer);
        let cmd = &*cmd;
        let data = match &cmd.buf {
            Some(b) if returns_data => Some((b, cmd.len)),
            _ => None,
        };
        w.respond(
            Response {
                slot: Some(slot),
                sqe: &cmd.sqe,
                cqe,
                data,
            },
            io,
        );
        if let Some((p, st)) = partner {
            if let Some(pc) = self.cmds.get_mut(p as usize).and_then(Option::as_mut) {
                if pc.partner == Some(slot) {
                    pc.partner = None;
                    self.end_fused(p, st, io, w);
                }
            }
        }
        self.finish_disconnect(io, w);
    }

    /// Aborts the commands of the queue (but `except`) that have not
    /// started: received, or waiting for a buffer (Command Aborted due to SQ
    /// Deletion). Those fetching data or on the backend hold memory that a
    /// transfer in flight points to; they finish first.
    fn abort_unstarted<W: Wire>(&mut self, except: u16, io: &mut Io, w: &mut W) {
        for slot in 0..self.cmds.len() as u16 {
            let unstarted = self.command(slot).is_some_and(|c| {
                matches!(
                    c.state,
                    State::Received
                        | State::Throttled
                        | State::AwaitingBuffer
                        | State::AwaitingPartner
                )
            });
            if slot != except && unstarted {
                let cmd = self.cmds[slot as usize].as_mut().expect("live");
                cmd.status = Status::ABORTED_SQ_DELETION;
                self.complete(slot, io, w);
            }
        }
    }

    /// Sends a waiting Disconnect's response once no other command of the
    /// queue can answer after it.
    fn finish_disconnect<W: Wire>(&mut self, io: &mut Io, w: &mut W) {
        let Some(d) = self.disconnecting else {
            return;
        };
        let others_pending = self.cmds.iter().enumerate().any(|(i, c)| {
            i != d as usize
                && c.as_ref()
                    .is_some_and(|c| !matches!(c.state, State::ReturningData | State::Responding))
        });
        if !others_pending {
            self.disconnecting = None;
            self.complete(d, io, w);
        }
    }

    /// The wire sent all of a response: the command in `slot` is done
    /// (`None`: a refusal of a command that had no slot).
    pub fn sent(&mut self, slot: Option<u16>, io: &mut Io) {
        match slot {
            Some(s) => self.free(s, io),
            None => self.unslotted -= 1,
        }
    }

    /// Frees a slot and what its command holds.
    fn free(&mut self, slot: u16, io: &mut Io) {
        if let Some(mut c) = self.cmds.get_mut(slot as usize).and_then(Option::take) {
            tracing::trace!(peer = %self.peer, cid = c.sqe.cid(), from = ?c.state, "command free");
            self.bind.release(&mut c, io);
        }
    }

    /// Frees every command and ends the queue's part in its association;
    /// call once nothing refers to the queue any more.
    pub fn teardown(&mut self, io: &mut Io) {
        for mut c in self.cmds.iter_mut().filter_map(Option::take) {
            self.bind.release(&mut c, io);
        }
        end_association(self.bind.assoc.take(), io.stopping);
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
