//! The NVMe over Fabrics host: a controller association (admin queue,
//! keep-alive, shutdown) and I/O queues. Transport independent above the
//! queue level; NVMe/TCP and NVMe/RDMA below it.

pub mod attach;
mod auth;
pub mod block;
mod driver_io;
pub mod engine;
mod io_queue;
pub mod paths;
pub mod rdma;
mod session;
mod slots;
mod sync_queue;
pub mod tcp;
pub mod tls;

pub use attach::Attachment;
pub use io_queue::{Data, Done, IoQueue, Link};
pub use paths::{PathState, Paths};
/// The fabric under NVMe (the CLI's `-t tcp|rdma`).
pub use rdmablk_common::fabrics::Transport;
pub use session::{NamespaceInfo, QueueLimits, Session};
pub use sync_queue::SyncQueue;
pub use tls::TlsParams;

use rdmablk_common::nvme::Status;
use rdmablk_common::tcp::Digests;
use std::net::SocketAddr;
use std::time::Duration;

/// How long a blocking command (admin queue, discovery, I/O queue Connect)
/// may take before the target is declared dead: host policy, shared by the
/// blocking queues of both transports.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(15);

/// Everything needed to reach a subsystem.
#[derive(Clone, Debug)]
pub struct Params {
    pub transport: Transport,
    pub addr: SocketAddr,
    pub subnqn: String,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    pub digests: Digests,
    /// Keep-alive timeout; zero disables keep-alive.
    pub kato: Duration,
    /// I/O queue entries wanted (clamped to what the controller allows).
    pub queue_size: u16,
    /// I/O queues wanted.
    pub io_queues: u16,
    /// Ask the target to disable SQ flow control (Connect CATTR bit 2).
    pub disable_sqflow: bool,
    /// DH-HMAC-CHAP secrets, for targets whose Connect asks (ATR).
    pub dhchap: Option<rdmablk_common::auth::host::HostSecrets>,
    /// NVMe/TCP over TLS: every queue's connection starts with a TLS 1.3
    /// handshake with this PSK.
    pub tls: Option<TlsParams>,
}

/// Why talking to a target failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// Nothing listens at the address.
    #[error("no NVMe-oF target listens on {0} (connection refused)")]
    NoListener(SocketAddr),
    /// The address did not answer.
    #[error("cannot reach {addr}: {source}")]
    Unreachable {
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The target has no subsystem of that NQN.
    #[error("the target at {addr} has no subsystem {nqn:?} (Connect Invalid Parameters)")]
    UnknownNqn { addr: SocketAddr, nqn: String },
    /// The subsystem does not admit this host.
    #[error("host {hostnqn:?} is not allowed on subsystem {nqn:?} (Connect Invalid Host)")]
    HostNotAllowed { nqn: String, hostnqn: String },
    /// A command failed with an NVMe status.
    #[error("{what} failed: {status}")]
    Status { what: String, status: Status },
    /// This machine cannot use the transport (no RDMA device, iWARP).
    #[error("{0}")]
    Unsupported(String),
    /// The peer broke the protocol (or sent a TermReq).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The target requires DH-HMAC-CHAP and no secret was given.
    #[error("{nqn} requires DH-HMAC-CHAP authentication: give --dhchap-secret (and --dhchap-ctrl-secret to authenticate the target too)")]
    AuthRequired { nqn: String },
    /// Authentication of a queue failed.
    #[error("authentication of queue {qid} with {nqn} failed: {source}")]
    Auth {
        qid: u16,
        nqn: String,
        source: rdmablk_common::auth::host::AuthError,
    },
    /// The TLS handshake failed: the keys differ, or the target refused.
    #[error("TLS handshake with {addr} failed: {reason}; the target must hold this host's key for identity `{identity}`")]
    TlsHandshake {
        addr: SocketAddr,
        identity: String,
        reason: rdmablk_common::tls::handshake::HandshakeError,
    },
    /// TLS was asked for and the peer answered without it.
    #[error(
        "the target at {addr} did not answer TLS ({reason}): is its listener configured with tls?"
    )]
    NotTls {
        addr: SocketAddr,
        reason: rdmablk_common::tls::handshake::HandshakeError,
    },
    /// TLS was asked for and the peer closed the connection without a
    /// word: a listener without TLS, or one that has no key for us.
    #[error("the target at {addr} closed the connection during the TLS handshake: is its listener configured with tls, and does it hold this host's key for identity `{identity}`?")]
    TlsClosed { addr: SocketAddr, identity: String },
    /// No TLS was asked for and the target ended the connection (or sent a
    /// TLS record) instead of answering ICReq.
    #[error("the target at {0} closed the connection before ICResp; if its listener requires TLS, add --tls and a key (--tls-key-file)")]
    TlsRequired(SocketAddr),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}
