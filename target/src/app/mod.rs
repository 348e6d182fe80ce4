//! The daemon: serving a configuration (`serve`), applying a new one
//! (`reload`), setting ANA states and QoS limits by command (`ana`,
//! `qos`), the control socket
//! (`control`), systemd's readiness protocol (`notify`), the reports
//! (`report`), and the gateway group (`gateway`: leases, heartbeats, the
//! shared reservation records, its status).

pub mod ana;
pub mod control;
pub mod gateway;
pub mod notify;
pub mod qos;
pub mod reload;
pub mod report;
pub mod serve;
