//! NVMe/TCP over TLS 1.3 with pre-shared keys (NVMe/TCP 1.1, 3.6.1; TP
//! 8011): the keys and their derivations ([`key`]), one connection's TLS
//! state ([`Engine`], OpenSSL), the handshake on a blocking socket with a
//! deadline ([`handshake`]), the record layer under the shared NVMe/TCP
//! stream ([`Records`]) and a blocking socket that encrypts ([`TlsSocket`]).

mod blocking;
mod engine;
pub mod handshake;
pub mod key;
pub mod ktls;
mod records;

pub use blocking::TlsSocket;
pub use engine::{Engine, PskLookup, TlsError};
pub use records::{Records, RecvKind};

#[cfg(test)]
mod tests;
