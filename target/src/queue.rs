//! What every transport's queue does the same way around a command: run it
//! (Connect or execute), feed backend completions back to it, build its
//! response, watch the association and the queue's deadlines on ticks, and
//! end the association when the queue goes.

use crate::admission::Permit;
use crate::budget::{Ledger, Staged};
use crate::command::{Command, Connected, Entries, Progress, Work};
use crate::config::Limits;
use crate::controller::{Association, TransportCaps, SQHD_FLOW_DISABLED};
use crate::poller::{Io, Token};
use io_uring::squeue;
use rdmablk_common::mem::ArenaBuf;
use rdmablk_common::nvme::{Cqe, Status};
use std::time::{Duration, Instant};

/// What a queue may hold before its Connect: the Connect's 1 KiB of data,
/// in one page.
const CONNECT_BUDGET: usize = rdmablk_common::mem::MIN_BUF;

/// What running a command led to.
pub enum Ran {
    /// The response can be sent now.
    Complete,
    /// A Fabrics Disconnect deleted this I/O queue: its response is the
    /// last; the queue id is free again and nothing more executes here
    /// until a new Connect.
    Disconnected,
    /// An AER to hold: its slot can be freed, its CID answered later.
    Held,
    /// Backend operations to submit; their completions finish the command.
    Waiting(Entries),
}

/// What every transport's queue holds of the target: its association, the
/// arena space it uses, and, until its Connect, its place among pending
/// connections.
pub struct Binding {
    pub assoc: Option<Association>,
    ledger: Ledger,
    pending: Option<Permit>,
    /// The last Connect disabled SQ flow control (SQHD FFFFh); kept past a
    /// Disconnect for its own response.
    sq_flow_disabled: bool,
}

impl Binding {
    /// A new connection holding one of the pending places.
    pub fn new(pending: Permit) -> Binding {
        Binding {
            assoc: None,
            // Before its Connect a queue may hold the Connect's data only.
            ledger: Ledger::new(CONNECT_BUDGET),
            pending: Some(pending),
            sq_flow_disabled: false,
        }
    }

    /// Whether the queue waits for a Connect without a pending place (after
    /// a Disconnect when none was free): it closes once its responses are out.
    pub fn must_close(&self) -> bool {
        self.assoc.is_none() && self.pending.is_none()
    }

    /// An arena buffer of `len` bytes within the queue's budgets, or `None`
    /// to wait for one.
    pub fn alloc(&mut self, len: usize, io: &mut Io) -> Option<ArenaBuf> {
        self.ledger.alloc(len, io.arena, io.budget)
    }

    /// Stages in-capsule data that has no buffer yet, within the poller's
    /// bounds (see [`Ledger::stage`] for `must`).
    pub fn stage(&mut self, data: &[u8], must: bool, io: &mut Io) -> Staged {
        self.ledger.stage(data, must, io.budget)
    }

    /// The status of a command refused for lack of staging room: one a host
    /// retries (Command Interrupted once it enabled ACRE, as the
    /// specification allows only then; Transient Transport Error before).
    pub fn retry_later(&self) -> Status {
        match &self.assoc {
            Some(a) if a.ctrl.acre() => Status::COMMAND_INTERRUPTED,
            _ => Status::TRANSIENT_TRANSPORT_ERROR,
        }
    }

    /// Copies staged data into the command's buffer, which it now has.
    pub fn unstage_into(&mut self, cmd: &mut Command, io: &mut Io) {
        if let (Some(d), Some(b)) = (cmd.staged.take(), cmd.buf.as_ref()) {
            io.arena.bytes_mut(b, d.len()).copy_from_slice(&d);
            self.ledger.unstage(d, io.budget);
        }
    }

    /// Charges a buffer received for the queue (in-capsule data) to it.
    pub fn adopt(&mut self, buf: &ArenaBuf, io: &mut Io) {
        self.ledger.adopt(buf, io.budget);
    }

    /// Gives a command's buffer back.
    pub fn release(&mut self, cmd: &mut Command, io: &mut Io) {
        cmd.release(&mut self.ledger, io.arena, io.budget);
    }

    fn connected(&mut self, a: Association, io: &mut Io) {
        let limits = &io.registry.admission.limits;
        self.ledger.associate(
            a.ctrl.buffers.clone(),
            limits.queue_buffer as usize,
            limits.association_buffer as usize,
            a.ctrl.subsys.is_discovery(),
            io.budget,
        );
        self.pending = None;
        self.sq_flow_disabled = a.sq_flow_disabled;
        self.assoc = Some(a);
    }
}

/// Runs a command whose data (if any) has arrived. A Connect that succeeds
/// binds the queue to its association; `held_aers` is how many AERs the
/// queue holds.
pub fn run(
    cmd: &mut Command,
    bind: &mut Binding,
    io: &mut Io,
    caps: TransportCaps,
    peer: &str,
    held_aers: usize,
) -> Ran {
    if !cmd.status.is_success() {
        return Ran::Complete;
    }
    if matches!(cmd.work, Work::Connect) {
        if let Connected::Yes(a) = cmd.connect(io.registry, io.arena, caps, peer) {
            bind.connected(a, io);
        }
        return Ran::Complete;
    }
    let assoc = &mut bind.assoc;
    // A command planned before its queue was deleted (by a Disconnect, or a
    // controller reset) does not execute: it is aborted.
    let Some(a) = assoc.as_ref().filter(|a| !a.is_deleted()) else {
        cmd.status = Status::ABORTED_SQ_DELETION;
        return Ran::Complete;
    };
    match cmd.execute(a, io.arena, held_aers) {
        Progress::Complete if cmd.is_disconnect() && cmd.status.is_success() => {
            end_association(assoc.take(), false);
            bind.ledger.dissociate(io.budget);
            // The connection stays, waiting for a Connect again: as such it
            // needs a pending place, or it closes once this response is out.
            bind.pending = io.registry.admission.pending_connection(&peer);
            Ran::Disconnected
        }
        Progress::Complete => Ran::Complete,
        Progress::Held => Ran::Held,
        Progress::Waiting(entries) => Ran::Waiting(entries),
    }
}

/// The response to a command: SQHD FFFFh where the host disabled SQ flow
/// control, and DNR and the Command Retry Delay as the status and the
/// controller's Host Behavior Support call for.
pub fn response(
    bind: &Binding,
    (cid, status): (u16, Status),
    (dw0, dw1): (u32, u32),
    sq_head: u16,
    sqid: u16,
) -> Cqe {
    let sqhd = if bind.sq_flow_disabled {
        SQHD_FLOW_DISABLED
    } else {
        sq_head
    };
    let crd = bind.assoc.as_ref().map_or(0, |a| a.ctrl.crd(status));
    Cqe {
        dw0,
        dw1,
        sqhd,
        sqid,
        cid,
        status: status.to_field(crd),
    }
}

/// Queues a command's backend operations under `token`; returns how many.
pub fn submit_backend(entries: Entries, token: Token, io: &mut Io) -> usize {
    let n = entries.len();
    for e in entries {
        // SAFETY: a backend operation reads or writes the command's arena
        // buffer (fixed buffer 0, mapped as long as the poller's ring), which
        // the command keeps until `ops_in_flight` is back to zero, and its
        // slot is not freed before (completions arrive through `token`); or
        // it touches no memory (fsync, fallocate).
        unsafe { io.sq.push(e.user_data(token.encode())) };
    }
    n
}

/// Index of a free entry of `slots`, growing it when none is.
pub fn vacant<T>(slots: &mut Vec<Option<T>>) -> usize {
    slots.iter().position(Option::is_none).unwrap_or_else(|| {
        slots.push(None);
        slots.len() - 1
    })
}

/// Feeds a backend completion to a command: a follow-up operation to
/// submit, or whether the command is now complete.
pub enum BackendStep {
    Submit(squeue::Entry),
    Complete,
    Pending,
}

pub fn on_backend(cmd: &mut Command, res: i32, io: &Io) -> BackendStep {
    match cmd.on_backend_done(res, io.arena) {
        Some(next) => BackendStep::Submit(next),
        None if cmd.ops_in_flight == 0 => BackendStep::Complete,
        None => BackendStep::Pending,
    }
}

/// Periodic check of a live queue's association: why it must close, if so.
pub fn check_association(assoc: Option<&Association>, limits: &Limits) -> Option<&'static str> {
    let a = assoc?;
    if a.qid == 0 && a.ctrl.keep_alive_expired() {
        a.ctrl
            .kill("keep-alive timeout (no Keep Alive within KATO)");
    }
    if a.qid == 0 && a.ctrl.enable_overdue(limits.enable_timeout) {
        a.ctrl
            .kill("the host did not enable the controller (CC.EN) within limits.enable_timeout");
    }
    if a.is_deleted() {
        return Some("controller reset: I/O queue deleted");
    }
    (!a.ctrl.is_live()).then_some("controller ended")
}

/// Ends a closed queue's part in its association: losing the admin queue
/// ends the controller (unless the daemon drains, when the I/O queues
/// finish their commands and close on their own).
pub fn end_association(assoc: Option<Association>, stopping: bool) {
    if let Some(a) = assoc {
        if a.qid == 0 && !stopping {
            a.ctrl.kill("admin queue closed");
        } else {
            a.ctrl.release(&a);
        }
    }
}

/// Whether a queue waiting for its handshake or Connect since `since` has
/// waited too long.
pub fn handshake_overdue(since: Instant, limits: &Limits) -> bool {
    since.elapsed() > limits.handshake_timeout
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends stuck past the limit count from the first send with none
    /// completing since; any completion restarts the clock, and a queue
    /// with nothing outstanding is never stuck.
    #[test]
    fn send_watch_counts_from_the_last_progress() {
        let mut w = SendWatch::default();
        assert!(!w.stalled(Duration::ZERO), "nothing sent");
        w.posted();
        std::thread::sleep(Duration::from_millis(2));
        assert!(w.stalled(Duration::ZERO));
        assert!(!w.stalled(Duration::from_secs(60)));
        let first = w.since;
        w.posted();
        assert_eq!(w.since, first, "a second send does not restart the clock");
        w.progressed(true);
        assert!(
            w.since > first,
            "a completion with more outstanding restarts it"
        );
        w.progressed(false);
        assert!(!w.stalled(Duration::ZERO), "nothing outstanding");
    }
}
