//! The daemon, `rdmablk-target`: NVMe/TCP, the letter of the specifications,
//! ANA, authentication, limits, live reconfiguration, metrics, `--check`, hostile
//! hosts, reservations, Compare and Write, per-host visibility and QoS
//! limits, how pollers and engines wait for work (adaptive polling), and
//! RBD namespaces (against a Ceph cluster, `#[ignore]`d without).

mod ana;
mod auth;
mod caw_race;
mod check;
mod compare_write;
mod fuzz;
mod identifiers;
mod limits;
mod metrics;
mod partitions;
mod polling;
mod rbd;
mod reload;
mod reservations;
mod scale;
mod spec;
mod tcp;
mod tenants;
mod tls;
