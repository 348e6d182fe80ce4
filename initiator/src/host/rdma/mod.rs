//! An NVMe/RDMA queue of the host: RDMA CM connect with the NVMe/RDMA
//! private data, command capsules sent from a registered capsule area (small
//! writes with their data in the capsule), keyed SGLs that let the target
//! RDMA READ/WRITE the buffer of one command in flight, responses received
//! into registered slots. Driven by the caller's io_uring (polls on the
//! completion and CM channels) or, for the admin queue, by blocking waits.
//!
//! The caller's memory is registered for local access only. A command's
//! key reaches just its buffer, in the one direction its transfer needs,
//! and only until it completes ([`RemoteAccess`]): the target can touch no
//! other buffer, and none after the command is over.
//!
//! This module holds the queue's state and its accessors; `connect` sets a
//! queue up, `submit` sends commands, and `completion` takes their
//! completions and the queue's failure.

mod completion;
mod connect;
mod submit;

use super::slots::{InFlight, Slots};
use super::Done;
use super::{HostError, QueueLimits};
use rdmablk_common::nvme::{Cqe, CQE_LEN, SQE_LEN};
use rdmablk_common::rdma::{access, CmChannel, CmId, Completion, Cq, Mr, Mw, Pd, Sge};
use std::net::SocketAddr;
use std::sync::Arc;

/// What a work request was, in the bits of its wr_id above the command id
/// (receives carry their response slot and kind 0).
mod wr_kind {
    pub const SHIFT: u32 = 32;
    pub const RECV: u64 = 0;
    pub const SEND: u64 = 1;
    pub const BIND: u64 = 2;
    pub const INVALIDATE: u64 = 3;
}

fn wr_id(kind: u64, cid: u16) -> u64 {
    kind << wr_kind::SHIFT | cid as u64
}

/// How the target is given access to a command's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAccess {
    /// One type 2 memory window per command slot, bound to the command's
    /// buffer just before its capsule is sent (same doorbell) and revoked
    /// when it completes: by the target's SEND with Invalidate, which the
    /// keyed SGL asks for (subtype Fh), else by a local invalidate before
    /// the command completes. Where the device has type 2 windows (RoCE
    /// and InfiniBand NICs), soft-RoCE excepted.
    Windows,
    /// A registration of the command's buffer, deregistered when it
    /// completes (a system call each way): devices without windows, and
    /// soft-RoCE, whose retransmissions after an RNR NAK run a queue
    /// pair's window binds again.
    Registrations,
}

/// The key a command's data is reachable by, until revoked.
enum Key {
    /// The slot's window, bound with `rkey` (kept while a local invalidate
    /// of it is in flight).
    Window { rkey: u32 },
    /// A registration of the buffer alone, deregistered on drop.
    Registration(Mr),
}

/// Registered memory the queue owns: capsules out, responses in.
struct Area<const N: usize> {
    /// Declared first: deregistered before `mem` is freed.
    mr: Mr,
    mem: Vec<[u8; N]>,
}

impl<const N: usize> Area<N> {
    fn new(pd: &Arc<Pd>, count: usize) -> Result<Area<N>, HostError> {
        let mut mem = vec![[0u8; N]; count];
        // SAFETY: `mem` is never reallocated and outlives its registration
        // (field order of `Area`).
        let mr =
            unsafe { Mr::register(pd, mem.as_mut_ptr().cast(), count * N, access::LOCAL_WRITE) }?;
        Ok(Area { mr, mem })
    }

    fn sge(&self, i: usize) -> Sge {
        Sge {
            addr: self.mem[i].as_ptr(),
            len: N as u32,
            lkey: self.mr.lkey(),
        }
    }
}

struct Inflight {
    tag: u64,
    /// The capsule's SEND completed (its buffers are free again).
    sent: bool,
    /// The response arrived.
    cqe: Option<Cqe>,
    /// The target's access to the command's data, until revoked.
    key: Option<Key>,
}

impl InFlight for Inflight {
    fn tag(&self) -> u64 {
        self.tag
    }
}

/// One NVMe/RDMA queue (admin or I/O).
pub struct RdmaQueue {
    /// One per command slot (`RemoteAccess::Windows`). Declared first: a
    /// bound window holds its queue pair (rxe cannot destroy a queue pair
    /// that windows are still bound to), and without windows nothing of
    /// ours is remotely reachable while the queue pair goes.
    windows: Vec<Mw>,
    /// Declared before the memory areas: the queue pair goes before the
    /// memory it may touch.
    id: CmId,
    cm: Arc<CmChannel>,
    cq: Cq,
    pd: Arc<Pd>,
    addr: SocketAddr,
    capsules: Area<SQE_LEN>,
    responses: Area<CQE_LEN>,
    remote: RemoteAccess,
    /// Caller memory registered for data: local access, and memory window
    /// binding with `RemoteAccess::Windows`.
    regions: Vec<Mr>,
    limits: QueueLimits,
    slots: Slots<Inflight>,
    cq_armed: bool,
    cm_armed: bool,
    wcs: Vec<Completion>,
    /// The engine polls the CQ itself every round ([`RdmaQueue::poll_cq`])
    /// instead of waiting for the completion channel.
    busy_poll: bool,
}

// SAFETY: the queue is used by one thread at a time; verbs objects may move
// between threads.
unsafe impl Send for RdmaQueue {}

impl RdmaQueue {
    /// Registers caller memory for data: local access only (and memory
    /// window binding); the target reaches a command's buffer by its key.
    ///
    /// # Safety
    /// The memory must stay mapped while the queue lives.
    pub unsafe fn register(&mut self, base: *mut u8, len: usize) -> Result<(), HostError> {
        if self.regions.iter().any(|r| r.contains(base, len)) {
            return Ok(());
        }
        let rights = match self.remote {
            RemoteAccess::Windows => access::LOCAL_WRITE | access::MW_BIND,
            RemoteAccess::Registrations => access::LOCAL_WRITE,
        };
        // SAFETY: the caller keeps the memory mapped while the queue (which
        // owns the region) lives.
        let mr = unsafe { Mr::register(&self.pd, base, len, rights) }?;
        self.regions.push(mr);
        Ok(())
    }

    /// Deregisters the caller memory; only while no command is in flight.
    pub fn forget_regions(&mut self) {
        debug_assert!(self.idle(), "deregistering memory of commands in flight");
        self.regions.clear();
    }

    /// Sets the in-capsule data size the target accepts (from IOCCSZ).
    pub fn set_in_capsule(&mut self, n: usize) {
        self.limits.in_capsule = n;
    }

    /// The queue's limits (depth, in-capsule data size).
    pub fn limits(&self) -> QueueLimits {
        self.limits
    }

    /// The target's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Command slots free now (none once the queue failed).
    pub fn free_slots(&self) -> usize {
        self.slots.free_slots()
    }

    /// Why the queue failed, if it did.
    pub fn failed(&self) -> Option<&str> {
        self.slots.failed()
    }

    /// No command is in flight (or the queue failed).
    pub fn idle(&self) -> bool {
        self.slots.all_free() || self.slots.failed().is_some()
    }

    /// Whether completions wait to be taken.
    pub fn has_done(&self) -> bool {
        self.slots.has_done()
    }

    /// Moves the completions waiting to be taken into `out`.
    pub fn take_done(&mut self, out: &mut Vec<Done>) {
        self.slots.take_done(out);
    }

    /// Makes the caller poll the CQ itself ([`RdmaQueue::poll_cq`]) rather
    /// than wait for the completion channel: no interrupt, no event, no
    /// system call per completion (busy polling).
    pub fn set_busy_poll(&mut self, on: bool) {
        self.busy_poll = on;
    }
}
