//! A monotonic clock as plain nanoseconds, for deadlines and rates kept in
//! atomics (QoS clocks, ANA lease deadlines).

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The origin: the first use in the process.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds from the origin to `t` (0 for an instant before it).
pub fn nanos(t: Instant) -> u64 {
    t.saturating_duration_since(epoch()).as_nanos() as u64
}

/// Nanoseconds from the origin to now.
pub fn now() -> u64 {
    nanos(Instant::now())
}

/// The instant `ns` nanoseconds after the origin.
pub fn instant(ns: u64) -> Instant {
    epoch() + Duration::from_nanos(ns)
}

/// Starts the clock (before instants that must not precede it are taken).
pub fn start() {
    epoch();
}
