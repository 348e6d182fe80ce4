//! NBD server frontend: protocol encodings and the handshake.

pub mod handshake;
pub mod proto;
