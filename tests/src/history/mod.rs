//! A history of block operations as clients saw them, and the checker
//! that decides whether it is legal: each block (a [`Register`]) must
//! behave as a linearizable register whose writes carry unique values.
//! A read returns the value of the last write acknowledged before it
//! started, or of a write concurrent with it or whose outcome is unknown;
//! an acknowledged write is never lost; a value never written, or written
//! by a write the host saw fail, never appears; no operation outlives its
//! deadline. [`check`] names each anomaly with the operations that show it.

mod checker;
#[cfg(test)]
mod tests;

pub use checker::{check, Anomaly, Report};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// One block of one namespace: what the checker treats as a register.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Register {
    pub namespace: u32,
    pub block: u64,
}

/// What an operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write,
}

/// What the client learned of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Completed: a write acknowledged, a read returned its value.
    Ok,
    /// The host said it was not done: it must never take effect.
    Failed,
    /// An error or a timeout after which it may or may not have taken
    /// effect: a write may land at any time after its start.
    Unknown,
}

/// The value every block holds before any write (all zeros on disk).
pub const INITIAL: u64 = 0;
/// What a read returns when the block held bytes that are no write's
/// encoding.
pub const GARBAGE: u64 = u64::MAX;

/// One operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// The client that ran it.
    pub process: u32,
    pub kind: Kind,
    pub register: Register,
    /// The value written, or the value read ([`INITIAL`], [`GARBAGE`] or a
    /// write's value); meaningless for a read whose outcome is not Ok.
    pub value: u64,
    /// When it started, since the history began.
    pub start: Duration,
    /// When it completed; None if it never did.
    pub end: Option<Duration>,
    pub outcome: Outcome,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match self.kind {
            Kind::Read => "read",
            Kind::Write => "write",
        };
        let value = match self.value {
            INITIAL => "initial".to_string(),
            GARBAGE => "garbage".to_string(),
            v => format!("{}.{}", v >> 32, v & 0xffff_ffff),
        };
        let end = self
            .end
            .map_or("never".to_string(), |e| format!("{:.3}s", e.as_secs_f64()));
        write!(
            f,
            "client {} {what} {value} on ns {} block {}, {:.3}s to {end}, {:?}",
            self.process,
            self.register.namespace,
            self.register.block,
            self.start.as_secs_f64(),
            self.outcome
        )
    }
}

/// A history as recorded.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub ops: Vec<Op>,
}

/// Records a history from several threads (clones share it), on a clock
/// that starts with it.
#[derive(Clone)]
pub struct Recorder {
    start: Instant,
    ops: Arc<Mutex<Vec<Op>>>,
}

impl Default for Recorder {
    fn default() -> Recorder {
        Recorder::new()
    }
}

impl Recorder {
    /// An empty history whose clock starts now.
    pub fn new() -> Recorder {
        Recorder {
            start: Instant::now(),
            ops: Arc::default(),
        }
    }

    /// The time since the history began.
    pub fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// Adds an operation.
    pub fn push(&self, op: Op) {
        self.ops
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(op);
    }

    /// The history so far.
    pub fn history(&self) -> History {
        History {
            ops: self
                .ops
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }
}
