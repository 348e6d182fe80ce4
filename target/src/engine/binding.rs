//! What a queue holds of the target, whatever its transport: its
//! association with a controller, the arena space it uses (through its
//! ledger), its place among connections waiting for their Connect; and the
//! rules that follow from them: the response fields, the periodic checks
//! of the association, and ending it when the queue goes.

use crate::base::admission::Permit;
use crate::base::budget::{Ledger, Staged};
use crate::config::Limits;
use crate::engine::poller::Io;
use crate::nvme::command::Command;
use crate::nvme::controller::Association;
use rdmablk_common::fabrics::SQHD_FLOW_DISABLED;
use rdmablk_common::mem::ArenaBuf;
use rdmablk_common::nvme::{Cqe, Status};
use std::time::Duration;

/// What a queue may hold before its Connect: the Connect's 1 KiB of data,
/// in one page.
const CONNECT_BUDGET: usize = rdmablk_common::mem::MIN_BUF;

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
        if self.acre() {
            Status::COMMAND_INTERRUPTED
        } else {
            Status::TRANSIENT_TRANSPORT_ERROR
        }
    }

    /// Whether the host enabled Advanced Command Retry (Host Behavior
    /// Support): the controller may then answer Command Interrupted.
    pub fn acre(&self) -> bool {
        self.assoc.as_ref().is_some_and(|a| a.ctrl.acre())
    }

    /// Copies staged data into the command's buffer, which it now has.
    pub fn unstage_into(&mut self, cmd: &mut Command, io: &mut Io) {
        if let (Some(d), Some(b)) = (cmd.staged.take(), cmd.buf.as_ref()) {
            io.arena.write(b, 0, &d);
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

    /// Binds the queue to the association its Connect created or joined.
    pub fn connected(&mut self, a: Association, io: &mut Io) {
        let limits = &io.registry.admission.limits;
        self.ledger.associate(
            a.ctrl.buffers.clone(),
            limits.queue_buffer as usize,
            io.registry.admission.association_buffer as usize,
            a.ctrl.subsys.is_discovery(),
            io.budget,
        );
        self.pending = None;
        self.sq_flow_disabled = a.sq_flow_disabled;
        self.assoc = Some(a);
    }

    /// A Disconnect deleted the queue: it leaves its association and, as a
    /// connection waiting for a Connect again, needs a pending place (or it
    /// closes once the response is out).
    pub fn disconnected(&mut self, io: &mut Io, peer: &str) {
        end_association(self.assoc.take(), false);
        self.ledger.dissociate(io.budget);
        self.pending = io.registry.admission.pending_connection(&peer);
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

/// How long the queues of an ended association may keep it open for the
/// responses already on their wires (an AUTH_Failure1, the last completion
/// before a fatal error) to reach the host.
pub const END_GRACE: Duration = Duration::from_secs(1);

/// Periodic check of a live queue's association: why it must close, if so.
/// A queue of an ended association closes once its wire is `drained`, so
/// that the host gets the responses it was sent (a disconnect flushes an
/// RDMA SEND still queued, and the host would wait for a command timeout),
/// and [`END_GRACE`] after the end whatever is on it.
pub fn check_association(
    assoc: Option<&Association>,
    limits: &Limits,
    drained: bool,
) -> Option<&'static str> {
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
    if a.auth_overdue(limits.handshake_timeout) {
        a.ctrl
            .kill("authentication not finished within limits.handshake_timeout");
    }
    (!a.ctrl.is_live() && (drained || a.ctrl.ended_for(END_GRACE))).then_some("controller ended")
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
