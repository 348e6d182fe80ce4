//! What the target counts for operators: per namespace and per poller.
//! The reports (status, Prometheus) read them.
//!
//! Counters live per poller: each has one writer, its poller, which adds
//! with a plain load and store (no atomic read-modify-write and no cache
//! line shared with another poller on the I/O path); a scrape sums them.

use rdmablk_common::nvme::Status;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency histogram's buckets, in microseconds.
pub const LATENCY_BOUNDS_US: [u64; 14] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000, 10_000_000,
];
/// Buckets of the latency histogram: one per bound and one above them.
pub const BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

/// Distinct failure statuses one poller counts per namespace; statuses
/// beyond them count as "other".
const ERROR_SLOTS: usize = 8;

/// A counter with one writer (or a gauge the writer sets).
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`: only the counter's one writer calls this.
    pub fn add(&self, n: u64) {
        let v = self.0.load(Ordering::Relaxed);
        self.0.store(v.wrapping_add(n), Ordering::Relaxed);
    }

    /// Sets a gauge: only its one writer calls this.
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The operation classes metrics tell apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    /// Flush, Write Zeroes, Dataset Management.
    Other,
}

/// Each operation class with its name in reports.
pub const OPS: [(Op, &str); 3] = [
    (Op::Read, "read"),
    (Op::Write, "write"),
    (Op::Other, "other"),
];

/// One poller's counters of one namespace (a cache line pair of its own).
#[repr(align(128))]
#[derive(Default)]
pub struct NsCounters {
    /// Commands answered, by [`Op`].
    commands: [Counter; 3],
    /// Bytes read and written by successful commands.
    bytes: [Counter; 2],
    /// Latency from arrival to response, by [`Op`]: bucket counts (not
    /// cumulative; the last is above every bound) and the sum.
    buckets: [[Counter; BUCKETS]; 3],
    latency_ns: [Counter; 3],
    /// Commands decoded, and those dropped since (answered or not).
    started: Counter,
    ended: Counter,
    /// Failed commands by status: slot `i` counts `errors[i]` failures of
    /// status `error_status[i] - 1` (SCT << 8 | SC); 0 marks a free slot.
    error_status: [AtomicU32; ERROR_SLOTS],
    errors: [Counter; ERROR_SLOTS],
    /// Failures of statuses that found no slot.
    errors_other: Counter,
    /// Commands held back by QoS limits, those let go since (or dropped),
    /// and the time they were held.
    held: Counter,
    released: Counter,
    held_ns: Counter,
}

impl NsCounters {
    /// A command was decoded against the namespace.
    pub fn start(&self) {
        self.started.add(1);
    }

    /// A decoded command is gone (answered, or dropped with its queue).
    pub fn end(&self) {
        self.ended.add(1);
    }

    /// A command waits for its QoS limits.
    pub fn held(&self) {
        self.held.add(1);
    }

    /// A held command goes (or is dropped) after `waited`.
    pub fn released(&self, waited: Duration) {
        self.released.add(1);
        self.held_ns
            .add(waited.as_nanos().min(u64::MAX as u128) as u64);
    }

    /// A command was answered `status` after `latency`; `bytes` is what a
    /// successful read or write moved.
    pub fn answered(&self, op: Op, bytes: u64, latency: Duration, status: Status) {
        let i = op as usize;
        self.commands[i].add(1);
        let ns = latency.as_nanos().min(u64::MAX as u128) as u64;
        let b = LATENCY_BOUNDS_US.partition_point(|&us| us * 1_000 < ns);
        self.buckets[i][b].add(1);
        self.latency_ns[i].add(ns);
        if !status.is_success() {
            self.failed(status);
        } else if op != Op::Other {
            self.bytes[i].add(bytes);
        }
    }

    /// A command for the namespace was refused before it started.
    pub fn refused(&self, op: Op, status: Status) {
        self.commands[op as usize].add(1);
        self.failed(status);
    }

    fn failed(&self, status: Status) {
        let key = ((status.sct as u32) << 8 | status.sc as u32) + 1;
        for (i, s) in self.error_status.iter().enumerate() {
            match s.load(Ordering::Relaxed) {
                0 => {
                    s.store(key, Ordering::Relaxed);
                    return self.errors[i].add(1);
                }
                k if k == key => return self.errors[i].add(1),
                _ => {}
            }
        }
        self.errors_other.add(1);
    }
}

/// A namespace's counters, one set per poller.
pub struct NsMetrics(Box<[NsCounters]>);

impl NsMetrics {
    pub fn new(pollers: usize) -> NsMetrics {
        NsMetrics((0..pollers.max(1)).map(|_| NsCounters::default()).collect())
    }

    /// The counters poller `poller` writes.
    pub fn of(&self, poller: usize) -> &NsCounters {
        &self.0[poller % self.0.len()]
    }

    /// Commands answered and bytes moved, over all pollers.
    pub fn totals(&self) -> (u64, u64) {
        let commands = self.sum(|c| c.commands.iter().map(Counter::get).sum());
        let bytes = self.sum(|c| c.bytes.iter().map(Counter::get).sum());
        (commands, bytes)
    }

    /// Commands decoded and not yet gone.
    pub fn in_flight(&self) -> u64 {
        let started = self.sum(|c| c.started.get());
        (started.wrapping_sub(self.sum(|c| c.ended.get())) as i64).max(0) as u64
    }

    fn sum(&self, f: impl Fn(&NsCounters) -> u64) -> u64 {
        self.0.iter().map(f).fold(0, u64::wrapping_add)
    }

    /// Commands held back by QoS limits, over all pollers.
    pub fn throttled(&self) -> u64 {
        self.sum(|c| c.held.get())
    }

    /// Commands waiting for their QoS limits now.
    pub fn queued(&self) -> u64 {
        let held = self.throttled();
        (held.wrapping_sub(self.sum(|c| c.released.get())) as i64).max(0) as u64
    }

    /// Time commands spent held back by QoS limits, in nanoseconds.
    pub fn throttled_ns(&self) -> u64 {
        self.sum(|c| c.held_ns.get())
    }

    /// Commands of class `op` answered, over all pollers.
    pub fn commands(&self, op: Op) -> u64 {
        self.sum(|c| c.commands[op as usize].get())
    }

    /// Bytes moved by successful commands of class `op` (reads, writes).
    pub fn bytes(&self, op: Op) -> u64 {
        self.sum(|c| c.bytes.get(op as usize).map_or(0, Counter::get))
    }

    /// The latency histogram of class `op` (counts per bucket, not
    /// cumulative), over all pollers.
    pub fn latency_buckets(&self, op: Op) -> [u64; BUCKETS] {
        std::array::from_fn(|b| self.sum(|c| c.buckets[op as usize][b].get()))
    }

    /// The sum of the latencies of class `op`, in nanoseconds.
    pub fn latency_ns(&self, op: Op) -> u64 {
        self.sum(|c| c.latency_ns[op as usize].get())
    }

    /// Failures by status over all pollers; `None` is "other" (statuses
    /// beyond a poller's slots).
    pub fn errors(&self) -> BTreeMap<Option<u32>, u64> {
        let mut out = BTreeMap::new();
        for c in self.0.iter() {
            for (s, n) in c.error_status.iter().zip(&c.errors) {
                let (key, n) = (s.load(Ordering::Relaxed), n.get());
                if key != 0 && n > 0 {
                    *out.entry(Some(key - 1)).or_insert(0) += n;
                }
            }
            if c.errors_other.get() > 0 {
                *out.entry(None).or_insert(0) += c.errors_other.get();
            }
        }
        out
    }
}

/// One poller's own counters.
#[derive(Default)]
pub struct PollerCounters {
    /// Arena bytes held by commands (a gauge).
    pub arena_bytes: Counter,
    /// Time spent working rather than waiting for completions.
    pub busy_ns: Counter,
    /// Times it went to sleep in its ring (each ended by a wake-up).
    pub sleeps: Counter,
    /// Socket sends (NVMe/TCP): each carries every PDU its queue had ready.
    pub sends: Counter,
    /// Its adaptive spin window, in nanoseconds (a gauge).
    pub spin_window_ns: Counter,
}
