//! What the daemon tells operators: `status` (the control socket), the stats
//! file, and the Prometheus exposition with the HTTP endpoint that serves it.

pub mod http;
pub mod prometheus;
pub mod stats;
pub mod status;
