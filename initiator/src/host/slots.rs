//! The command slots of one host queue, whatever its transport: the command
//! ids free and in flight, completions not yet taken, and why the queue
//! failed.

use super::Done;
use rdmablk_common::nvme::{Cqe, Status};

/// A command in flight, as its transport keeps it.
pub(crate) trait InFlight {
    /// The submitter's tag, handed back with the completion.
    fn tag(&self) -> u64;
}

/// A queue's command slots: the command id is the slot's index.
pub(crate) struct Slots<T> {
    cmds: Vec<Option<T>>,
    free: Vec<u16>,
    done: Vec<Done>,
    failed: Option<String>,
}

impl<T: InFlight> Slots<T> {
    /// `depth` free slots.
    pub(crate) fn new(depth: u16) -> Self {
        Slots {
            cmds: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            done: Vec::new(),
            failed: None,
        }
    }

    /// Keeps the first `depth` slots only (the controller allows fewer).
    pub(crate) fn shrink(&mut self, depth: u16) {
        self.free.retain(|&c| c < depth);
        self.cmds.truncate(depth as usize);
    }

    /// A free command id for a new command; none once the queue failed.
    pub(crate) fn claim(&mut self) -> Option<u16> {
        match self.failed {
            Some(_) => None,
            None => self.free.pop(),
        }
    }

    /// Gives back an id [`Slots::claim`] gave, for a command never sent.
    pub(crate) fn unclaim(&mut self, cid: u16) {
        self.free.push(cid);
    }

    /// Records command `cid` (claimed) as in flight.
    pub(crate) fn start(&mut self, cid: u16, cmd: T) {
        self.cmds[cid as usize] = Some(cmd);
    }

    /// Command `cid`, when it is in flight.
    pub(crate) fn get(&self, cid: u16) -> Option<&T> {
        self.cmds.get(cid as usize).and_then(Option::as_ref)
    }

    /// Command `cid`, when it is in flight.
    pub(crate) fn get_mut(&mut self, cid: u16) -> Option<&mut T> {
        self.cmds.get_mut(cid as usize).and_then(Option::as_mut)
    }

    /// The commands in flight, with their ids.
    pub(crate) fn in_flight(&self) -> impl Iterator<Item = (u16, &T)> {
        self.cmds
            .iter()
            .enumerate()
            .filter_map(|(cid, c)| Some((cid as u16, c.as_ref()?)))
    }

    /// Ends command `cid` with `cqe`: its completion waits to be taken and
    /// its slot is free again. Returns the command, or `None` when `cid` is
    /// not in flight.
    pub(crate) fn complete(&mut self, cid: u16, cqe: Cqe) -> Option<T> {
        let c = self.cmds.get_mut(cid as usize)?.take()?;
        self.done.push(Done { tag: c.tag(), cqe });
        self.free.push(cid);
        Some(c)
    }

    /// Commands that can still be submitted (none once the queue failed).
    pub(crate) fn free_slots(&self) -> usize {
        match self.failed {
            Some(_) => 0,
            None => self.free.len(),
        }
    }

    /// Whether no command is in flight.
    pub(crate) fn all_free(&self) -> bool {
        self.free.len() == self.cmds.len()
    }

    /// Whether completions wait to be taken.
    pub(crate) fn has_done(&self) -> bool {
        !self.done.is_empty()
    }

    /// Moves the completions waiting to be taken into `out`.
    pub(crate) fn take_done(&mut self, out: &mut Vec<Done>) {
        out.append(&mut self.done);
    }

    /// Takes the completion of the command tagged `tag`, if it came.
    pub(crate) fn take_done_of(&mut self, tag: u64) -> Option<Done> {
        let i = self.done.iter().position(|d| d.tag == tag)?;
        Some(self.done.swap_remove(i))
    }

    /// Why the queue failed, if it did.
    pub(crate) fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Marks the queue failed for `why` (logged); false when it already was.
    pub(crate) fn set_failed(&mut self, why: String) -> bool {
        if self.failed.is_some() {
            return false;
        }
        tracing::error!("I/O queue failed: {why}");
        self.failed = Some(why);
        true
    }

    /// Completes every command in flight with a transient transport error.
    pub(crate) fn fail_all(&mut self) {
        for cid in 0..self.cmds.len() as u16 {
            let cqe = Cqe {
                cid,
                status: Status::TRANSIENT_TRANSPORT_ERROR.to_field(0),
                ..Default::default()
            };
            self.complete(cid, cqe);
        }
    }
}
