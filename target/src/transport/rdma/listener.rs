//! The RDMA CM listener: connect requests checked and handed to the pollers.

use super::PROFILE;
use crate::base::admission::Permit;
use crate::base::error::{starting, DaemonError};
use crate::nvme::fabric::ADMIN_QUEUE_SIZE;
use crate::service::ana::AnaStates;
use crate::transport::Listen;
use rdmablk_common::rdma::private_data::{encode_reject, ConnectRequest, RejectStatus};
use rdmablk_common::rdma::{CmChannel, CmId, NewId};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Pending connect requests the listener queues.
const LISTEN_BACKLOG: i32 = 128;

/// A connect request on its way from the listener to a poller.
pub(super) struct Incoming {
    pub(super) id: NewId,
    pub(super) req: ConnectRequest,
    /// RDMA READs the host lets us have outstanding (its responder resources).
    pub(super) host_responder_resources: u8,
    /// Its place among connections waiting for their Connect.
    pub(super) pending: Permit,
    /// The ANA states of the listener that took it.
    pub(super) ana: Arc<AnaStates>,
}

/// Checks a connect request's queue sizes against what we serve.
fn check_request(private_data: &[u8]) -> Result<ConnectRequest, RejectStatus> {
    let req = ConnectRequest::decode(private_data)?;
    let max = if req.qid == 0 {
        ADMIN_QUEUE_SIZE
    } else {
        PROFILE.caps.max_queue_entries
    };
    // HSQSIZE is 0's based; HRQSIZE is not.
    if req.hsqsize == 0 || req.hsqsize >= max {
        return Err(RejectStatus::InvalidHsqsize);
    }
    if req.hrqsize == 0 || req.hrqsize > max {
        return Err(RejectStatus::InvalidHrqsize);
    }
    Ok(req)
}

/// Binds an RDMA CM listener on `addr` and starts the thread that hands its
/// connect requests to the pollers, round robin.
pub(super) fn listen(l: Listen) -> Result<(), DaemonError> {
    let Listen {
        addr,
        ana,
        ep,
        pollers,
        registry,
        stop,
        tls: _,
    } = l;
    let url = format!("rdma://{addr}");
    let failed = |hint| {
        let url = url.clone();
        move |source| DaemonError::Listen { url, source, hint }
    };
    rdmablk_common::rdma::require_device().map_err(failed(""))?;
    let chan = CmChannel::new().map_err(failed(""))?;
    let mut id = CmId::new(&chan).map_err(failed(""))?;
    id.listen(addr, LISTEN_BACKLOG).map_err(failed(
        " (is an RDMA device bound to that address? `rdma link` shows them)",
    ))?;
    if let Some(d) = id.device() {
        if d.is_iwarp() {
            return Err(DaemonError::Iwarp {
                url,
                device: d.name().to_string(),
            });
        }
    }
    std::thread::Builder::new()
        .name(format!("rdma-cm-{addr}"))
        .spawn(move || {
            let _listener = id;
            let mut next = 0;
            loop {
                if stop.load(Ordering::Acquire) {
                    tracing::info!("stopped listening on rdma://{addr}");
                    return;
                }
                let ev = match chan.wait_event(Duration::from_secs(1)) {
                    Ok(Some(ev)) => ev,
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::error!("RDMA CM listener on {addr} failed: {e}");
                        return;
                    }
                };
                let Some(new_id) = ev.new_id else {
                    tracing::debug!(event = %ev.name, "listener event");
                    continue;
                };
                if new_id.device().is_iwarp() {
                    tracing::warn!(
                        "refusing a connection on iWARP device {}: iWARP is not supported",
                        new_id.device().name()
                    );
                    let _ = new_id.reject(&encode_reject(RejectStatus::NoResources));
                    continue;
                }
                match check_request(&ev.private_data) {
                    Ok(req) => {
                        let peer = new_id.peer();
                        let Some(pending) = registry.admission.pending_connection(&peer) else {
                            let _ = new_id.reject(&encode_reject(RejectStatus::NoResources));
                            continue;
                        };
                        let inc = Incoming {
                            id: new_id,
                            req,
                            host_responder_resources: ev.responder_resources,
                            pending,
                            ana: ana.clone(),
                        };
                        pollers[next % pollers.len()].adopt(ep, Box::new(inc));
                        next += 1;
                    }
                    Err(st) => {
                        tracing::warn!("refusing an NVMe/RDMA connect request: {}", st.describe());
                        let _ = new_id.reject(&encode_reject(st));
                    }
                }
            }
        })
        .map_err(starting("the RDMA CM listener"))?;
    Ok(())
}
