//! The daemon, `rdmablk-target`: NVMe/TCP, the letter of the specifications,
//! ANA, authentication, limits, live reconfiguration, metrics, `--check`, hostile
//! hosts, and RBD namespaces (against a Ceph cluster, `#[ignore]`d without).

mod ana;
mod auth;
mod check;
mod fuzz;
mod limits;
mod metrics;
mod rbd;
mod reload;
mod spec;
mod tcp;
