//! NVMe/TCP: the ICReq/ICResp handshake, capsule PDUs, R2T and H2CData for
//! host data, C2HData for controller data, CapsuleResp, and C2HTermReq on
//! protocol errors. Socket I/O goes through the poller's ring; commands go
//! through the shared state machine (`engine::queue`), to which `TcpWire`
//! brings R2Ts and responses.
//!
//! A listener thread accepts connections and hands them to the pollers'
//! endpoints; each connection is a `TcpQueue`: its queue, its wire (the
//! socket, R2Ts and responses) and the PDUs it receives.

mod connection;
mod endpoint;
mod listener;
mod pdu;
mod wire;

use crate::base::error::{starting, DaemonError};
use crate::config;
use crate::engine::poller::Endpoint;
use crate::transport::{base_caps_with, Listen, ListenerHandle, Profile, Transport};
use endpoint::TcpEndpoint;
use io_uring::opcode;
use rdmablk_common::fabrics::discovery::trtype;
use rdmablk_common::nvme::identify::sgls;
use rdmablk_common::ring::Op;
use std::net::TcpListener;

/// Largest H2CData payload the target accepts (MAXH2CDATA).
const MAX_H2C_DATA: usize = 128 << 10;
/// The send token of a response to a command that never had a slot.
const NO_SLOT: u64 = u64::MAX;

/// The NVMe/TCP transport.
pub struct NvmeTcp;

/// NVMe/TCP as controllers and discovery see it.
const PROFILE: Profile = Profile {
    kind: config::Transport::Tcp,
    caps: base_caps_with(sgls::TRANSPORT, "tcp"),
    ring_ops: &[
        Op(opcode::Recv::CODE, "RECV"),
        Op(opcode::SendMsg::CODE, "SENDMSG"),
    ],
    trtype: trtype::TCP,
    // NVMe/TCP 1.0 defines no TSAS without TLS.
    tsas: [0; 32],
};

/// In-capsule data the target accepts (beyond the 64-byte command).
const IN_CAPSULE_DATA: usize = PROFILE.caps.in_capsule_data as usize;

impl Transport for NvmeTcp {
    fn profile(&self) -> &'static Profile {
        &PROFILE
    }

    fn listen(&self, l: Listen) -> Result<ListenerHandle, DaemonError> {
        let addr = l.addr;
        let failed = |source| DaemonError::Listen {
            url: format!("tcp://{addr}"),
            source,
            hint: "",
        };
        let listener = TcpListener::bind(addr).map_err(failed)?;
        let wake = listener.try_clone().map_err(failed)?;
        let handle = ListenerHandle::new(l.stop.clone(), Some(wake));
        std::thread::Builder::new()
            .name(format!("accept-{addr}"))
            .spawn(move || listener::accept_loop(listener, l))
            .map_err(starting("the acceptor"))?;
        Ok(handle)
    }

    fn endpoint(&self, ep: u8, _poller: usize) -> Box<dyn Endpoint> {
        Box::new(TcpEndpoint::new(ep))
    }
}

/// What the endpoint's own tokens stand for: a connection's receive, its send.
const RECV: u16 = 0;
const SEND: u16 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for ICReq.
    Handshake,
    Live,
    /// A TermReq is queued; close once it is sent.
    Terminating,
    /// Shut down; freed once no operation is in flight.
    Closing,
}
