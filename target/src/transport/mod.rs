//! Transports: how capsules, data and responses travel. A transport tells
//! controllers what it serves and discovery how to reach it, listens, and
//! keeps an endpoint on every poller; its queues run the command state
//! machine of `engine::queue` through a `queue::Wire`. Each queue lives on
//! one poller for its whole life. Only the application names this module:
//! it starts listeners and gives each poller the transports' endpoints.
//!
//! Adding a transport: a module here implementing [`Transport`] (with its
//! endpoint and wire), an entry in [`ALL`], and its variant (name and
//! TRTYPE) in `rdmablk_common::fabrics::Transport`.

pub mod rdma;
pub mod tcp;

use crate::base::error::DaemonError;
use crate::config;
use crate::engine::poller::{Endpoint, PollerLink};
use crate::nvme::fabric::TransportCaps;
use crate::nvme::port::{Port, PortTls, Profile};
use crate::nvme::subsystem::Registry;
use crate::service::ana::AnaStates;
use rdmablk_common::nvme::identify::sgls;
use rdmablk_common::ring::Op;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What transports serve unless they say otherwise: 1 MiB transfers (MDTS
/// 8), 128-entry I/O queues, 8 KiB of in-capsule data, SGLs with offsets
/// and the descriptor type `sgl` of the transport named `transport`.
pub const fn base_caps_with(sgl: u32, transport: &'static str) -> TransportCaps {
    TransportCaps {
        mdts: 8,
        max_queue_entries: 128,
        in_capsule_data: 8192,
        sgls: sgls::SUPPORTED | sgls::OFFSET | sgl,
        transport,
    }
}

/// Where a listener hands what it accepts: endpoint `ep` of the pollers.
pub struct Listen {
    pub addr: SocketAddr,
    /// The ANA states its connections' controllers report.
    pub ana: Arc<AnaStates>,
    /// Whether its connections speak TLS.
    pub tls: Arc<PortTls>,
    pub ep: u8,
    pub pollers: Arc<Vec<PollerLink>>,
    pub registry: Arc<Registry>,
    /// Set to stop the listener (a reload removed it).
    pub stop: Arc<AtomicBool>,
}

/// A running listener. Stopping it ends its thread, which closes it;
/// connections it accepted stay.
pub struct ListenerHandle {
    stop: Arc<AtomicBool>,
    /// A second descriptor of a listening socket whose thread blocks in
    /// accept: shutting it down wakes that thread.
    wake: Option<std::net::TcpListener>,
}

impl ListenerHandle {
    pub fn new(stop: Arc<AtomicBool>, wake: Option<std::net::TcpListener>) -> Self {
        ListenerHandle { stop, wake }
    }

    /// Stops taking connections.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        if let Some(l) = &self.wake {
            // SAFETY: shutdown on a descriptor this handle owns; the accept
            // in the listener's thread then fails and sees `stop`.
            unsafe { libc::shutdown(std::os::fd::AsRawFd::as_raw_fd(l), libc::SHUT_RDWR) };
        }
    }
}

/// Starts listening on `port`, handing its connections to `pollers`.
pub fn start(
    port: &Port,
    pollers: &Arc<Vec<PollerLink>>,
    registry: &Arc<Registry>,
) -> Result<ListenerHandle, DaemonError> {
    let (ep, transport) = of(port.profile.kind);
    let handle = transport.listen(Listen {
        addr: port.addr,
        ana: port.ana.clone(),
        tls: port.tls.clone(),
        ep,
        pollers: pollers.clone(),
        registry: registry.clone(),
        stop: Arc::new(AtomicBool::new(false)),
    })?;
    tracing::info!("listening on {}://{}", port.profile.kind, port.addr);
    Ok(handle)
}

/// A fabric transport: what it is, how it listens, its side of a poller.
pub trait Transport: Sync {
    fn profile(&self) -> &'static Profile;

    /// Starts taking connections on `l.addr` and handing them to the
    /// pollers, round robin, until `l.stop` is set.
    fn listen(&self, l: Listen) -> Result<ListenerHandle, DaemonError>;

    /// Its endpoint on poller `poller`, at endpoint index `ep`.
    fn endpoint(&self, ep: u8, poller: usize) -> Box<dyn Endpoint>;
}

/// Every transport; a transport's index here is its endpoint index.
pub const ALL: [&dyn Transport; 2] = [&tcp::NvmeTcp, &rdma::NvmeRdma];

/// The transport of a listener scheme, and its endpoint index.
pub fn of(kind: config::Transport) -> (u8, &'static dyn Transport) {
    let i = ALL
        .iter()
        .position(|t| t.profile().kind == kind)
        .expect("every listener scheme has a transport");
    (i as u8, ALL[i])
}

/// The endpoints of poller `poller`, one per transport, in [`ALL`]'s order.
pub fn endpoints(poller: usize) -> Vec<Box<dyn Endpoint>> {
    ALL.iter()
        .enumerate()
        .map(|(i, t)| t.endpoint(i as u8, poller))
        .collect()
}

/// The port of listener `l`: its address, its transport's profile and
/// the ANA states it is configured with.
pub fn port(l: &config::ListenerConfig) -> Port {
    Port {
        addr: l.address,
        profile: of(l.transport).1.profile(),
        ana: Arc::new(AnaStates::new(l)),
        tls: Arc::new(PortTls::new(l.tls)),
    }
}

/// The io_uring operations of every transport.
pub fn ring_ops() -> impl Iterator<Item = Op> {
    ALL.into_iter()
        .flat_map(|t| t.profile().ring_ops.iter().copied())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmablk_common::fabrics::discovery::adrfam;
    use std::net::IpAddr;

    /// A wildcard listener is reported at the address the host reached; a
    /// listener on one address at that address (NVMe over Fabrics 1.1,
    /// 5.3: TRADDR is where the host connects).
    #[test]
    fn discovery_reports_the_address_the_host_reached() {
        let local: IpAddr = "192.0.2.7".parse().unwrap();
        for t in ALL.map(|t| t.profile()) {
            let wild = t.discovery_entry("0.0.0.0:4420".parse().unwrap(), Some(local));
            assert_eq!(
                (wild.traddr.as_str(), wild.adrfam),
                ("192.0.2.7", adrfam::IPV4)
            );
            let fixed = t.discovery_entry("[::1]:4421".parse().unwrap(), Some(local));
            assert_eq!((fixed.traddr.as_str(), fixed.adrfam), ("::1", adrfam::IPV6));
            assert_eq!(fixed.trsvcid, "4421");
            let unknown = t.discovery_entry("0.0.0.0:4420".parse().unwrap(), None);
            assert_eq!(unknown.traddr, "0.0.0.0");
        }
    }
}
