//! NBD front-end: serves one namespace as an NBD export. The handshake runs
//! on short-lived threads; the transmission phase runs on the engines.

mod driver;
mod export;
pub mod handshake;
pub mod proto;

pub use export::{serve, Listen};
