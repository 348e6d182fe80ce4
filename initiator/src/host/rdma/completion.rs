//! Taking completions: the channels' polls in the caller's ring, response
//! receives, revoking the target's keys, and the queue's failure.

use super::{wr_id, wr_kind, Inflight, Key, RdmaQueue};
use io_uring::{opcode, types};
use rdmablk_common::nvme::{Cqe, CQE_LEN};
use rdmablk_common::rdma::{CmEventKind, Completion, SendOp, SendWr};
use rdmablk_common::ring::Submissions;

impl RdmaQueue {
    pub(super) fn post_recv(&mut self, i: usize) -> std::io::Result<()> {
        let sge = [self.responses.sge(i)];
        // SAFETY: the response slot is registered and belongs to this receive
        // until it completes.
        unsafe {
            rdmablk_common::rdma::verbs::post_recv(
                self.id.qp(),
                wr_id(wr_kind::RECV, i as u16),
                &sge,
            )
        }
    }

    /// Keeps polls on the completion channel (`cq_ud`, unless the caller
    /// polls the CQ itself) and the CM channel (`cm_ud`) in the caller's ring.
    pub fn pump(&mut self, sq: &mut Submissions, cq_ud: u64, cm_ud: u64) {
        if self.slots.failed().is_some() {
            return;
        }
        if !self.cq_armed && !self.busy_poll {
            let e = opcode::PollAdd::new(types::Fd(self.cq.fd()), libc::POLLIN as u32);
            // SAFETY: a poll points at no memory.
            unsafe { sq.push(e.build().user_data(cq_ud)) };
            self.cq_armed = true;
        }
        if !self.cm_armed {
            let e = opcode::PollAdd::new(types::Fd(self.cm.fd()), libc::POLLIN as u32);
            // SAFETY: a poll points at no memory.
            unsafe { sq.push(e.build().user_data(cm_ud)) };
            self.cm_armed = true;
        }
    }

    /// The completion channel was readable: take completions.
    pub fn on_cq_ready(&mut self) {
        self.cq_armed = false;
        if self.slots.failed().is_some() {
            return;
        }
        if let Err(e) = self.cq.take_events() {
            return self.fail(format!("re-arming the CQ: {e}"));
        }
        self.poll_cq();
    }

    /// Takes the completions the CQ holds; returns whether there were any.
    pub fn poll_cq(&mut self) -> bool {
        if self.slots.failed().is_some() {
            return false;
        }
        let mut any = false;
        let mut wcs = std::mem::take(&mut self.wcs);
        loop {
            wcs.clear();
            match self.cq.poll(&mut wcs) {
                Ok(0) => break,
                Ok(_) => any = true,
                Err(e) => {
                    self.fail(format!("polling the CQ: {e}"));
                    break;
                }
            }
            // A request that failed puts the queue pair in error and flushes
            // the others: report it, not a flush ahead of it in the batch.
            if let Some(wc) = wcs.iter().find(|wc| !wc.ok() && !wc.is_flush()) {
                self.on_completion(wc);
            }
            for wc in &wcs {
                self.on_completion(wc);
            }
        }
        self.wcs = wcs;
        // A failure completed every command: news too.
        any || self.slots.failed().is_some()
    }

    /// The CM channel was readable: a disconnect ends the queue.
    pub fn on_cm_ready(&mut self) {
        self.cm_armed = false;
        loop {
            match self.cm.next_event() {
                Ok(Some(ev)) => match ev.kind {
                    CmEventKind::Disconnected | CmEventKind::DeviceRemoval | CmEventKind::Error => {
                        self.fail(format!("the target disconnected ({})", ev.name))
                    }
                    _ => tracing::debug!(event = %ev.name, "RDMA CM event"),
                },
                Ok(None) => return,
                Err(e) => return self.fail(format!("RDMA CM: {e}")),
            }
        }
    }

    fn on_completion(&mut self, wc: &Completion) {
        if self.slots.failed().is_some() {
            return;
        }
        let kind = wc.wr_id >> wr_kind::SHIFT;
        let cid = wc.wr_id as u16;
        if !wc.ok() {
            let what = match kind {
                wr_kind::SEND => "command SEND",
                wr_kind::BIND => "binding a memory window",
                wr_kind::INVALIDATE => "invalidating a memory window",
                _ => "response receive",
            };
            let why = if wc.is_flush() {
                " (the queue pair was already in the error state: the target's access was refused, or see the kernel log)"
            } else {
                ""
            };
            return self.fail(format!("{what} failed: {}{why}", wc.status_str()));
        }
        match kind {
            wr_kind::SEND => {
                if let Some(c) = self.slots.get_mut(cid) {
                    c.sent = true;
                }
                self.finish(cid)
            }
            wr_kind::INVALIDATE => {
                if let Some(c) = self.slots.get_mut(cid) {
                    c.key = None;
                }
                self.finish(cid)
            }
            _ => self.on_response(cid as usize, wc),
        }
    }

    /// A response arrived in receive slot `slot`.
    fn on_response(&mut self, slot: usize, wc: &Completion) {
        if (wc.byte_len as usize) < CQE_LEN {
            return self.fail(format!("a {}-byte response", wc.byte_len));
        }
        let cqe = Cqe::from_bytes(&self.responses.mem[slot]);
        if let Err(e) = self.post_recv(slot) {
            return self.fail(format!("posting a receive: {e}"));
        }
        let cid = cqe.cid;
        let Some(c) = self.slots.get_mut(cid).filter(|c| c.cqe.is_none()) else {
            return self.fail(format!("a response for unknown command id {cid}"));
        };
        c.cqe = Some(cqe);
        let key = c.key.take();
        let invalidated = wc.invalidated_rkey;
        if let Some(k) = invalidated {
            // Another command's key revoked: its window would be invalidated
            // twice, and that command's buffer handed back while the target
            // may think it still has it.
            let other = self.slots.in_flight().find(|(i, c)| {
                *i != cid
                    && matches!(c, Inflight { key: Some(Key::Window { rkey }), .. } if *rkey == k)
            });
            if let Some((other, _)) = other {
                return self.fail(format!(
                    "the target invalidated key {k:#x} of command {other} with the response to command {cid}"
                ));
            }
        }
        match key {
            None | Some(Key::Registration(_)) => {}
            // Revoked by the target, as the keyed SGL asked.
            Some(Key::Window { rkey }) if invalidated == Some(rkey) => {}
            // The target did not invalidate: revoke the key before the
            // buffer goes back to the caller.
            Some(Key::Window { rkey }) => {
                let wr = SendWr {
                    wr_id: wr_id(wr_kind::INVALIDATE, cid),
                    op: SendOp::LocalInvalidate { rkey },
                    sges: &[],
                    signaled: true,
                    inline: false,
                };
                // SAFETY: the QP is alive; a local invalidate touches no
                // memory of ours.
                let posted = unsafe { rdmablk_common::rdma::verbs::post_send(self.id.qp(), &[wr]) };
                if let Err(e) = posted {
                    return self.fail(format!("invalidating a memory window: {e}"));
                }
                if let Some(c) = self.slots.get_mut(cid) {
                    c.key = Some(Key::Window { rkey });
                }
            }
        }
        self.finish(cid);
    }

    /// Completes a command once its SEND and its response are done and the
    /// target's access to its buffer is revoked.
    fn finish(&mut self, cid: u16) {
        let cqe = match self.slots.get(cid) {
            Some(Inflight {
                sent: true,
                cqe: Some(cqe),
                key: None,
                ..
            }) => *cqe,
            _ => return,
        };
        self.slots.complete(cid, cqe);
    }

    /// Ends the queue: the QP goes to the error state (the target can no
    /// longer reach our memory) and every command completes with an error.
    pub fn fail(&mut self, why: String) {
        if self.slots.set_failed(why) {
            self.id.disconnect();
            self.slots.fail_all();
        }
    }
}
