//! NVMe/RDMA. A listener thread takes RDMA CM connect requests and hands
//! them to pollers; each poller keeps, per device, one protection domain,
//! one CQ on a completion channel that its io_uring polls, and one SRQ
//! whose receives hold a 64-byte command capsule and an arena buffer for
//! in-capsule data. Reads go disk → arena (READ_FIXED) → RDMA WRITE chained
//! to the response SEND; writes go RDMA READ → arena → WRITE_FIXED → SEND.
//! The arena is registered once with io_uring and once per device: no copy
//! between disk and NIC. Commands go through the shared state machine
//! (`engine::queue`), to which `RdmaWire` brings RDMA READs and responses.
//!
//! Here: the listener, a poller's resources per device, its endpoint
//! (completions, CM events, queues adopted and freed), each queue's
//! connection (capsules, completions, deadlines) and wire (its queue pair).

mod connection;
mod device;
mod endpoint;
mod listener;
mod wire;

use crate::base::error::DaemonError;
use crate::config;
use crate::engine::poller::Endpoint;
use crate::transport::{base_caps_with, Listen, ListenerHandle, Profile, Transport};
use endpoint::RdmaEndpoint;
use rdmablk_common::fabrics::discovery::{rdma_tsas, trtype};
use rdmablk_common::nvme::identify::sgls;

/// The NVMe/RDMA transport.
pub struct NvmeRdma;

/// NVMe/RDMA as controllers and discovery see it.
const PROFILE: Profile = Profile {
    kind: config::Transport::Rdma,
    caps: base_caps_with(sgls::KEYED, "rdma"),
    // Completion and CM channels are polled, a common operation.
    ring_ops: &[],
    trtype: trtype::RDMA,
    tsas: rdma_tsas::RDMA_CM,
};

/// In-capsule data the target accepts (beyond the 64-byte command).
const IN_CAPSULE_DATA: usize = PROFILE.caps.in_capsule_data as usize;

impl Transport for NvmeRdma {
    fn profile(&self) -> &'static Profile {
        &PROFILE
    }

    fn listen(&self, l: Listen) -> Result<ListenerHandle, DaemonError> {
        let handle = ListenerHandle::new(l.stop.clone(), None);
        listener::listen(l).map(|()| handle)
    }

    fn endpoint(&self, ep: u8, poller: usize) -> Box<dyn Endpoint> {
        Box::new(RdmaEndpoint::new(ep, poller))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Accepted, waiting for the CM's Established event.
    Accepting,
    Live,
    /// Disconnected; freed once no work request or backend operation is left.
    Closing,
}

/// Marks SRQ receives in the wr_id: a completion's opcode is not valid
/// when its status is an error, its wr_id always is.
const RECV_BIT: u64 = 1 << 63;

/// Send work request kinds, in the wr_id.
const WR_RESPONSE: u64 = 1;
const WR_RESPONSE_NO_SLOT: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;

fn wr_id(conn: u32, kind: u64, slot: u16) -> u64 {
    (conn as u64) << 24 | kind << 16 | slot as u64
}

#[cfg(test)]
mod tests;
