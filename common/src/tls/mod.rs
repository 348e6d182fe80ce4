//! NVMe/TCP over TLS 1.3 with pre-shared keys (NVMe/TCP 1.1, 3.6.1; TP
//! 8011): the keys and their derivations ([`key`]), the handshake
//! ([`Engine`], OpenSSL, driven on a blocking socket with a deadline by
//! [`handshake`]), then the records: sealed and opened in user space
//! (`protect`, AWS-LC's AES-GCM) under the shared NVMe/TCP stream
//! (`tcp::stream::Records`, which takes a [`Session`]) and on blocking
//! sockets ([`TlsSocket`]), or by the kernel ([`ktls`]).

mod blocking;
mod engine;
pub mod handshake;
pub mod key;
pub mod ktls;
pub(crate) mod protect;
mod session;

pub use blocking::TlsSocket;
pub use engine::{Engine, PskLookup, TlsError};
pub use session::Session;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
