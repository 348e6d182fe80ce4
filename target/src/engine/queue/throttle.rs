//! Commands held back by QoS limits (`service::qos`): a command over its
//! limits waits in [`State::Throttled`] before it takes a buffer or asks
//! for its data, so that a throttled host holds nothing but its queue
//! entries (at most the queue's depth); it goes on, in arrival order, when
//! its time comes, and never fails for it.

use super::{Queue, Wire};
use crate::engine::poller::Io;
use crate::nvme::command::{Command, State, Work};
use std::time::Instant;

/// Takes a command's cost from its QoS limits; returns when it may go if
/// it must wait.
pub(super) fn hold(cmd: &mut Command) -> Option<Instant> {
    match &mut cmd.work {
        Work::Io(req) if req.throttle.is_some() => req.hold(Instant::now()),
        _ => None,
    }
}

impl Queue {
    /// Lets the held commands whose time came go on, and tells the poller
    /// when the next may (only in a round where such a time came: the
    /// poller's timer, or its tick for limits replaced meanwhile).
    pub(super) fn release_held<W: Wire>(&mut self, io: &mut Io, w: &mut W) {
        if self.throttled.is_empty() || !io.qos_release_due {
            return;
        }
        let now = Instant::now();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        let cmds = &mut self.cmds;
        self.throttled.retain(|&slot| {
            let Some(cmd) = cmds.get_mut(slot as usize).and_then(Option::as_mut) else {
                return false;
            };
            let Work::Io(req) = &mut cmd.work else {
                return false;
            };
            if cmd.state != State::Throttled {
                return false; // ended meanwhile (a fused partner failed)
            }
            // (A stopping daemon lets them all go: they finish or fail
            // before its drain deadline.)
            if req.may_go(now) || io.stopping {
                req.release();
                due.push(slot);
                return false;
            }
            if let Some(t) = req.held_until() {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
            true
        });
        if let Some(t) = next {
            io.wake_by(t);
        }
        for slot in due {
            self.advance(slot, io, w);
        }
    }
}
