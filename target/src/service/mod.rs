//! What the NVMe controllers rely on that needs only the configuration, the
//! base services and the backends: a namespace's reservations with their
//! persistence and the gateway group's shared record (`reservation`), the
//! write gate that orders writes against a Preempt and Abort and a fused
//! Compare and Write (`write_gate`), QoS limits (`qos`), who sees a
//! namespace and its limits (`tenancy`), the ANA states a listener reports
//! (`ana`) and DH-HMAC-CHAP authentication (`auth`). Nothing here uses a
//! controller or a command: `nvme` uses these, never the reverse.

pub mod ana;
pub mod auth;
pub mod qos;
pub mod reservation;
pub mod tenancy;
pub mod write_gate;
