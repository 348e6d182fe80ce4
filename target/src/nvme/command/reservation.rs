//! The reservation commands (NVMe Base 2.1): Register, Acquire
//! and Release change the namespace's reservations and notify the hosts
//! concerned; a Preempt and Abort then waits for the writes already on the
//! backend; with Persist Through Power Loss the state file is written
//! before the command completes. Report returns the state.

use super::{Command, Entries, Progress, Step, Work};
use crate::backend::{BackendOp, Later};
use crate::nvme::controller::Controller;
use crate::nvme::namespace::Namespace;
use crate::service::reservation::ptpl::{Persistent, Saver};
use crate::service::reservation::shared::{self, Change};
use crate::service::reservation::State;
use crate::service::write_gate::{Entry, Pass};
use rdmablk_common::mem::Arena;
use rdmablk_common::nvme::resv::{ResvCmd, KEYS_LEN};
use rdmablk_common::nvme::{nvm, Status};
use std::sync::Arc;

impl Command {
    /// Executes reservation command `op` of `ctrl`'s host.
    pub(super) fn start_reservation(
        &mut self,
        op: u8,
        arena: &mut Arena,
        ctrl: &Arc<Controller>,
    ) -> Progress {
        let Work::Io(req) = &self.work else {
            unreachable!("start_reservation on a non-I/O command")
        };
        let ns = req.ns.clone();
        let r = ns
            .reservations
            .as_ref()
            .expect("decoded with reservations on");
        let host = ctrl.hostid;
        if op == nvm::RESV_REPORT {
            // Host identifiers are 128-bit: only the extended structure
            // holds them (as nvmet).
            if self.sqe.cdw(11) & 1 == 0 {
                self.status = Status::HOST_ID_INCONSISTENT;
            } else if let Some(b) = &self.buf {
                arena.write(b, 0, &r.snapshot().report().encode(self.len));
            }
            return Progress::Complete;
        }
        let mut keys = [0u8; KEYS_LEN];
        let c = ResvCmd::parse(&self.sqe, self.copy_data(arena, &mut keys));
        if let Some(record) = r.record() {
            // The gateway group's record: the change runs on its lane.
            let change: Change = Box::new(move |st: &mut State| match op {
                nvm::RESV_REGISTER => st.register(&host, &c),
                nvm::RESV_ACQUIRE => st.acquire(&host, &c),
                _ => st.release(&host, &c),
            });
            self.step = Step::Shared;
            return self.wait_for(Later::new(move |token, completions| {
                record.submit(change, (completions.clone(), token))
            }));
        }
        let mut persist = false;
        let applied = r.apply(|st| {
            let was = st.ptpl;
            let out = match op {
                nvm::RESV_REGISTER => st.register(&host, &c),
                nvm::RESV_ACQUIRE => st.acquire(&host, &c),
                _ => st.release(&host, &c),
            }?;
            persist = out.changed && (was || st.ptpl);
            Ok(out)
        });
        let out = match applied {
            Ok(out) => out,
            Err(st) => {
                self.status = st;
                return Progress::Complete;
            }
        };
        ctrl.subsys.reservation_notices(ns.nsid, &out.notices);
        if !out.aborted.is_empty() {
            if let Some(p) = self.drain(ns.clone(), out.aborted.len(), persist) {
                return p;
            }
        }
        if persist {
            return self.persist(ns);
        }
        Progress::Complete
    }

    /// A Preempt and Abort of `hosts` hosts: every write already on the
    /// backend ends before the Acquire completes (those not yet there are
    /// aborted when they would start: `aborted_since`). The wait, unless
    /// none is on the backend; then the state file if `persist`.
    fn drain(&mut self, ns: Arc<Namespace>, hosts: usize, persist: bool) -> Option<Progress> {
        tracing::info!(
            nsid = ns.nsid,
            hosts,
            "preempt and abort: waiting for the writes on the backend"
        );
        match ns.gate.enter_exclusive(0..u64::MAX) {
            Entry::Pass(p) => {
                ns.gate.leave(p);
                None
            }
            Entry::Wait(id) => {
                self.step = Step::Drain { id, persist };
                Some(self.wait_for(Later::new(move |token, completions| {
                    ns.gate.wait(id, token, completions)
                })))
            }
        }
    }

    /// Waits for the state file of `ns` to be written.
    fn persist(&mut self, ns: Arc<Namespace>) -> Progress {
        self.step = Step::Persist;
        let what: Arc<dyn Persistent> = ns;
        self.wait_for(Later::new(move |token, completions| {
            Saver::get().save(&what, token, completions)
        }))
    }

    fn wait_for(&mut self, later: Later) -> Progress {
        self.ops_in_flight = 1;
        let mut entries = Entries::new();
        entries.push(BackendOp::Later(later));
        Progress::Waiting(entries)
    }

    /// What ended a reservation command's wait (`res`: 0, or the state
    /// file's -errno) leads to.
    pub(super) fn reservation_done(&mut self, res: i32) -> Entries {
        let Work::Io(req) = &self.work else {
            unreachable!("reservation_done of a non-I/O command")
        };
        match self.step {
            Step::Drain { id, persist } => {
                self.step = Step::Run;
                req.ns.gate.leave(Pass::Held(id));
                if persist {
                    if let Progress::Waiting(e) = self.persist(req.ns.clone()) {
                        self.ops_in_flight -= 1;
                        return e;
                    }
                }
            }
            Step::Shared => {
                self.step = Step::Run;
                match res {
                    0 => {}
                    aborted @ 1..shared::STATUS => {
                        let hosts = aborted as usize;
                        if let Some(Progress::Waiting(e)) = self.drain(req.ns.clone(), hosts, false)
                        {
                            self.ops_in_flight -= 1;
                            return e;
                        }
                    }
                    r if r > 0 && r & shared::STATUS != 0 => {
                        self.status = Status {
                            sct: (r >> 8) as u8,
                            sc: r as u8,
                        }
                    }
                    e => {
                        tracing::error!(
                            nsid = req.ns.nsid,
                            "the gateway group's reservation record failed: {}; the command fails",
                            std::io::Error::from_raw_os_error(-e)
                        );
                        self.status = Status::INTERNAL_ERROR;
                    }
                }
            }
            Step::Persist => {
                self.step = Step::Run;
                if res < 0 {
                    tracing::error!(
                        nsid = req.ns.nsid,
                        "cannot write the reservation state file: {}; the command fails",
                        std::io::Error::from_raw_os_error(-res)
                    );
                    self.status = Status::INTERNAL_ERROR;
                }
            }
            _ => unreachable!("no reservation wait at {:?}", self.step),
        }
        Entries::new()
    }
}
