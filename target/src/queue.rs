//! What every transport's queue does the same way around a command: run it
//! (Connect or execute), feed backend completions back to it, watch the
//! association on ticks, and end the association when the queue goes.

use crate::command::{Command, Connected, Progress, Work};
use crate::controller::{Association, TransportCaps};
use crate::poller::{Io, Token};
use io_uring::squeue;

/// What running a command led to.
pub enum Ran {
    /// The response can be sent now.
    Complete,
    /// An AER to hold: its slot can be freed, its CID answered later.
    Held,
    /// Backend operations to submit; their completions finish the command.
    Waiting(Vec<squeue::Entry>),
}

/// Runs a command whose data (if any) has arrived. A Connect that succeeds
/// sets `assoc`; `held_aers` is how many AERs the queue holds.
pub fn run(
    cmd: &mut Command,
    assoc: &mut Option<Association>,
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
            *assoc = Some(a);
        }
        return Ran::Complete;
    }
    let a = assoc.as_ref().expect("plan() requires an association");
    match cmd.execute(a, io.arena, held_aers) {
        Progress::Complete => Ran::Complete,
        Progress::Held => Ran::Held,
        Progress::Waiting(entries) => Ran::Waiting(entries),
    }
}

/// Queues a command's backend operations under `token`; returns how many.
pub fn submit_backend(entries: Vec<squeue::Entry>, token: Token, io: &mut Io) -> usize {
    let n = entries.len();
    io.sq
        .extend(entries.into_iter().map(|e| e.user_data(token.encode())));
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
pub fn check_association(assoc: Option<&Association>) -> Option<&'static str> {
    let a = assoc?;
    if a.qid == 0 && a.ctrl.keep_alive_expired() {
        a.ctrl
            .kill("keep-alive timeout (no Keep Alive within KATO)");
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
            a.ctrl.release_queue(a.qid);
        }
    }
}
