//! Base services the layers above share: errors, what hosts may hold
//! (admission, arena budgets), work off the pollers (offload) and the
//! completions it hands back, counters, identifiers.

pub mod admission;
pub mod budget;
pub mod completions;
pub mod error;
pub mod ids;
pub mod metrics;
pub mod offload;
