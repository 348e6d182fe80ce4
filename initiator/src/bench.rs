//! The built-in load generator: keeps `qd` I/Os in flight per queue for a
//! while, measures IOPS, bandwidth and latency percentiles, and optionally
//! verifies every block it reads back against what it wrote.

use crate::host::engine::{Activity, Cx, Driver};
use crate::host::Done;
use crate::host::NamespaceInfo;
use rdmablk_common::mem::{Arena, ArenaBuf};
use rdmablk_common::nvme::{nvm, ReadWriteCmd};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

struct Slot {
    buf: Option<ArenaBuf>,
    unit: u64,
    write: bool,
    parts_left: usize,
    failed: bool,
    started: Instant,
}

/// The per-thread driver.
pub struct Bench {
    job: Job,
    progress: Arc<Progress>,
    slots: Vec<Slot>,
    idle: Vec<usize>,
    /// Units with an I/O in flight, kept with --verify only: a unit is
    /// never read and written at once, so what a read returns is known.
    in_flight_units: HashSet<u64>,
    written: Vec<u64>,
    next_seq: u64,
    rng: u64,
    start: Option<Instant>,
    deadline: Option<Instant>,
    pub stats: Stats,
    /// First problems seen, for the report.
    pub problems: Vec<String>,
    /// Staging for verify data between the arena and `fill` / `check` (made
    /// on first use, then reused: no allocation per I/O).
    stage: Vec<u8>,
}

/// Bytes of verify data staged at a time (rounded down to whole blocks, at
/// least one).
const STAGE_BYTES: usize = 64 << 10;

impl Bench {
    pub fn new(job: Job, progress: Arc<Progress>, seed: u64) -> Bench {
        let written = if job.verify {
            vec![0; job.units.div_ceil(64) as usize]
        } else {
            Vec::new()
        };
        let slots = (0..job.qd)
            .map(|_| Slot {
                buf: None,
                unit: 0,
                write: false,
                parts_left: 0,
                failed: false,
                started: Instant::now(),
            })
            .collect();
        Bench {
            idle: (0..job.qd).rev().collect(),
            job,
            progress,
            slots,
            in_flight_units: HashSet::new(),
            written,
            next_seq: 0,
            rng: seed | 1,
            start: None,
            deadline: None,
            stats: Stats::default(),
            problems: Vec::new(),
            stage: Vec::new(),
        }
    }

    fn random(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn pick(&mut self) -> (u64, bool) {
        let write = match self.job.pattern {
            Pattern::RandRead | Pattern::Read => false,
            Pattern::RandWrite | Pattern::Write => true,
            Pattern::RandRw => self.random() & 1 == 1,
        };
        let sequential = matches!(self.job.pattern, Pattern::Read | Pattern::Write);
        for _ in 0..64 {
            let unit = if sequential {
                let u = self.next_seq % self.job.units;
                self.next_seq += 1;
                u
            } else {
                self.random() % self.job.units
            };
            if !self.in_flight_units.contains(&unit) {
                return (unit, write);
            }
        }
        // Every candidate was busy (tiny regions): fall back to any free unit.
        let unit = (0..self.job.units)
            .find(|u| !self.in_flight_units.contains(u))
            .unwrap_or(0);
        (unit, write)
    }

    fn is_written(&self, unit: u64) -> bool {
        self.written
            .get((unit / 64) as usize)
            .is_some_and(|w| w >> (unit % 64) & 1 == 1)
    }

    fn mark_written(&mut self, unit: u64) {
        if let Some(w) = self.written.get_mut((unit / 64) as usize) {
            *w |= 1 << (unit % 64);
        }
    }

    /// Fills a write buffer with self-checking blocks.
    fn fill(&mut self, data: &mut [u8], first_lba: u64) {
        let bs = self.job.ns.block_size as usize;
        for (i, block) in data.chunks_exact_mut(bs).enumerate() {
            let lba = first_lba + i as u64;
            block[0..8].copy_from_slice(&lba.to_le_bytes());
            block[8..16].copy_from_slice(&self.job.run_id.to_le_bytes());
            let mut x = self.random();
            for w in block[20..].chunks_mut(8) {
                x = x.rotate_left(13) ^ 0x9e37_79b9_7f4a_7c15;
                let n = w.len();
                w.copy_from_slice(&x.to_le_bytes()[..n]);
            }
            let crc = block_crc(block);
            block[16..20].copy_from_slice(&crc.to_le_bytes());
        }
    }

    /// The staging vector, taken out of `self` (give it back with
    /// `self.stage = ..`), at least one block long and a whole number of
    /// blocks.
    fn take_stage(&mut self) -> Vec<u8> {
        let block = (self.job.ns.block_size as usize).max(1);
        let mut stage = std::mem::take(&mut self.stage);
        if stage.is_empty() {
            stage.resize(STAGE_BYTES.max(block) / block * block, 0);
        }
        stage
    }

    /// [`Bench::fill`] for the first `len` bytes of an arena buffer, staged
    /// through `self.stage`.
    fn fill_arena(&mut self, arena: &mut Arena, buf: &ArenaBuf, len: usize, first_lba: u64) {
        let block = (self.job.ns.block_size as usize).max(1);
        let len = len / block * block;
        let mut stage = self.take_stage();
        let mut at = 0;
        while at < len {
            let n = (len - at).min(stage.len());
            self.fill(&mut stage[..n], first_lba + (at / block) as u64);
            arena.write(buf, at, &stage[..n]);
            at += n;
        }
        self.stage = stage;
    }

    /// [`Bench::check`] for the first `len` bytes of an arena buffer, staged
    /// through `self.stage`.
    fn check_arena(
        &mut self,
        arena: &Arena,
        buf: &ArenaBuf,
        len: usize,
        first_lba: u64,
        written_by_us: bool,
    ) -> u64 {
        let block = (self.job.ns.block_size as usize).max(1);
        let len = len / block * block;
        let mut stage = self.take_stage();
        let mut bad = 0;
        let mut at = 0;
        while at < len {
            let n = (len - at).min(stage.len());
            arena.read(buf, at, &mut stage[..n]);
            bad += self.check(&stage[..n], first_lba + (at / block) as u64, written_by_us);
            at += n;
        }
        self.stage = stage;
        bad
    }

    /// Checks a read buffer; returns the number of bad blocks.
    fn check(&mut self, data: &[u8], first_lba: u64, written_by_us: bool) -> u64 {
        let bs = self.job.ns.block_size as usize;
        let mut bad = 0;
        for (i, block) in data.chunks_exact(bs).enumerate() {
            let lba = first_lba + i as u64;
            let run = u64::from_le_bytes(block[8..16].try_into().expect("8 bytes"));
            let ours = run == self.job.run_id;
            let why = if ours {
                let lba_in = u64::from_le_bytes(block[0..8].try_into().expect("8 bytes"));
                let crc = u32::from_le_bytes(block[16..20].try_into().expect("4 bytes"));
                if lba_in != lba {
                    Some(format!(
                        "LBA {lba} holds the block written for LBA {lba_in}"
                    ))
                } else if crc != block_crc(block) {
                    Some(format!("LBA {lba}: CRC32C mismatch"))
                } else {
                    None
                }
            } else if written_by_us {
                Some(format!(
                    "LBA {lba}: written by this run but reads back as something else"
                ))
            } else {
                None
            };
            if let Some(w) = why {
                bad += 1;
                if self.problems.len() < 10 {
                    self.problems.push(format!("verify: {w}"));
                }
            }
        }
        bad
    }

    /// Starts an I/O in `slot`; `now` (this pump's clock reading) is its
    /// start for the latency.
    fn start_io(&mut self, slot: usize, cx: &mut Cx, now: Instant) -> bool {
        let (unit, write) = self.pick();
        let bs = self.job.bs;
        let Some(buf) = cx.arena.alloc(bs) else {
            return false;
        };
        let lba_per_unit = (bs / self.job.ns.block_size as usize) as u64;
        let first_lba = (self.job.first_unit + unit) * lba_per_unit;
        if write && self.job.verify {
            self.fill_arena(cx.arena, &buf, bs, first_lba);
        }
        let parts = bs.div_ceil(self.job.max_transfer);
        let needed = parts.min(cx.paths.free_slots());
        if needed < parts {
            cx.arena.free(buf);
            return false;
        }
        let block = self.job.ns.block_size as usize;
        for p in 0..parts {
            let off = p * self.job.max_transfer;
            let len = (bs - off).min(self.job.max_transfer);
            let sqe = ReadWriteCmd {
                nsid: self.job.ns.nsid,
                slba: first_lba + (off / block) as u64,
                nlb: (len / block - 1) as u16,
                fua: false,
                deallocate: false,
            }
            .to_sqe(if write { nvm::WRITE } else { nvm::READ }, 0);
            let ptr = cx.arena.addr(&buf, off);
            // SAFETY: the arena buffer stays allocated until every part of
            // this I/O has completed (freed in `finish`).
            let ok = unsafe { cx.paths.submit(sqe, ptr, len, !write, slot as u64) };
            debug_assert!(ok, "free slots were checked");
        }
        self.stats.commands += parts as u64;
        if self.job.verify {
            self.in_flight_units.insert(unit);
        }
        let s = &mut self.slots[slot];
        s.buf = Some(buf);
        s.unit = unit;
        s.write = write;
        s.parts_left = parts;
        s.failed = false;
        s.started = now;
        true
    }

    fn finish(&mut self, slot: usize, cx: &mut Cx) {
        let lat = cx
            .now()
            .saturating_duration_since(self.slots[slot].started)
            .as_nanos() as u64;
        let (unit, write, failed) = (
            self.slots[slot].unit,
            self.slots[slot].write,
            self.slots[slot].failed,
        );
        let buf = self.slots[slot]
            .buf
            .take()
            .expect("slot in use has a buffer");
        let bs = self.job.bs;
        if !failed && self.job.verify {
            if write {
                self.mark_written(unit);
            } else {
                let lba_per_unit = (bs / self.job.ns.block_size as usize) as u64;
                let first_lba = (self.job.first_unit + unit) * lba_per_unit;
                let ours = self.is_written(unit);
                self.stats.verify_errors += self.check_arena(cx.arena, &buf, bs, first_lba, ours);
            }
        }
        cx.arena.free(buf);
        if self.job.verify {
            self.in_flight_units.remove(&unit);
        }
        let d = if write {
            &mut self.stats.write
        } else {
            &mut self.stats.read
        };
        if failed {
            d.errors += 1;
            self.progress.errors.fetch_add(1, Ordering::Relaxed);
        } else {
            d.ios += 1;
            d.bytes += bs as u64;
            d.lat.record(lat);
            let c = if write {
                &self.progress.writes
            } else {
                &self.progress.reads
            };
            c.fetch_add(1, Ordering::Relaxed);
            self.progress.bytes.fetch_add(bs as u64, Ordering::Relaxed);
        }
        self.idle.push(slot);
    }

    fn running(&self, now: Instant) -> bool {
        !self.progress.stop.load(Ordering::Relaxed) && self.deadline.is_none_or(|d| now < d)
    }
}

/// CRC32C of a verify block with its CRC field taken as zero.
fn block_crc(block: &[u8]) -> u32 {
    let c = crc32c::crc32c(&block[..16]);
    let c = crc32c::crc32c_append(c, &[0; 4]);
    crc32c::crc32c_append(c, &block[20..])
}

impl Driver for Bench {
    fn pump(&mut self, cx: &mut Cx) -> bool {
        let now = cx.now();
        let start = *self.start.get_or_insert(now);
        if self.deadline.is_none() {
            self.deadline = Some(now + self.job.runtime);
        }
        // Kept current: a run that ends on a failed queue reports its rates
        // over the time it ran.
        self.stats.elapsed = now - start;
        if self.running(now) {
            while let Some(slot) = self.idle.pop() {
                if !self.start_io(slot, cx, now) {
                    self.idle.push(slot);
                    break;
                }
            }
            return true;
        }
        if self.idle.len() == self.job.qd {
            self.stats.elapsed = self.start.map_or(Duration::ZERO, |s| s.elapsed());
            return false;
        }
        true
    }

    fn on_done(&mut self, done: Done, cx: &mut Cx) {
        let slot = done.tag as usize;
        if !done.cqe.status().is_success() {
            if self.problems.len() < 10 {
                self.problems
                    .push(format!("I/O error: {}", done.cqe.status()));
            }
            self.slots[slot].failed = true;
        }
        self.slots[slot].parts_left -= 1;
        if self.slots[slot].parts_left == 0 {
            self.finish(slot, cx);
        }
    }

    fn on_end(&mut self, activity: Activity) {
        self.stats.activity = activity;
    }
}

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

    /// A verifying random read/write job of `bs`-byte I/Os over a namespace
    /// of `blocks` blocks of `block_size` bytes.
    fn verify_job(block_size: u32, blocks: u64, bs: usize, run_id: u64) -> Job {
        let ns = NamespaceInfo {
            nsid: 1,
            block_size,
            blocks,
            read_only: false,
            deallocate_zeroes: true,
        };
        Job {
            pattern: Pattern::RandRw,
            bs,
            qd: 1,
            runtime: Duration::from_secs(1),
            verify: true,
            ns,
            first_unit: 0,
            units: 128,
            max_transfer: 1 << 20,
            run_id,
        }
    }

    #[test]
    fn verify_block_detects_corruption() {
        let job = verify_job(512, 1024, 4096, 7);
        let mut b = Bench::new(job, Arc::new(Progress::default()), 1);
        let mut data = vec![0u8; 4096];
        b.fill(&mut data, 80);
        assert_eq!(b.check(&data, 80, true), 0);
        assert_eq!(b.check(&data, 81, true), 8, "wrong LBA");
        data[700] ^= 1;
        assert_eq!(b.check(&data, 80, true), 1);
        assert_eq!(
            b.check(&[0u8; 4096], 80, false),
            0,
            "never written: not an error"
        );
        assert_eq!(b.check(&[0u8; 4096], 80, true), 8, "lost write");
    }

    #[test]
    fn arena_staging_matches_fill_and_check() {
        // Larger than the stage, so several chunks are staged.
        let bs = STAGE_BYTES * 2 + 3 * 4096;
        let job = verify_job(4096, 1 << 20, bs, 9);
        let mut arena = Arena::new(4 << 20, false).unwrap();
        let buf = arena.alloc(bs).unwrap();
        let mut staged = Bench::new(job.clone(), Arc::new(Progress::default()), 5);
        let mut direct = Bench::new(job, Arc::new(Progress::default()), 5);
        staged.fill_arena(&mut arena, &buf, bs, 1000);
        let mut expect = vec![0u8; bs];
        direct.fill(&mut expect, 1000);
        let mut got = vec![0u8; bs];
        arena.read(&buf, 0, &mut got);
        assert!(got == expect, "same bytes as filling in place");
        assert_eq!(staged.check_arena(&arena, &buf, bs, 1000, true), 0);
        arena.fill(&buf, STAGE_BYTES + 100, 1, 0xff);
        arena.fill(&buf, bs - 1, 1, 0xff);
        assert_eq!(staged.check_arena(&arena, &buf, bs, 1000, true), 2);
        assert_eq!(
            staged.check_arena(&arena, &buf, bs, 1001, true),
            35,
            "wrong LBA"
        );
        arena.free(buf);
    }
}
