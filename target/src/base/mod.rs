//! Base services the layers above share: errors, what hosts may hold
//! (admission, arena budgets), work off the pollers (offload) and the
//! completions it hands back, the few threads that serve many owners'
//! slow work (lanes), library threads that yield to pollers (sched),
//! counters, identifiers, a monotonic clock in nanoseconds.

pub mod admission;
pub mod budget;
pub mod clock;
pub mod completions;
pub mod error;
pub mod ids;
pub mod lanes;
pub mod metrics;
pub mod offload;
pub mod sched;
