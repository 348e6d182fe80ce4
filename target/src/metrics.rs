//! What the target counts for operators, and the Prometheus text
//! exposition (format 0.0.4) a scrape of the metrics endpoint gets.
//!
//! Counters live per poller: each has one writer, its poller, which adds
//! with a plain load and store (no atomic read-modify-write and no cache
//! line shared with another poller on the I/O path); a scrape sums them.

pub mod http;

use crate::poller::Shared;
use crate::subsystem::Namespace;
use rdmablk_common::nvme::Status;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Upper bounds of the latency histogram's buckets, in microseconds.
pub const LATENCY_BOUNDS_US: [u64; 14] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000, 10_000_000,
];
const BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

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

const OPS: [(Op, &str); 3] = [
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

    /// Failures by status over all pollers; `None` is "other" (statuses
    /// beyond a poller's slots).
    fn errors(&self) -> BTreeMap<Option<u32>, u64> {
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
}

/// Escapes a label value (backslash, double quote, newline).
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Writes a family's HELP and TYPE lines.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The whole exposition.
pub fn render(shared: &Shared, started: Instant) -> String {
    let mut out = String::with_capacity(16 << 10);
    let r = &shared.registry;
    family(
        &mut out,
        "rdmablk_build_info",
        "gauge",
        "The running rdmablk-target's version.",
    );
    let _ = writeln!(
        out,
        "rdmablk_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    family(
        &mut out,
        "rdmablk_uptime_seconds",
        "gauge",
        "Seconds since the daemon started.",
    );
    let _ = writeln!(
        out,
        "rdmablk_uptime_seconds {:.3}",
        started.elapsed().as_secs_f64()
    );
    family(
        &mut out,
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time of the daemon.",
    );
    let cpu = rdmablk_common::usage::process_cpu().as_secs_f64();
    let _ = writeln!(out, "process_cpu_seconds_total {cpu:.6}");
    family(
        &mut out,
        "rdmablk_connections",
        "gauge",
        "Connections (queues) open, connected or not.",
    );
    let _ = writeln!(
        out,
        "rdmablk_connections {}",
        shared.connections.load(Ordering::Acquire)
    );

    let subsystems = r.subsystems();
    let namespaces: Vec<(&str, Arc<Namespace>)> = subsystems
        .iter()
        .flat_map(|s| {
            s.namespaces()
                .iter()
                .map(|n| (s.nqn.as_str(), n.clone()))
                .collect::<Vec<_>>()
        })
        .collect();
    let ns_labels =
        |nqn: &str, n: &Namespace| format!("subsystem=\"{}\",nsid=\"{}\"", label(nqn), n.nsid);
    family(
        &mut out,
        "rdmablk_namespace_size_bytes",
        "gauge",
        "Size of the namespace.",
    );
    for (nqn, n) in &namespaces {
        let _ = writeln!(
            out,
            "rdmablk_namespace_size_bytes{{{}}} {}",
            ns_labels(nqn, n),
            n.blocks() * n.block_size as u64
        );
    }
    family(
        &mut out,
        "rdmablk_namespace_commands_total",
        "counter",
        "I/O commands answered, by operation (other: flush, write zeroes, dataset management).",
    );
    for (nqn, n) in &namespaces {
        for (op, name) in OPS {
            let v = n.metrics.sum(|c| c.commands[op as usize].get());
            let _ = writeln!(
                out,
                "rdmablk_namespace_commands_total{{{},op=\"{name}\"}} {v}",
                ns_labels(nqn, n)
            );
        }
    }
    family(
        &mut out,
        "rdmablk_namespace_bytes_total",
        "counter",
        "Bytes read and written by successful commands.",
    );
    for (nqn, n) in &namespaces {
        for (op, name) in &OPS[..2] {
            let v = n.metrics.sum(|c| c.bytes[*op as usize].get());
            let _ = writeln!(
                out,
                "rdmablk_namespace_bytes_total{{{},op=\"{name}\"}} {v}",
                ns_labels(nqn, n)
            );
        }
    }
    family(
        &mut out,
        "rdmablk_namespace_errors_total",
        "counter",
        "I/O commands answered with an error, by NVMe status.",
    );
    for (nqn, n) in &namespaces {
        for (key, v) in n.metrics.errors() {
            let (name, sct, sc) = match key {
                Some(k) => {
                    let st = Status {
                        sct: (k >> 8) as u8,
                        sc: k as u8,
                    };
                    (
                        st.name().to_string(),
                        st.sct.to_string(),
                        format!("{:#04x}", st.sc),
                    )
                }
                None => ("other".to_string(), String::new(), String::new()),
            };
            let _ = writeln!(
                out,
                "rdmablk_namespace_errors_total{{{},status=\"{}\",sct=\"{sct}\",sc=\"{sc}\"}} {v}",
                ns_labels(nqn, n),
                label(&name)
            );
        }
    }
    family(
        &mut out,
        "rdmablk_namespace_commands_in_flight",
        "gauge",
        "I/O commands received and not yet answered.",
    );
    for (nqn, n) in &namespaces {
        let _ = writeln!(
            out,
            "rdmablk_namespace_commands_in_flight{{{}}} {}",
            ns_labels(nqn, n),
            n.metrics.in_flight()
        );
    }
    family(
        &mut out,
        "rdmablk_namespace_command_duration_seconds",
        "histogram",
        "Time from a command's arrival to its response, by operation.",
    );
    for (nqn, n) in &namespaces {
        let l = ns_labels(nqn, n);
        for (op, name) in OPS {
            let i = op as usize;
            let mut cumulative = 0u64;
            for (b, bound) in LATENCY_BOUNDS_US.iter().enumerate() {
                cumulative += n.metrics.sum(|c| c.buckets[i][b].get());
                let _ = writeln!(
                    out,
                    "rdmablk_namespace_command_duration_seconds_bucket{{{l},op=\"{name}\",le=\"{}\"}} {cumulative}",
                    *bound as f64 / 1e6
                );
            }
            cumulative += n.metrics.sum(|c| c.buckets[i][BUCKETS - 1].get());
            let _ = writeln!(
                out,
                "rdmablk_namespace_command_duration_seconds_bucket{{{l},op=\"{name}\",le=\"+Inf\"}} {cumulative}"
            );
            let sum = n.metrics.sum(|c| c.latency_ns[i].get()) as f64 / 1e9;
            let _ = writeln!(
                out,
                "rdmablk_namespace_command_duration_seconds_sum{{{l},op=\"{name}\"}} {sum:.9}\nrdmablk_namespace_command_duration_seconds_count{{{l},op=\"{name}\"}} {cumulative}"
            );
        }
    }

    // Hosts: live controllers and their queues, by host NQN and transport.
    let mut hosts: BTreeMap<(String, &'static str), (u64, u64)> = BTreeMap::new();
    for s in subsystems.iter().chain([&r.discovery]) {
        for c in s.live_controllers() {
            let e = hosts
                .entry((c.hostnqn.clone(), c.caps().transport))
                .or_default();
            e.0 += 1;
            e.1 += c.queues_connected() as u64;
        }
    }
    for (name, help, pick) in [
        (
            "rdmablk_host_controllers",
            "Live controllers (associations), by host NQN and transport.",
            (|v: &(u64, u64)| v.0) as fn(&(u64, u64)) -> u64,
        ),
        (
            "rdmablk_host_queues",
            "Connected queues (admin and I/O), by host NQN and transport.",
            |v: &(u64, u64)| v.1,
        ),
    ] {
        family(&mut out, name, "gauge", help);
        for ((host, transport), v) in &hosts {
            let _ = writeln!(
                out,
                "{name}{{host=\"{}\",transport=\"{transport}\"}} {}",
                label(host),
                pick(v)
            );
        }
    }
    family(
        &mut out,
        "rdmablk_poller_arena_bytes_in_use",
        "gauge",
        "Arena bytes the poller holds: commands' data and RDMA receive buffers.",
    );
    for (i, p) in shared.pollers.iter().enumerate() {
        let _ = writeln!(
            out,
            "rdmablk_poller_arena_bytes_in_use{{poller=\"{i}\"}} {}",
            p.arena_bytes.get()
        );
    }
    family(
        &mut out,
        "rdmablk_poller_busy_seconds_total",
        "counter",
        "CPU time of the poller thread (all of its time with busy_poll).",
    );
    for (i, p) in shared.pollers.iter().enumerate() {
        let _ = writeln!(
            out,
            "rdmablk_poller_busy_seconds_total{{poller=\"{i}\"}} {:.6}",
            p.busy_ns.get() as f64 / 1e9
        );
    }
    out
}
