//! What a poller keeps per RDMA device: its protection domain, the arena's
//! registration, a CQ, and an SRQ whose receives hold command capsules.

use super::{IN_CAPSULE_DATA, RECV_BIT};
use crate::engine::poller::Io;
use rdmablk_common::mem::ArenaBuf;
use rdmablk_common::nvme::SQE_LEN;
use rdmablk_common::rdma::{access, CompChannel, Cq, Device, Mr, Pd, Sge, Srq};
use std::io;
use std::sync::Arc;

/// Receives posted on each SRQ (shared by all queues of a poller on a device;
/// RNR retry covers bursts beyond it).
const SRQ_DEPTH: u32 = 256;
/// Completion queue entries per poller and device: the SRQ's receives plus
/// the send queues of every queue pair on it (a queue that would not fit is
/// refused rather than risking an overrun).
const CQ_ENTRIES: u32 = 65536;

/// The 64-byte command capsule area of the SRQ receives.
pub(super) struct CapsuleArea {
    /// Declared first: deregistered before `mem` is freed.
    mr: Mr,
    pub(super) mem: Vec<[u8; SQE_LEN]>,
}

/// One posted (or waiting to be posted) SRQ receive.
pub(super) struct RecvSlot {
    /// Arena buffer for in-capsule data; `None` while waiting for space.
    pub(super) data: Option<ArenaBuf>,
}

/// What a poller keeps per RDMA device.
pub(super) struct DeviceRes {
    pub(super) device: Device,
    pub(super) max_rd_atom: u8,
    pub(super) max_qp_wr: u32,
    pub(super) pd: Arc<Pd>,
    pub(super) arena_mr: Mr,
    pub(super) capsules: CapsuleArea,
    pub(super) cq: Cq,
    /// Entries of the CQ, and how many its SRQ and queue pairs may fill.
    pub(super) cq_size: u32,
    pub(super) cq_committed: u32,
    pub(super) srq: Arc<Srq>,
    pub(super) recvs: Vec<RecvSlot>,
    /// Receive slots waiting for an arena buffer before being posted again.
    pub(super) unposted: Vec<u32>,
    /// A poll on the completion channel is in the ring.
    pub(super) armed: bool,
}

impl DeviceRes {
    pub(super) fn new(device: Device, io: &mut Io) -> io::Result<DeviceRes> {
        let attrs = device.attrs()?;
        let pd = Pd::new(device)?;
        // SAFETY: the arena mapping lives as long as the poller, which drops
        // its endpoint (and so this region) before the arena.
        let arena_mr =
            unsafe { Mr::register(&pd, io.arena.base(), io.arena.len(), access::LOCAL_WRITE) }?;
        let depth = SRQ_DEPTH
            .min(attrs.max_srq_wr.max(1))
            .min((io.arena.len() / 4 / IN_CAPSULE_DATA) as u32)
            .max(8);
        let mut mem = vec![[0u8; SQE_LEN]; depth as usize];
        // SAFETY: `mem` is never reallocated and outlives its registration
        // (field order of `CapsuleArea`).
        let mr = unsafe {
            Mr::register(
                &pd,
                mem.as_mut_ptr().cast(),
                mem.len() * SQE_LEN,
                access::LOCAL_WRITE,
            )
        }?;
        let channel = CompChannel::new(device)?;
        let cq_size = CQ_ENTRIES.min(attrs.max_cqe);
        let cq = Cq::new(device, cq_size, &channel)?;
        let srq = Arc::new(Srq::new(&pd, depth, 2)?);
        let mut d = DeviceRes {
            device,
            max_rd_atom: attrs.max_qp_init_rd_atom.max(1),
            max_qp_wr: attrs.max_qp_wr,
            pd,
            arena_mr,
            capsules: CapsuleArea { mr, mem },
            cq,
            cq_size,
            cq_committed: depth,
            srq,
            recvs: (0..depth).map(|_| RecvSlot { data: None }).collect(),
            unposted: (0..depth).rev().collect(),
            armed: false,
        };
        d.post_recvs(io)?;
        tracing::info!(device = %device.name(), srq_depth = depth, "RDMA device ready");
        Ok(d)
    }

    /// Posts every receive that has (or can get) its in-capsule buffer.
    pub(super) fn post_recvs(&mut self, io: &mut Io) -> io::Result<()> {
        while let Some(&i) = self.unposted.last() {
            let slot = &mut self.recvs[i as usize];
            if slot.data.is_none() {
                match io.arena.alloc(IN_CAPSULE_DATA) {
                    Some(b) => slot.data = Some(b),
                    None => return Ok(()),
                }
            }
            let buf = slot.data.as_ref().expect("allocated above");
            let sges = [
                Sge {
                    addr: self.capsules.mem[i as usize].as_ptr(),
                    len: SQE_LEN as u32,
                    lkey: self.capsules.mr.lkey(),
                },
                Sge {
                    addr: io.arena.addr(buf, 0),
                    len: IN_CAPSULE_DATA as u32,
                    lkey: self.arena_mr.lkey(),
                },
            ];
            // SAFETY: both buffers are registered and belong to this slot
            // until its receive completes.
            unsafe { self.srq.post_recv(RECV_BIT | i as u64, &sges) }?;
            self.unposted.pop();
        }
        Ok(())
    }

    /// Arena buffers held by posted receives.
    pub(super) fn recv_buffers(&self) -> usize {
        self.recvs.iter().filter(|r| r.data.is_some()).count()
    }
}
