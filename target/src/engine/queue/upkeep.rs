//! What every queue does between commands, whatever its transport: moving
//! on when its poller pumps, its deadlines, closing once it has nothing
//! left to do, and when it can be freed. Each transport calls these in the
//! phases where they apply and keeps only its own checks (a handshake, a
//! protocol error's grace, work requests that never flush).

use super::{Queue, Wire};
use crate::config::Limits;
use crate::engine::binding;
use crate::engine::poller::Io;
use crate::nvme::command::State;
use std::time::{Duration, Instant};

impl Queue {
    /// What a live queue does when its poller pumps: commands held back by
    /// QoS limits whose time came go on, commands waiting for arena space
    /// get it, in order, then held AERs their events.
    pub fn pump<W: Wire>(&mut self, io: &mut Io, w: &mut W) {
        self.release_held(io, w);
        self.grant_buffers(io, w);
        self.deliver_events(io, w);
    }

    /// Why the queue must close now, if a deadline passed: its Connect
    /// (`limits.handshake_timeout` from its start or a Disconnect), its
    /// association's keep-alive and enable, data asked of the host; or if
    /// its association ended (once `w` has sent what it holds).
    pub fn overdue<W: Wire>(&self, w: &W, limits: &Limits) -> Option<&'static str> {
        if self.bind.assoc.is_none() && self.since.elapsed() > limits.handshake_timeout {
            return Some("no Connect within limits.handshake_timeout of the connection");
        }
        if let Some(why) = binding::check_association(self.bind.assoc.as_ref(), limits, w.drained())
        {
            return Some(why);
        }
        let stuck = self.cmds.iter().flatten().any(|c| {
            c.state == State::FetchingData
                && c.received < c.requested
                && c.since.elapsed() > limits.data_timeout
        });
        stuck.then_some(W::DATA_OVERDUE)
    }

    /// The periodic checks of a live queue, in order: its deadlines
    /// ([`Queue::overdue`]), then the progress of its sends
    /// (`limits.send_timeout`, past which what the host did not take is
    /// abandoned). The first one that failed closes the queue.
    pub fn check_deadlines<W: Wire>(&self, w: &mut W, limits: &Limits) {
        if let Some(why) = self.overdue(w, limits) {
            self.close(w, why);
        } else if w.sends().stalled(limits.send_timeout) {
            w.abandon_unsent();
            self.close(w, W::SENDS_STALLED);
        }
    }

    /// Closes a queue that has nothing left to do, in order: one that was
    /// disconnected with no place to wait for another Connect, once its
    /// wire is drained; one whose commands are all done while `stopping`
    /// (the target shuts down, and the transport lets it close now).
    pub fn close_when_done<W: Wire>(&self, w: &mut W, stopping: bool) {
        if w.closing() {
            return;
        }
        if self.bind.must_close() && w.drained() {
            self.close(
                w,
                "disconnected, and no place for a connection waiting for its Connect",
            );
        } else if stopping && self.busy() == 0 {
            self.close(w, "target shutting down");
        }
    }

    /// Whether the queue is closed and nothing refers to it any more: no
    /// operation of its wire, no backend operation.
    pub fn can_free<W: Wire>(&self, w: &W) -> bool {
        w.closing() && w.idle() && self.idle_backend()
    }
}

/// Progress of a queue's sends: since when it has had sends outstanding
/// with none of them completing. A host that stops reading its socket, or
/// stops posting RDMA receives, holds our buffers; past `limits.send_timeout`
/// the queue is torn down.
#[derive(Debug, Default)]
pub struct SendWatch {
    since: Option<Instant>,
}

impl SendWatch {
    /// A send was started.
    pub fn posted(&mut self) {
        self.since.get_or_insert_with(Instant::now);
    }

    /// A send completed; `pending` says whether others are still out.
    pub fn progressed(&mut self, pending: bool) {
        self.since = pending.then(Instant::now);
    }

    /// Whether sends have been stuck for longer than `limit`.
    pub fn stalled(&self, limit: Duration) -> bool {
        self.since.is_some_and(|t| t.elapsed() > limit)
    }
}
