//! Transports: how capsules, data and responses travel. Each connection
//! lives on one poller for its whole life.

pub mod rdma;
pub mod tcp;
