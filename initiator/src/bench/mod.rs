//! The built-in load generator: keeps `qd` I/Os in flight per queue for a
//! while, measures IOPS, bandwidth and latency percentiles, and optionally
//! verifies every block it reads back against what it wrote.

mod driver;
mod job;
mod report;
mod stats;

pub use driver::Bench;
pub use job::{Job, Pattern, Progress};
pub use report::{to_json, to_text, us};
pub use stats::{DirStats, Histogram, Stats};
