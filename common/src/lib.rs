//! Wire formats and shared building blocks of rdmablk: NVMe commands and
//! completions, NVMe over Fabrics, NVMe/TCP PDUs and the registered buffer arena.
//!
//! Everything here is pure data handling: no threads, no policy.

pub mod abort;
pub mod auth;
pub mod bytes;
pub mod cli_docs;
pub mod fabrics;
pub mod fuzzing;
pub mod interchange;
pub mod mem;
pub mod nvme;
pub mod rdma;
pub mod ring;
pub mod spin;
pub mod tcp;
pub mod tls;
pub mod units;
pub mod usage;
