//! The benchmark's result as text or as one JSON object.

use super::stats::{DirStats, Stats};

/// Formats nanoseconds as microseconds with two decimals.
pub fn us(ns: u64) -> f64 {
    (ns as f64 / 10.0).round() / 100.0
}

impl DirStats {
    /// Latency p50, p99, p99.9 and max, in microseconds.
    fn latency_us(&self) -> [f64; 4] {
        let q = |x| us(self.lat.quantile(x));
        [q(0.5), q(0.99), q(0.999), us(self.lat.max())]
    }
}

/// Rounds to one decimal, as the JSON reports rates.
fn tenths(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Latencies of one direction in `--json`, microseconds.
#[derive(serde::Serialize)]
struct LatencyJson {
    p50: f64,
    p99: f64,
    #[serde(rename = "p99.9")]
    p999: f64,
    max: f64,
}

/// One direction in `--json`.
#[derive(serde::Serialize)]
struct DirJson {
    iops: f64,
    bw_bytes: u64,
    ios: u64,
    errors: u64,
    lat_us: LatencyJson,
}

/// The one object `--json` prints.
#[derive(serde::Serialize)]
struct StatsJson {
    iops: f64,
    bw_bytes: u64,
    runtime_s: f64,
    /// The process's CPU time (user + system) per I/O.
    cpu_us_per_io: f64,
    /// Commands per socket send (NVMe/TCP) and per wake-up of an engine.
    commands_per_send: Option<f64>,
    commands_per_wakeup: Option<f64>,
    verify_errors: u64,
    read: DirJson,
    write: DirJson,
}

impl DirJson {
    fn new(d: &DirStats, secs: f64) -> DirJson {
        let [p50, p99, p999, max] = d.latency_us();
        DirJson {
            iops: tenths(d.ios as f64 / secs),
            bw_bytes: (d.bytes as f64 / secs).round() as u64,
            ios: d.ios,
            errors: d.errors,
            lat_us: LatencyJson {
                p50,
                p99,
                p999,
                max,
            },
        }
    }
}

/// The result as the one JSON object `--json` prints.
pub fn to_json(s: &Stats) -> String {
    let secs = s.elapsed.as_secs_f64().max(1e-9);
    let ios = s.read.ios + s.write.ios;
    let bytes = s.read.bytes + s.write.bytes;
    let out = StatsJson {
        iops: tenths(ios as f64 / secs),
        bw_bytes: (bytes as f64 / secs).round() as u64,
        runtime_s: (secs * 1000.0).round() / 1000.0,
        cpu_us_per_io: (s.cpu_us_per_io() * 100.0).round() / 100.0,
        commands_per_send: s.batching().0.map(tenths),
        commands_per_wakeup: s.batching().1.map(tenths),
        verify_errors: s.verify_errors,
        read: DirJson::new(&s.read, secs),
        write: DirJson::new(&s.write, secs),
    };
    serde_json::to_string(&out).expect("plain numbers serialize")
}

/// The result as text.
pub fn to_text(s: &Stats) -> String {
    let secs = s.elapsed.as_secs_f64().max(1e-9);
    let mut out = String::new();
    for (name, d) in [("read", &s.read), ("write", &s.write)] {
        if d.ios == 0 && d.errors == 0 {
            continue;
        }
        let [p50, p99, p999, max] = d.latency_us();
        out += &format!(
            "{name:>5}: {:>10.0} IOPS  {:>9.1} MiB/s  {} I/Os  {} errors  latency us: p50 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}\n",
            d.ios as f64 / secs,
            d.bytes as f64 / secs / (1 << 20) as f64,
            d.ios,
            d.errors,
            p50,
            p99,
            p999,
            max
        );
    }
    out += &format!(
        "  run: {secs:.2} s, cpu {:.2} s ({:.2} us per I/O), verify errors: {}\n",
        s.cpu.as_secs_f64(),
        s.cpu_us_per_io(),
        s.verify_errors
    );
    let shown = |x: Option<f64>, none: &str| x.map_or(none.to_string(), |v| format!("{v:.1}"));
    let (per_send, per_wakeup) = s.batching();
    out += &format!(
        "  batching: {} commands per send, {} per wake-up\n",
        shown(per_send, "-"),
        shown(per_wakeup, "- (never slept)")
    );
    out
}
