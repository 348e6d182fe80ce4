//! What a benchmark measures: latency histograms and counts per direction.

use crate::host::engine::Activity;
use std::time::Duration;

/// A log-linear latency histogram (about 1.5 % resolution), in nanoseconds.
#[derive(Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    max: u64,
    total: u64,
}

const SUB_BITS: u32 = 6;

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; (64 << SUB_BITS) as usize],
            max: 0,
            total: 0,
        }
    }
}

impl Histogram {
    fn bucket(v: u64) -> usize {
        if v < (1 << SUB_BITS) {
            return v as usize;
        }
        let msb = 63 - v.leading_zeros();
        let shift = msb - SUB_BITS;
        (((shift + 1) << SUB_BITS) as u64 + ((v >> shift) & ((1 << SUB_BITS) - 1))) as usize
    }

    fn bucket_value(b: usize) -> u64 {
        let b = b as u64;
        if b < (1 << SUB_BITS) {
            return b;
        }
        let shift = (b >> SUB_BITS) - 1;
        let sub = b & ((1 << SUB_BITS) - 1);
        ((1 << SUB_BITS) | sub) << shift
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[Self::bucket(ns)] += 1;
        self.max = self.max.max(ns);
        self.total += 1;
    }

    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.max = self.max.max(o.max);
        self.total += o.total;
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The value at quantile `q` (0..=1), in nanoseconds.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let want = ((self.total as f64 * q).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Self::bucket_value(b).min(self.max);
            }
        }
        self.max
    }

    pub fn max(&self) -> u64 {
        self.max
    }
}

/// Results of one direction.
#[derive(Clone, Default)]
pub struct DirStats {
    pub ios: u64,
    pub bytes: u64,
    pub errors: u64,
    pub lat: Histogram,
}

impl DirStats {
    fn merge(&mut self, o: &DirStats) {
        self.ios += o.ios;
        self.bytes += o.bytes;
        self.errors += o.errors;
        self.lat.merge(&o.lat);
    }
}

/// Results of a thread, or of the whole run once merged.
#[derive(Clone, Default)]
pub struct Stats {
    pub read: DirStats,
    pub write: DirStats,
    /// Blocks that did not read back as written.
    pub verify_errors: u64,
    pub elapsed: Duration,
    /// CPU time (user and system) the process spent while the run went on:
    /// set for the whole run, not per thread.
    pub cpu: Duration,
    /// Commands submitted (an I/O larger than MDTS takes several).
    pub commands: u64,
    /// What the engines did: their sleeps (each ended by a wake-up) and
    /// socket sends.
    pub activity: Activity,
}

impl Stats {
    pub fn merge(&mut self, o: &Stats) {
        self.read.merge(&o.read);
        self.write.merge(&o.write);
        self.verify_errors += o.verify_errors;
        self.elapsed = self.elapsed.max(o.elapsed);
        self.cpu += o.cpu;
        self.commands += o.commands;
        self.activity.sleeps += o.activity.sleeps;
        self.activity.sends += o.activity.sends;
    }

    /// Commands per socket send and per wake-up (None where there were
    /// none: NVMe/RDMA has no socket sends; busy polling never sleeps).
    pub fn batching(&self) -> (Option<f64>, Option<f64>) {
        let per = |n: u64| (n > 0).then(|| self.commands as f64 / n as f64);
        (per(self.activity.sends), per(self.activity.sleeps))
    }

    /// The process's CPU time per I/O, microseconds (0 without I/O).
    pub fn cpu_us_per_io(&self) -> f64 {
        let ios = self.read.ios + self.write.ios;
        if ios == 0 {
            return 0.0;
        }
        self.cpu.as_secs_f64() * 1e6 / ios as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_are_close() {
        let mut h = Histogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 / 50_000_000.0 - 1.0).abs() < 0.02, "p50 {p50}");
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 / 99_000_000.0 - 1.0).abs() < 0.02, "p99 {p99}");
        assert_eq!(h.max(), 100_000_000);
        assert_eq!(h.count(), 100_000);
    }
}
