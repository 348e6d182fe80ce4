//! The NVMe controller's protocol, whatever the transport: what a transport
//! offers the controllers and where it listens (`fabric`, `port`),
//! namespaces and their opening (`namespace`), subsystems and the registry
//! with the discovery log (`subsystem`), controllers (`controller`:
//! Connect, Fabrics and admin commands), and a command's life from its
//! capsule to its response, I/O commands decoded and executed
//! (`command`). The services it relies on
//! (reservations, the write gate, QoS, tenancy, ANA states,
//! authentication) are the layer below, `service`.

pub mod command;
pub mod controller;
pub mod fabric;
pub mod namespace;
pub mod port;
pub mod subsystem;
