//! NVMe semantics, whatever the transport: what a transport offers the
//! controllers and where it listens (`fabric`, `port`), the ANA states each
//! listener reports (`ana`), namespaces,
//! subsystems and the registry with the discovery log (`subsystem`),
//! controllers (`controller`: Connect, Fabrics and admin commands),
//! DH-HMAC-CHAP (`auth`), I/O command decoding (`io_cmd`), who sees a
//! namespace and its QoS limits (`tenancy`, `qos`), and a command's life
//! from its capsule to its response (`command`).

pub mod ana;
pub mod auth;
pub mod command;
pub mod controller;
pub mod fabric;
pub mod io_cmd;
pub mod port;
pub mod qos;
pub mod reservation;
pub mod subsystem;
pub mod tenancy;
pub mod write_gate;
