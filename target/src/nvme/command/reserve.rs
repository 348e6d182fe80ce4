//! The reservation commands (NVMe Base 2.1): Register, Acquire
//! and Release change the namespace's reservations and notify the hosts
//! concerned; a Preempt and Abort then waits for the writes already on the
//! backend; with Persist Through Power Loss the state file is written
//! before the command completes. Report returns the state.

use super::{Command, Entries, Progress, Step, Work};
use crate::backend::{BackendOp, Later};
use crate::nvme::controller::Controller;
use crate::nvme::reservation::ptpl::{Persistent, Saver};
use crate::nvme::subsystem::Namespace;
use crate::nvme::write_gate::{Entry, Pass};
use rdmablk_common::mem::Arena;
use rdmablk_common::nvme::resv::{ResvCmd, KEYS_LEN};
use rdmablk_common::nvme::{nvm, Status};
use std::sync::Arc;

impl Command {
    /// Executes reservation command `op` of `ctrl`'s host.
    pub(super) fn reserve(
        &mut self,
        op: u8,
        arena: &mut Arena,
        ctrl: &Arc<Controller>,
    ) -> Progress {
        let Work::Io(req) = &self.work else {
            unreachable!("reserve on a non-I/O command")
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
        for (h, kind) in &out.notices {
            for c in ctrl
                .subsys
                .live_controllers()
                .iter()
                .filter(|c| c.hostid == *h)
            {
                c.reservation_notice(*kind, ns.nsid);
            }
        }
        if !out.aborted.is_empty() {
            tracing::info!(
                nsid = ns.nsid,
                hosts = out.aborted.len(),
                "preempt and abort: waiting for the writes on the backend"
            );
            // Every write already on the backend ends before the Acquire
            // completes; those not yet there are aborted when they would
            // start (`aborted_since`).
            match ns.gate.enter_exclusive(0..u64::MAX) {
                Entry::Pass(p) => ns.gate.leave(p),
                Entry::Wait(id) => {
                    self.step = Step::Drain { id, persist };
                    return self.wait_for(Later::new(move |token, completions| {
                        ns.gate.wait(id, token, completions)
                    }));
                }
            }
        }
        if persist {
            return self.persist(ns);
        }
        Progress::Complete
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
