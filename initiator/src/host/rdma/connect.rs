//! Setting a queue up: RDMA CM address and route resolution, the queue
//! pair, its memory, and the NVMe/RDMA connect exchange.

use super::{Area, RdmaQueue, RemoteAccess};
use crate::host::slots::Slots;
use crate::host::{HostError, QueueLimits};
use rdmablk_common::rdma::private_data::{decode_reject, ConnectReply, ConnectRequest};
use rdmablk_common::rdma::{
    CmChannel, CmEventKind, CmId, CompChannel, ConnParam, Cq, Mw, Pd, QpConfig,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long address and route resolution and the connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn rdma_err(addr: SocketAddr, e: impl std::fmt::Display) -> HostError {
    HostError::Protocol(format!("NVMe/RDMA connection to {addr}: {e}"))
}

/// Waits for the event that ends a CM step; any other outcome is an error.
fn wait_cm(
    cm: &CmChannel,
    want: CmEventKind,
    addr: SocketAddr,
    what: &str,
) -> Result<Vec<u8>, HostError> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(rdma_err(
                addr,
                format!("{what} timed out after {CONNECT_TIMEOUT:?}"),
            ));
        }
        let Some(ev) = cm.wait_event(left).map_err(|e| rdma_err(addr, e))? else {
            continue;
        };
        if ev.kind == want {
            return Ok(ev.private_data);
        }
        return Err(match ev.kind {
            CmEventKind::Rejected => match decode_reject(&ev.private_data) {
                Ok(st) => HostError::Protocol(format!(
                    "the target at {addr} refused the queue: {}",
                    st.describe()
                )),
                // A reject without NVMe/RDMA private data: nobody listens.
                Err(None) => HostError::NoListener(addr),
                Err(Some(code)) => HostError::Protocol(format!(
                    "the target at {addr} refused the queue (status {code})"
                )),
            },
            _ => rdma_err(
                addr,
                format!("{what} failed: {} (status {})", ev.name, ev.status),
            ),
        });
    }
}

impl RdmaQueue {
    /// Connects queue `qid` with `depth` entries to the target at `addr`,
    /// giving the target access to command data as `remote` says (`None`:
    /// windows where the device has them).
    pub fn connect(
        addr: SocketAddr,
        qid: u16,
        depth: u16,
        remote: Option<RemoteAccess>,
    ) -> Result<RdmaQueue, HostError> {
        rdmablk_common::rdma::require_device()
            .map_err(|e| HostError::Unsupported(e.to_string()))?;
        let cm = CmChannel::new().map_err(|e| rdma_err(addr, e))?;
        let mut id = CmId::new(&cm).map_err(|e| rdma_err(addr, e))?;
        id.resolve_addr(addr, CONNECT_TIMEOUT)
            .map_err(|e| rdma_err(addr, e))?;
        wait_cm(
            &cm,
            CmEventKind::AddrResolved,
            addr,
            "address resolution (is the address on an RDMA device's network?)",
        )?;
        id.resolve_route(CONNECT_TIMEOUT)
            .map_err(|e| rdma_err(addr, e))?;
        wait_cm(&cm, CmEventKind::RouteResolved, addr, "route resolution")?;
        let device = id
            .device()
            .ok_or_else(|| rdma_err(addr, "no RDMA device for this address"))?;
        if device.is_iwarp() {
            return Err(HostError::Unsupported(format!(
                "NVMe/RDMA connection to {addr}: {} is an iWARP device; iWARP is not supported (use RoCE or InfiniBand)",
                device.name()
            )));
        }
        let attrs = device.attrs().map_err(|e| rdma_err(addr, e))?;
        let pd = Pd::new(device).map_err(|e| rdma_err(addr, e))?;
        let remote = match remote {
            Some(RemoteAccess::Windows) if !attrs.memory_windows => {
                return Err(HostError::Unsupported(format!(
                    "NVMe/RDMA connection to {addr}: {} has no type 2 memory windows",
                    device.name()
                )))
            }
            Some(r) => r,
            // rxe re-executes the binds behind a request it retransmits
            // after an RNR NAK, and a second bind of a bound window fails
            // the queue pair.
            None if attrs.memory_windows && !attrs.is_soft_roce() => RemoteAccess::Windows,
            None => {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    let why = if attrs.memory_windows {
                        "soft-RoCE re-executes memory window binds when it retransmits"
                    } else {
                        "the RDMA device has no type 2 memory windows"
                    };
                    tracing::warn!(
                        device = %device.name(),
                        "{why}: each command's buffer is registered and deregistered on its own (slower)"
                    )
                });
                RemoteAccess::Registrations
            }
        };
        // Per command: a bind, the capsule's SEND and a local invalidate
        // on the send queue, the two signaled ones and the response in the CQ.
        let (send_wrs_per_command, cqes_per_command) = match remote {
            RemoteAccess::Windows => (3, 3),
            RemoteAccess::Registrations => (1, 2),
        };
        let channel = CompChannel::new(device).map_err(|e| rdma_err(addr, e))?;
        let depth_n = depth as u32;
        let cq = Cq::new(device, cqes_per_command * depth_n + 8, &channel)
            .map_err(|e| rdma_err(addr, e))?;
        id.create_qp(&QpConfig {
            pd: &pd,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            max_send_wr: send_wrs_per_command * depth_n + 1,
            max_recv_wr: depth_n + 1,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .map_err(|e| rdma_err(addr, e))?;
        // Allocated after the queue pair: when the process dies, the kernel
        // releases its objects newest first, and rxe can release a queue
        // pair only once the windows bound on it are gone.
        let windows = match remote {
            RemoteAccess::Windows => (0..depth)
                .map(|_| Mw::new(&pd))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| rdma_err(addr, e))?,
            RemoteAccess::Registrations => Vec::new(),
        };
        let capsules = Area::new(&pd, depth as usize)?;
        let responses = Area::new(&pd, depth as usize + 1)?;
        let mut q = RdmaQueue {
            id,
            cm: cm.clone(),
            cq,
            pd,
            addr,
            capsules,
            responses,
            remote,
            windows,
            regions: Vec::new(),
            limits: QueueLimits {
                digests: Default::default(),
                max_h2c: 0,
                in_capsule: 0,
                depth,
                crdt: [0; 3],
            },
            slots: Slots::new(depth),
            cq_armed: false,
            cm_armed: false,
            wcs: Vec::new(),
            busy_poll: false,
        };
        for i in 0..=depth as usize {
            q.post_recv(i).map_err(|e| rdma_err(addr, e))?;
        }
        let req = ConnectRequest {
            recfmt: 0,
            qid,
            hrqsize: depth,
            hsqsize: depth - 1,
            cntlid: 0,
        }
        .encode();
        q.id.connect(&ConnParam {
            private_data: &req,
            responder_resources: attrs.max_qp_rd_atom,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .map_err(|e| rdma_err(addr, e))?;
        let reply = wait_cm(&cm, CmEventKind::Established, addr, "connect")?;
        if let Some(r) = ConnectReply::decode(&reply) {
            if r.crqsize < depth {
                // Never more commands in flight than the target can receive.
                let n = r.crqsize.max(1);
                q.slots.shrink(n);
                q.limits.depth = n;
            }
        }
        tracing::debug!(%addr, qid, depth = q.limits.depth, device = %device.name(), remote_access = ?q.remote, qp = q.id.qp_num(), "NVMe/RDMA queue connected");
        Ok(q)
    }
}
