//! NBD front-end: serves one namespace as an NBD export. Handshakes run on
//! one thread (`greeter`); the transmission phase runs on the engines.

mod driver;
mod export;
mod greeter;
mod handoff;
pub mod handshake;
pub mod proto;

pub use export::{serve, Listen};
