//! rdmablk-target: an NVMe over Fabrics target that exports files, block
//! devices, memory and Ceph RBD images as NVMe namespaces over NVMe/TCP and
//! NVMe/RDMA.
//!
//! Layers, lowest first; a module uses its own layer and those below it,
//! never one above (`tests/layers.rs` checks it; docs/architecture.md draws
//! the picture):
//!
//! 1. [`config`]: the configuration file, the quick form and their rules.
//! 2. [`base`]: errors, admission, arena budgets, the offload thread,
//!    off-ring completions, counters, identifiers.
//! 3. [`backend`]: where namespaces' blocks live (files and block devices,
//!    memory, null, RBD images).
//! 4. [`service`]: what the controllers rely on that needs no controller:
//!    reservations (with PTPL and the shared record), the write gate, QoS
//!    limits, tenancy, ANA states, authentication.
//! 5. [`nvme`]: the NVMe controller's protocol: what a transport offers and
//!    its ports, namespaces and subsystems with the registry and discovery
//!    log, controllers (Connect, Fabrics, admin commands), I/O command
//!    decoding, a command's life.
//! 6. [`engine`]: the per-poller engine: the poller thread and its ring, the
//!    queue state machine every transport drives, a queue's binding to its
//!    controller and budgets.
//! 7. [`transport`]: NVMe/TCP and NVMe/RDMA: listeners, endpoints,
//!    connections, wires.
//! 8. [`app`]: the daemon: serving, reload, the control socket, systemd
//!    notification, reports (status, stats file, Prometheus).

pub mod app;
pub mod backend;
pub mod base;
pub mod config;
pub mod engine;
pub mod nvme;
pub mod service;
pub mod transport;

#[cfg(test)]
mod testing;
