//! The checker. Per register, first the anomalies a reader can follow
//! (a value never written, a failed write's value, a read before its
//! write began, a read older than a write acknowledged before it began),
//! then, where none explains it, linearizability itself by the zones of
//! Gibbons and Korach ("Testing shared memories", 1997) for registers with
//! unique values: a value's cluster (its write and the reads returning
//! it) spans from the earliest end to the latest start among them; where
//! that is a forward zone (earliest end before latest start) the value must
//! be the register's for the whole zone. The history is linearizable iff
//! no two forward zones overlap and no backward zone lies inside a forward
//! one. A write of unknown outcome may take effect any time after its
//! start (it ends at infinity); one that nobody read may never have.

use super::{History, Kind, Op, Outcome, Register, GARBAGE, INITIAL};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

/// The end of an operation that may take effect at any time.
const NEVER: Duration = Duration::MAX;

/// What makes a history illegal, with the operations that show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Anomaly {
    /// A read returned a value no write wrote, or bytes that are no
    /// write's ([`GARBAGE`]).
    NeverWritten { read: Op },
    /// A read returned the value of a write the host saw fail.
    FailedWriteSeen { read: Op, write: Op },
    /// A read returned a value whose write started only after the read
    /// ended.
    FromTheFuture { read: Op, write: Op },
    /// A read returned the value of write `old`, although write `newer`
    /// was acknowledged, started after `old` ended and ended before the
    /// read started.
    StaleRead { read: Op, old: Op, newer: Op },
    /// The same, on the register's last read: `newer` was lost.
    LostWrite { read: Op, old: Op, newer: Op },
    /// No anomaly above explains it, but the register's history is not
    /// linearizable: the operations of the two values whose zones
    /// conflict.
    NotLinearizable { register: Register, ops: Vec<Op> },
    /// An operation took longer than the deadline, or never ended.
    Hung { op: Op, deadline: Duration },
}

impl Anomaly {
    /// The operations that show it.
    pub fn ops(&self) -> Vec<&Op> {
        match self {
            Anomaly::NeverWritten { read } => vec![read],
            Anomaly::FailedWriteSeen { read, write } | Anomaly::FromTheFuture { read, write } => {
                vec![write, read]
            }
            Anomaly::StaleRead { read, old, newer } | Anomaly::LostWrite { read, old, newer } => {
                vec![old, newer, read]
            }
            Anomaly::NotLinearizable { ops, .. } => ops.iter().collect(),
            Anomaly::Hung { op, .. } => vec![op],
        }
    }
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Anomaly::NeverWritten { read } => {
                write!(f, "value never written: {read}")
            }
            Anomaly::FailedWriteSeen { read, write } => {
                write!(f, "a failed write's value was read: {write}; then {read}")
            }
            Anomaly::FromTheFuture { read, write } => {
                write!(f, "a read returned a write that had not started: {read}; {write}")
            }
            Anomaly::StaleRead { read, old, newer } => write!(
                f,
                "stale read: {read} returned {old}, though {newer} was acknowledged in between"
            ),
            Anomaly::LostWrite { read, old, newer } => write!(
                f,
                "lost write: {newer} was acknowledged, yet the last read, {read}, returned the older {old}"
            ),
            Anomaly::NotLinearizable { register, ops } => {
                write!(
                    f,
                    "not linearizable: ns {} block {}, these values' operations cannot be ordered:",
                    register.namespace, register.block
                )?;
                for o in ops {
                    write!(f, "\n    {o}")?;
                }
                Ok(())
            }
            Anomaly::Hung { op, deadline } => {
                write!(f, "past the deadline of {deadline:?}: {op}")
            }
        }
    }
}

/// What [`check`] found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub ops: usize,
    pub reads: usize,
    pub writes: usize,
    /// Reads that returned a value, writes acknowledged.
    pub ok_reads: usize,
    pub ok_writes: usize,
    pub failed: usize,
    pub unknown: usize,
    /// The longest operation that ended.
    pub longest: Duration,
    pub anomalies: Vec<Anomaly>,
}

impl Report {
    /// One line: the operations checked, their outcomes, the anomalies.
    pub fn summary(&self) -> String {
        format!(
            "ops {} checked ({} reads, {} writes): {} reads and {} writes ok, {} failed, {} unknown; longest {:.1}s; {} anomalies",
            self.ops,
            self.reads,
            self.writes,
            self.ok_reads,
            self.ok_writes,
            self.failed,
            self.unknown,
            self.longest.as_secs_f64(),
            self.anomalies.len()
        )
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.summary())?;
        for a in &self.anomalies {
            write!(f, "\nanomaly: {a}")?;
        }
        Ok(())
    }
}

/// Checks `history`; an operation longer than `deadline`, or that never
/// ended, is hung.
pub fn check(history: &History, deadline: Duration) -> Report {
    let mut r = Report {
        ops: history.ops.len(),
        ..Report::default()
    };
    let mut registers: BTreeMap<Register, Vec<&Op>> = BTreeMap::new();
    for op in &history.ops {
        match (op.kind, op.outcome) {
            (Kind::Read, Outcome::Ok) => r.ok_reads += 1,
            (Kind::Write, Outcome::Ok) => r.ok_writes += 1,
            (_, Outcome::Failed) => r.failed += 1,
            (_, Outcome::Unknown) => r.unknown += 1,
        }
        match op.kind {
            Kind::Read => r.reads += 1,
            Kind::Write => r.writes += 1,
        }
        match op.end {
            Some(end) if end.saturating_sub(op.start) <= deadline => {
                r.longest = r.longest.max(end - op.start);
            }
            _ => r.anomalies.push(Anomaly::Hung {
                op: op.clone(),
                deadline,
            }),
        }
        registers.entry(op.register).or_default().push(op);
    }
    for (register, ops) in registers {
        check_register(register, &ops, &mut r.anomalies);
    }
    r
}

/// When an operation may have taken effect at the latest: its end, or
/// never for a write of unknown outcome (or that never ended).
fn end_of(op: &Op) -> Duration {
    match (op.outcome, op.end) {
        (Outcome::Ok, Some(e)) => e,
        (_, Some(e)) if op.kind == Kind::Read => e,
        _ => NEVER,
    }
}

fn check_register(register: Register, ops: &[&Op], out: &mut Vec<Anomaly>) {
    let found = out.len();
    let mut writes: HashMap<u64, &Op> = HashMap::new();
    for w in ops.iter().filter(|o| o.kind == Kind::Write) {
        assert!(
            w.value != INITIAL && w.value != GARBAGE,
            "the workload wrote a reserved value: {w}"
        );
        if let Some(other) = writes.insert(w.value, w) {
            panic!("two writes of one value (the workload's values must be unique): {other}; {w}");
        }
    }
    let reads: Vec<&Op> = ops
        .iter()
        .filter(|o| o.kind == Kind::Read && o.outcome == Outcome::Ok)
        .copied()
        .collect();
    // Acknowledged writes by end, with the latest start among those ending
    // up to each: the newest write a read starting later must not miss.
    let mut acked: Vec<&Op> = writes
        .values()
        .filter(|w| w.outcome == Outcome::Ok && w.end.is_some())
        .copied()
        .collect();
    acked.sort_by_key(|w| end_of(w));
    let mut latest: Vec<usize> = Vec::with_capacity(acked.len());
    for (i, w) in acked.iter().enumerate() {
        let best = match latest.last() {
            Some(&b) if acked[b].start >= w.start => b,
            _ => i,
        };
        latest.push(best);
    }
    let last_read = reads.iter().map(|r| r.start).max();
    for r in &reads {
        let read_end = end_of(r);
        // The end of the write whose value it returned (INITIAL's: 0).
        let written_end = match r.value {
            INITIAL => Duration::ZERO,
            GARBAGE => {
                out.push(Anomaly::NeverWritten { read: (*r).clone() });
                continue;
            }
            v => match writes.get(&v) {
                None => {
                    out.push(Anomaly::NeverWritten { read: (*r).clone() });
                    continue;
                }
                Some(w) if w.outcome == Outcome::Failed => {
                    out.push(Anomaly::FailedWriteSeen {
                        read: (*r).clone(),
                        write: (*w).clone(),
                    });
                    continue;
                }
                Some(w) if w.start > read_end => {
                    out.push(Anomaly::FromTheFuture {
                        read: (*r).clone(),
                        write: (*w).clone(),
                    });
                    continue;
                }
                Some(w) => end_of(w),
            },
        };
        let before = acked.partition_point(|n| end_of(n) < r.start);
        if before == 0 {
            continue;
        }
        let newer = acked[latest[before - 1]];
        let missed = if r.value == INITIAL {
            true
        } else {
            newer.start > written_end
        };
        if missed {
            let old = match r.value {
                INITIAL => Op {
                    process: 0,
                    kind: Kind::Write,
                    register,
                    value: INITIAL,
                    start: Duration::ZERO,
                    end: Some(Duration::ZERO),
                    outcome: Outcome::Ok,
                },
                v => writes[&v].clone(),
            };
            let (read, newer) = ((*r).clone(), newer.clone());
            out.push(if Some(r.start) == last_read {
                Anomaly::LostWrite { read, old, newer }
            } else {
                Anomaly::StaleRead { read, old, newer }
            });
        }
    }
    if out.len() == found {
        if let Some(conflict) = zones_conflict(&writes, &reads) {
            out.push(Anomaly::NotLinearizable {
                register,
                ops: conflict,
            });
        }
    }
}

/// A value's zone: from the earliest end to the latest start among its
/// write and reads (`low`, `high`), forward when `low < high`.
struct Zone {
    low: Duration,
    high: Duration,
    value: u64,
}

/// Two values whose zones conflict (their operations), if any.
fn zones_conflict(writes: &HashMap<u64, &Op>, reads: &[&Op]) -> Option<Vec<Op>> {
    let read: HashSet<u64> = reads.iter().map(|r| r.value).collect();
    let mut clusters: HashMap<u64, (Duration, Duration)> = HashMap::new();
    for w in writes.values() {
        // A failed write never took effect (and reads of it were
        // reported); an unknown one nobody read may never have.
        if w.outcome == Outcome::Failed || (end_of(w) == NEVER && !read.contains(&w.value)) {
            continue;
        }
        clusters.insert(w.value, (end_of(w), w.start));
    }
    if read.contains(&INITIAL) {
        clusters.insert(INITIAL, (Duration::ZERO, Duration::ZERO));
    }
    for r in reads {
        if let Some(c) = clusters.get_mut(&r.value) {
            c.0 = c.0.min(end_of(r));
            c.1 = c.1.max(r.start);
        }
    }
    let (mut forward, mut backward): (Vec<Zone>, Vec<Zone>) = clusters
        .into_iter()
        .map(|(value, (low, high))| Zone { low, high, value })
        .partition(|z| z.low < z.high);
    forward.sort_by_key(|z| z.low);
    backward.sort_by_key(|z| z.high);
    let ops_of = |values: [u64; 2]| -> Vec<Op> {
        let mut ops: Vec<Op> = writes
            .values()
            .filter(|w| values.contains(&w.value))
            .map(|w| (*w).clone())
            .chain(
                reads
                    .iter()
                    .filter(|r| values.contains(&r.value))
                    .map(|r| (*r).clone()),
            )
            .collect();
        ops.sort_by_key(|o| o.start);
        ops
    };
    for pair in forward.windows(2) {
        if pair[1].low < pair[0].high {
            return Some(ops_of([pair[0].value, pair[1].value]));
        }
    }
    // Backward zones: [high, low]. Inside the forward zone that starts
    // last before it?
    for b in &backward {
        let i = forward.partition_point(|f| f.low < b.high);
        if i > 0 && b.low < forward[i - 1].high {
            return Some(ops_of([forward[i - 1].value, b.value]));
        }
    }
    None
}
