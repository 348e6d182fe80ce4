//! A queue pair, as the state machine uses it: the `queue::Wire` of
//! NVMe/RDMA (RDMA READs for host data, RDMA WRITEs chained to response
//! SENDs).

use super::{wr_id, Phase, PROFILE, WR_READ, WR_RESPONSE, WR_RESPONSE_NO_SLOT, WR_WRITE};
use crate::engine::poller::Io;
use crate::engine::queue::{Response, SendWatch, Wire};
use crate::nvme::command::Command;
use crate::nvme::fabric::TransportCaps;
use crate::nvme::port::Arrival;
use rdmablk_common::nvme::Sgl;
use rdmablk_common::rdma::{CmId, SendOp, SendWr, Sge};
use std::collections::VecDeque;
use std::io;
use std::time::Instant;

/// Where a queue's work requests go: its queue pair, or a recorder in
/// unit tests.
pub trait QueuePair {
    /// Posts a chain of send work requests with one doorbell.
    ///
    /// # Safety
    /// As `verbs::post_send`: local memory in the requests is registered
    /// and left to the device until the requests complete (inline data
    /// excepted: it is copied during the call).
    unsafe fn post(&mut self, wrs: &[SendWr]) -> io::Result<()>;

    /// Moves the queue pair to the error state: what is posted completes
    /// as flushed.
    fn disconnect(&mut self);
}

impl QueuePair for CmId {
    unsafe fn post(&mut self, wrs: &[SendWr]) -> io::Result<()> {
        // SAFETY: the QP lives as long as this CM id; the caller vouches
        // for the memory.
        unsafe { rdmablk_common::rdma::verbs::post_send(self.qp(), wrs) }
    }

    fn disconnect(&mut self) {
        CmId::disconnect(self);
    }
}

/// An RDMA READ waiting for one of the queue's READ credits.
struct PendingRead {
    slot: u16,
    /// The command's arena buffer, and how many bytes to read into it.
    local: *mut u8,
    len: u32,
    remote_addr: u64,
    rkey: u32,
}

/// A queue pair, as the state machine uses it.
pub(super) struct RdmaWire<P> {
    pub(super) qp: P,
    /// Where the host reached the target.
    arrival: Arrival,
    /// Local key of the poller's arena on the queue's device.
    lkey: u32,
    idx: u32,
    /// Entries of the queue (HSQSIZE + 1), which sized the send queue.
    pub(super) entries: u16,
    pub(super) phase: Phase,
    pub(super) since: Instant,
    /// RDMA READs we may have outstanding, and how many are.
    read_credits: u8,
    pub(super) reads: u8,
    awaiting_read: VecDeque<PendingRead>,
    /// Signaled work requests posted and not completed.
    pub(super) signaled: usize,
    /// Whether the host takes what is sent (limits.send_timeout).
    pub(super) sends: SendWatch,
}

impl<P: QueuePair> Wire for RdmaWire<P> {
    const DATA_OVERDUE: &'static str =
        "an RDMA READ of the host's data did not complete within limits.data_timeout";
    const SENDS_STALLED: &'static str =
        "the host did not take what was sent to it (no send completed) within limits.send_timeout";

    fn caps(&self) -> TransportCaps {
        PROFILE.caps
    }

    fn arrival(&self) -> &Arrival {
        &self.arrival
    }

    fn queue_entries(&self) -> Option<u16> {
        Some(self.entries)
    }

    /// One RDMA READ of all the data, when a credit is free.
    fn fetch(&mut self, slot: u16, cmd: &mut Command, io: &mut Io) {
        let (Sgl::Keyed { addr, key, .. }, Some(buf)) = (cmd.sqe.sgl(), cmd.buf.as_ref()) else {
            unreachable!("only keyed data is fetched, into a buffer")
        };
        self.awaiting_read.push_back(PendingRead {
            slot,
            local: io.arena.addr(buf, 0),
            len: cmd.len as u32,
            remote_addr: addr,
            rkey: key,
        });
        cmd.requested = cmd.len;
        self.start_reads();
    }

    /// The data (an RDMA WRITE, unsignaled) chained to the response SEND.
    fn respond(&mut self, r: Response<'_>, io: &mut Io) {
        let (slot, kind) = match r.slot {
            Some(s) => (s, WR_RESPONSE),
            None => (0, WR_RESPONSE_NO_SLOT),
        };
        let sgl = r.sqe.sgl();
        let invalidate = match sgl {
            Sgl::Keyed {
                key,
                invalidate: true,
                ..
            } => Some(key),
            _ => None,
        };
        let write_sge = match (r.data, sgl) {
            (Some((buf, len)), Sgl::Keyed { addr, key, .. }) => Some((
                [Sge {
                    addr: io.arena.addr(buf, 0),
                    len: len as u32,
                    lkey: self.lkey,
                }],
                addr,
                key,
            )),
            _ => None,
        };
        let cqe = r.cqe.to_bytes();
        let send_sge = [Sge {
            addr: cqe.as_ptr(),
            len: cqe.len() as u32,
            lkey: 0,
        }];
        let mut wrs: smallvec::SmallVec<[SendWr; 2]> = smallvec::SmallVec::new();
        if let Some((sge, remote_addr, rkey)) = &write_sge {
            wrs.push(SendWr {
                wr_id: wr_id(self.idx, WR_WRITE, slot),
                op: SendOp::RdmaWrite {
                    remote_addr: *remote_addr,
                    rkey: *rkey,
                },
                sges: sge,
                signaled: false,
                inline: false,
            });
        }
        wrs.push(SendWr {
            wr_id: wr_id(self.idx, kind, slot),
            op: SendOp::Send { invalidate },
            sges: &send_sge,
            signaled: true,
            inline: true,
        });
        // SAFETY: the WRITE's source is the command's arena buffer,
        // registered on this device (`lkey`), which the command keeps until
        // the SEND chained after it completes (`Queue::sent`), and the queue
        // is freed only once every signaled request has completed or the QP
        // is destroyed; the response is inline (copied during the call).
        match unsafe { self.qp.post(&wrs) } {
            Ok(()) => {
                self.signaled += 1;
                self.sends.posted();
            }
            // Nothing was posted: the slot is freed at teardown.
            Err(e) => self.fail(&format!("posting a response: {e}")),
        }
    }

    fn closing(&self) -> bool {
        self.phase == Phase::Closing
    }

    /// The queue pair goes to the error state: what is posted completes as
    /// flushed, and the endpoint frees the queue once all has.
    fn shut(&mut self) {
        self.phase = Phase::Closing;
        self.since = Instant::now();
        self.qp.disconnect();
    }

    fn sends(&self) -> &SendWatch {
        &self.sends
    }

    /// Every signaled work request has completed.
    fn drained(&self) -> bool {
        self.signaled == 0
    }

    fn idle(&self) -> bool {
        self.signaled == 0
    }
}

impl<P: QueuePair> RdmaWire<P> {
    /// The wire of queue `idx` on `qp` (reached through `arrival`), whose
    /// arena key is `lkey` and which may have `read_credits` RDMA READs
    /// outstanding.
    pub(super) fn new(
        qp: P,
        arrival: Arrival,
        lkey: u32,
        idx: u32,
        entries: u16,
        read_credits: u8,
    ) -> RdmaWire<P> {
        RdmaWire {
            qp,
            arrival,
            lkey,
            idx,
            entries,
            phase: Phase::Accepting,
            since: Instant::now(),
            read_credits,
            reads: 0,
            awaiting_read: VecDeque::new(),
            signaled: 0,
            sends: SendWatch::default(),
        }
    }

    /// Posts RDMA READs for waiting commands, as far as the credits allow.
    pub(super) fn start_reads(&mut self) {
        while self.reads < self.read_credits && self.phase != Phase::Closing {
            let Some(r) = self.awaiting_read.pop_front() else {
                return;
            };
            let sge = [Sge {
                addr: r.local,
                len: r.len,
                lkey: self.lkey,
            }];
            let wr = SendWr {
                wr_id: wr_id(self.idx, WR_READ, r.slot),
                op: SendOp::RdmaRead {
                    remote_addr: r.remote_addr,
                    rkey: r.rkey,
                },
                sges: &sge,
                signaled: true,
                inline: false,
            };
            // SAFETY: the READ lands in the command's registered arena
            // buffer, which the command keeps until its data has arrived (it
            // cannot run before), and the queue is freed only once every
            // signaled request has completed or the QP is destroyed.
            match unsafe { self.qp.post(&[wr]) } {
                Ok(()) => {
                    self.reads += 1;
                    self.signaled += 1;
                    self.sends.posted();
                }
                Err(e) => return self.fail(&format!("posting an RDMA READ: {e}")),
            }
        }
    }

    /// The queue pair failed under us: close it.
    fn fail(&mut self, why: &str) {
        if self.phase != Phase::Closing {
            tracing::warn!(queue = self.idx, "NVMe/RDMA queue closed: {why}");
            self.shut();
        }
    }
}
