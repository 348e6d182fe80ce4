//! The host's side of NVMe/TCP over TLS 1.3 (TP 8011): its configured PSK,
//! the identity it offers each subsystem, and the handshake that opens
//! every queue's connection, with errors that say what to fix.

use super::HostError;
use rdmablk_common::tls::handshake::{self, HandshakeError};
use rdmablk_common::tls::key::{ConfiguredKey, Identity, Labels};
use rdmablk_common::tls::Engine;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The host's TLS settings: its configured PSK and how the identity and
/// the TLS PSK are derived from it.
#[derive(Clone, Debug)]
pub struct TlsParams {
    /// The host's configured PSK (`NVMeTLSkey-1:...`).
    pub key: ConfiguredKey,
    /// The identity's version: 0 (`NVMe0R0x <hostnqn> <subnqn>`, what SPDK
    /// accepts) or 1 (the same with the PSK's digest, as
    /// `nvme gen-tls-key -I 1` makes for the kernel's target).
    pub identity: u8,
    /// The HKDF label layout (libnvme before 1.16 wrote its own).
    pub labels: Labels,
}

impl TlsParams {
    /// The identity `hostnqn` offers to subsystem `subnqn`.
    pub fn identity(&self, hostnqn: &str, subnqn: &str) -> Identity {
        Identity::of(self.identity, &self.key, hostnqn, subnqn, self.labels)
    }

    /// Runs the TLS handshake on `sock`, connected to `addr`, offering the
    /// identity of `hostnqn` for `subnqn`; returns the engine, its
    /// handshake done.
    pub(super) fn handshake(
        &self,
        sock: &TcpStream,
        addr: SocketAddr,
        hostnqn: &str,
        subnqn: &str,
    ) -> Result<Engine, HostError> {
        let identity = self.identity(hostnqn, subnqn);
        let psk = identity
            .tls_psk(&self.key, self.labels)
            .map_err(HostError::Protocol)?;
        let mut engine = Engine::client(&identity.to_string(), psk)
            .map_err(|e| HostError::Protocol(format!("setting up TLS: {e}")))?;
        match handshake::run(sock, &mut engine, Instant::now() + HANDSHAKE_TIMEOUT) {
            Ok(()) => Ok(engine),
            // A TLS listener that finds no key for the identity may close
            // as one without TLS does.
            Err(HandshakeError::Closed | HandshakeError::Abandoned) => Err(HostError::TlsClosed {
                addr,
                identity: identity.to_string(),
            }),
            Err(reason @ (HandshakeError::Plaintext | HandshakeError::NotTls(_))) => {
                Err(HostError::NotTls { addr, reason })
            }
            Err(reason) => Err(HostError::TlsHandshake {
                addr,
                identity: identity.to_string(),
                reason,
            }),
        }
    }
}
