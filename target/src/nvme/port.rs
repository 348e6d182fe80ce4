//! Ports: where a transport listens, the ANA states it reports, and what
//! the discovery log reports of it. A transport's [`Profile`] says what it
//! is; the registry keeps the ports of the running listeners; a queue knows
//! its [`Arrival`].

use crate::config;
use crate::nvme::fabric::{TransportCaps, ADMIN_QUEUE_SIZE};
use crate::service::ana::AnaStates;
use rdmablk_common::fabrics::discovery::{adrfam, subtype, treq, DiscoveryEntry};
use rdmablk_common::ring::Op;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// What a transport is, as controllers and discovery see it.
pub struct Profile {
    /// The listener scheme it serves.
    pub kind: config::Transport,
    /// What its queues serve (MDTS, queue entries, in-capsule data, SGLs).
    pub caps: TransportCaps,
    /// The io_uring operations its endpoints submit (probed at start).
    pub ring_ops: &'static [Op],
    /// TRTYPE and TSAS of its discovery log entries.
    pub trtype: u8,
    pub tsas: [u8; 32],
}

/// A listening address, the transport serving it and the ANA states it
/// reports (kept by a reload that keeps the listener).
#[derive(Clone)]
pub struct Port {
    pub addr: SocketAddr,
    pub profile: &'static Profile,
    pub ana: Arc<AnaStates>,
    /// Whether its connections speak TLS (a reload may change it).
    pub tls: Arc<PortTls>,
}

/// A listener's `tls` setting, which a reload that keeps the listener may
/// change while it accepts.
#[derive(Debug, Default)]
pub struct PortTls(AtomicU8);

impl PortTls {
    const MODES: [config::ListenerTls; 3] = [
        config::ListenerTls::Off,
        config::ListenerTls::Required,
        config::ListenerTls::Optional,
    ];

    pub fn new(mode: config::ListenerTls) -> PortTls {
        let p = PortTls::default();
        p.set(mode);
        p
    }

    pub fn get(&self) -> config::ListenerTls {
        Self::MODES[self.0.load(Ordering::Acquire) as usize]
    }

    /// Sets the mode; whether it changed.
    pub fn set(&self, mode: config::ListenerTls) -> bool {
        let i = Self::MODES.iter().position(|m| *m == mode).expect("a mode") as u8;
        self.0.swap(i, Ordering::AcqRel) != i
    }
}

impl Port {
    /// Its discovery log entry for a host whose discovery queue reached us
    /// at `local`: with TLS, TSAS says TLS 1.3 and TREQ whether it is
    /// required (NVMe/TCP 1.1, 3.6.1.1 and Figure 13; NVMe over Fabrics
    /// 1.1, Figure 40).
    pub fn discovery_entry(&self, local: Option<IpAddr>) -> DiscoveryEntry {
        let mut e = self.profile.discovery_entry(self.addr, local);
        let channel = match self.tls.get() {
            config::ListenerTls::Off => return e,
            config::ListenerTls::Required => treq::SECURE_CHANNEL_REQUIRED,
            config::ListenerTls::Optional => treq::SECURE_CHANNEL_NOT_REQUIRED,
        };
        e.treq = channel | treq::SQ_FLOW_CONTROL_DISABLE;
        e.tsas[0] = TCP_SECTYPE_TLS13;
        e
    }
}

/// TSAS of NVMe/TCP, byte 0 (SECTYPE): TLS 1.3 (NVMe/TCP 1.1, Figure 13).
const TCP_SECTYPE_TLS13: u8 = 2;

/// Where a queue reached the target: its listener's ANA states, and the
/// local address the host connected to, when the transport knows it.
#[derive(Clone)]
pub struct Arrival {
    pub ana: Arc<AnaStates>,
    pub local: Option<IpAddr>,
    /// The TLS session the connection runs in, if any.
    pub tls: Option<Arc<TlsPeer>>,
}

/// Who a TLS connection's PSK identity names, its cipher suite, and
/// whether the kernel encrypts it.
#[derive(Debug)]
pub struct TlsPeer {
    pub hostnqn: String,
    pub subnqn: String,
    pub cipher: String,
    pub kernel: bool,
}

/// TREQ of every entry, as nvmet: no secure channel requirement stated,
/// and hosts may disable SQ flow control (NVMe over Fabrics 1.1, Figure 40).
const TREQ: u8 = treq::SECURE_CHANNEL_NOT_SPECIFIED | treq::SQ_FLOW_CONTROL_DISABLE;

impl Profile {
    /// The discovery log entry of a listener on `addr` for a host whose
    /// discovery queue reached us at `local` (as nvmet's `disc_traddr`: a
    /// wildcard listener reports the address the host connected to).
    /// Subsystem and port fields are left for the caller.
    pub fn discovery_entry(&self, addr: SocketAddr, local: Option<IpAddr>) -> DiscoveryEntry {
        let ip = match local {
            Some(l) if addr.ip().is_unspecified() => l,
            _ => addr.ip(),
        };
        DiscoveryEntry {
            trtype: self.trtype,
            adrfam: if ip.is_ipv4() {
                adrfam::IPV4
            } else {
                adrfam::IPV6
            },
            subtype: subtype::NVME,
            treq: TREQ,
            portid: 0,
            cntlid: 0xffff,
            asqsz: ADMIN_QUEUE_SIZE,
            eflags: 0,
            trsvcid: addr.port().to_string(),
            subnqn: String::new(),
            traddr: ip.to_string(),
            tsas: self.tsas,
        }
    }
}
