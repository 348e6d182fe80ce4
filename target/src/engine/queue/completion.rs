//! A command's end: its response, what a Disconnect or a Preempt and Abort
//! ends with it, and the slot freed once the response is sent.

use super::{enter, Queue, Response, Wire};
use crate::engine::binding::{self, end_association};
use crate::engine::poller::Io;
use crate::nvme::command::{State, Work};
use rdmablk_common::fabrics::ConnectCmd;
use rdmablk_common::nvme::Status;
use std::time::Duration;

/// An I/O command answered this long after it arrived is logged: storage
/// that stalls (a cluster failing over, a lock changing hands) shows in
/// the log with the namespace and the time it took.
const SLOW_COMMAND: Duration = Duration::from_secs(2);

impl Queue {
    /// Hands a finished command's data (for reads) and response to the wire.
    pub(super) fn complete<W: Wire>(&mut self, slot: u16, io: &mut Io, w: &mut W) {
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
            if latency >= SLOW_COMMAND {
                tracing::info!(
                    peer = %self.peer,
                    cid = cmd.sqe.cid(),
                    nsid = req.ns.nsid,
                    op = ?req.op(),
                    status = %cmd.status,
                    "I/O command answered after {latency:.1?}"
                );
            }
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
    pub(super) fn abort_unstarted<W: Wire>(&mut self, except: u16, io: &mut Io, w: &mut W) {
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
    pub(super) fn finish_disconnect<W: Wire>(&mut self, io: &mut Io, w: &mut W) {
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
    pub(super) fn free(&mut self, slot: u16, io: &mut Io) {
        if let Some(mut c) = self.cmds.get_mut(slot as usize).and_then(Option::take) {
            self.in_slots -= 1;
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
        self.in_slots = 0;
        end_association(self.bind.assoc.take(), io.stopping);
    }
}
