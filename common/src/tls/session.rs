//! A connection's TLS once its handshake is done, as the NVMe/TCP stream
//! takes it over: the record keys, the cipher suite, and what was received
//! and not yet read.

use super::engine::{Engine, TlsError};
use super::protect::Protection;

/// The TLS of a connection past its handshake.
pub struct Session {
    pub(crate) prot: Protection,
    pub(crate) cipher: String,
    /// Data already opened and not yet read.
    pub(crate) plain: Vec<u8>,
    /// Bytes received and not yet opened.
    pub(crate) unopened: Vec<u8>,
}

impl Session {
    /// The session of a connection whose handshake `engine` did and which
    /// has carried no record since.
    pub fn after_handshake(engine: &Engine) -> Result<Session, TlsError> {
        Ok(Session {
            prot: Protection::new(engine.traffic_after_handshake()?),
            cipher: engine.cipher(),
            plain: Vec::new(),
            unopened: Vec::new(),
        })
    }

    /// The negotiated cipher suite.
    pub fn cipher(&self) -> &str {
        &self.cipher
    }
}
