//! What a benchmark thread is asked to do, and the counters it reports
//! progress to.

use crate::host::NamespaceInfo;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

/// The access pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    RandRead,
    RandWrite,
    Read,
    Write,
    RandRw,
}

impl std::str::FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "randread" => Pattern::RandRead,
            "randwrite" => Pattern::RandWrite,
            "read" => Pattern::Read,
            "write" => Pattern::Write,
            "randrw" => Pattern::RandRw,
            _ => {
                return Err(format!(
                    "{s:?}: use randread, randwrite, read, write or randrw"
                ))
            }
        })
    }
}

/// What one benchmark thread does.
#[derive(Clone, Debug)]
pub struct Job {
    pub pattern: Pattern,
    /// Bytes per I/O (a multiple of the block size).
    pub bs: usize,
    pub qd: usize,
    pub runtime: Duration,
    pub verify: bool,
    pub ns: NamespaceInfo,
    /// This thread's region, in I/O units of `bs` bytes: [first, first + units).
    pub first_unit: u64,
    pub units: u64,
    /// Largest transfer per NVMe command; larger I/Os are split.
    pub max_transfer: usize,
    /// Identifies this run in verify headers.
    pub run_id: u64,
}

/// Progress counters shared with the reporting thread.
#[derive(Default)]
pub struct Progress {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    /// Set to end every thread early (e.g. on SIGINT).
    pub stop: AtomicBool,
}
