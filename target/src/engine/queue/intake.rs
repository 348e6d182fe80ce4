//! A queue's intake: the rules every capsule meets on arrival (its SGL,
//! its in-capsule data, fused pairs), its plan and its slot, and the
//! answers to capsules refused before they took one.

use super::{enter, InCapsule, Intake, Queue, Response, Wire};
use crate::base::budget::Staged;
use crate::engine::binding::{self};
use crate::engine::poller::Io;
use crate::nvme::command::{self, Command, State, Work};
use rdmablk_common::nvme::identify::sgls;
use rdmablk_common::nvme::{fuse, ReadWriteCmd, Sgl, Sqe, Status};
use std::sync::Arc;

impl Queue {
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
        self.in_slots += 1;
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
    pub(super) fn end_fused<W: Wire>(&mut self, slot: u16, status: Status, io: &mut Io, w: &mut W) {
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
    pub(super) fn run_fused<W: Wire>(&mut self, slot: u16, io: &mut Io, w: &mut W) {
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

    /// Completes held AERs with the events their controller has for them.
    /// Those held across a controller reset or a shutdown (an older
    /// generation) end without a completion: a reset aborts outstanding
    /// AERs and posts no completion queue entry for them (NVMe Base 2.1,
    /// 5.2), and nvmet answers none at a shutdown either. The host gave
    /// them up: SPDK's initiator cancels its AER before it shuts the
    /// controller down, and a completion for a command it no longer has
    /// fails its controller.
    pub(super) fn deliver_events<W: Wire>(&mut self, io: &mut Io, w: &mut W) {
        if self.held_aers.is_empty() {
            return;
        }
        let Some(ctrl) = self.bind.assoc.as_ref().map(|a| a.ctrl.clone()) else {
            return;
        };
        let generation = ctrl.generation();
        let held = self.held_aers.len();
        self.held_aers.retain(|&(_, g)| g == generation);
        if self.held_aers.len() < held {
            tracing::debug!(
                peer = %self.peer,
                cntlid = ctrl.cntlid,
                aers = held - self.held_aers.len(),
                "AERs held across a controller reset or shutdown ended without a completion"
            );
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
}
