//! What a fabric transport offers the NVMe layer: the limits it serves and
//! the SGL descriptors it takes, which the controller reports (Identify
//! Controller, CAP) and holds Connect to, and the admin queue size every
//! transport sizes its admin queues for.

use rdmablk_common::nvme::SQE_LEN;

/// Admin queue entries (ASQSZ): the most an admin queue may have.
pub const ADMIN_QUEUE_SIZE: u16 = 32;

/// What a queue's transport tells its controller: the limits it serves
/// and the SGL descriptors it takes (Identify Controller, CAP, Connect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransportCaps {
    /// Maximum data transfer size, a power of two of 4 KiB (MDTS).
    pub mdts: u8,
    /// I/O queue entries at most (CAP.MQES + 1, MAXCMD).
    pub max_queue_entries: u16,
    /// In-capsule data accepted beyond the 64-byte command (IOCCSZ).
    pub in_capsule_data: u32,
    /// SGL support bits (Identify Controller SGLS).
    pub sgls: u32,
    /// The transport's name, as metrics label it ("tcp", "rdma").
    pub transport: &'static str,
}

impl TransportCaps {
    /// Maximum data transfer size in bytes.
    pub fn max_transfer(&self) -> usize {
        4096 << self.mdts
    }

    /// I/O command capsule size in 16-byte units (IOCCSZ).
    pub fn ioccsz(&self) -> u32 {
        (SQE_LEN as u32 + self.in_capsule_data) / 16
    }

    /// Whether SGL descriptors of support bit `bit` are taken.
    pub fn takes(&self, bit: u32) -> bool {
        self.sgls & bit != 0
    }
}
