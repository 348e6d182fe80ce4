//! One NVMe/RDMA queue: its queue and wire, the capsules its receives
//! bring, its work request completions, deadlines and drain.

use super::wire::{QueuePair, RdmaWire};
use super::{Phase, WR_READ, WR_RESPONSE, WR_RESPONSE_NO_SLOT, WR_WRITE};
use crate::engine::poller::Io;
use crate::engine::queue::{InCapsule, Intake, Queue};
use rdmablk_common::mem::ArenaBuf;
use rdmablk_common::nvme::Sqe;
use rdmablk_common::rdma::Completion;

/// One NVMe/RDMA queue pair: one queue of a controller.
pub(super) struct RdmaQueue<P> {
    pub(super) q: Queue,
    pub(super) w: RdmaWire<P>,
    pub(super) dev: usize,
    pub(super) qp_num: u32,
    /// Send queue size (its share of the device's CQ).
    pub(super) send_wr: u32,
}

impl<P: QueuePair> RdmaQueue<P> {
    pub(super) fn close(&mut self, why: &str) {
        self.q.close(&mut self.w, why);
    }

    /// Periodic checks of every deadline of a queue not closed yet
    /// (Connect, keep-alive and enable, RDMA READs, send progress: see
    /// `Queue::check_deadlines`).
    pub(super) fn on_tick(&mut self, io: &Io) {
        if self.w.phase == Phase::Closing {
            return;
        }
        self.q
            .check_deadlines(&mut self.w, &io.registry.admission.limits);
    }

    /// A command capsule arrived with `data_len` bytes of in-capsule data in
    /// the receive's buffer `recv_data` (which the command may take).
    pub(super) fn on_capsule(
        &mut self,
        sqe: &Sqe,
        data_len: usize,
        recv_data: &mut Option<ArenaBuf>,
        io: &mut Io,
    ) {
        tracing::trace!(peer = %self.q.peer, cid = sqe.cid(), opcode = sqe.opcode(), sgl = ?sqe.sgl(), data_len, "capsule");
        let data = InCapsule::Buffer {
            buf: recv_data,
            len: data_len,
        };
        match self.q.receive(sqe, data, io, &mut self.w) {
            Intake::Taken => {}
            // A receive is consumed whatever we do: no stream to leave it in.
            Intake::Stall | Intake::Overrun => {
                self.close("the host sent more commands than its queue holds")
            }
        }
    }

    /// A send work request of this queue completed.
    pub(super) fn on_send_done(&mut self, kind: u64, slot: u16, wc: &Completion, io: &mut Io) {
        if kind == WR_WRITE {
            // Unsignaled: only a failure (or flush) completes alone.
            if !wc.is_flush() {
                self.close(&format!("RDMA WRITE failed: {}", wc.status_str()));
            }
            return;
        }
        self.w.signaled -= 1;
        self.w.sends.progressed(self.w.signaled > 0);
        if kind == WR_READ {
            self.w.reads -= 1;
        }
        if !wc.ok() && !wc.is_flush() {
            let what = if kind == WR_READ {
                "RDMA READ"
            } else {
                "response SEND"
            };
            self.close(&format!("{what} failed: {}", wc.status_str()));
        }
        match kind {
            WR_RESPONSE => self.q.sent(Some(slot), io),
            WR_RESPONSE_NO_SLOT => self.q.sent(None, io),
            WR_READ if wc.ok() => {
                let len = self.q.command(slot).map_or(0, |c| c.len);
                self.q.data_arrived(slot, len, true, io, &mut self.w);
                self.w.start_reads();
            }
            _ => {}
        }
    }

    /// Whether the queue waits only for its host (the poller need not pump
    /// it until an event: `engine::ready`): live, with nothing in progress.
    pub(super) fn quiet(&self) -> bool {
        self.w.phase == Phase::Live && self.q.quiet()
    }

    /// Lets the queue move on (arena space freed, a drain).
    pub(super) fn pump(&mut self, io: &mut Io) {
        if self.w.phase == Phase::Closing {
            return;
        }
        self.q.pump(io, &mut self.w);
        // The target's shutdown does not wait for work requests in flight:
        // the disconnect flushes them.
        self.q.close_when_done(&mut self.w, io.stopping);
    }
}
