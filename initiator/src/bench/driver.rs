//! The per-thread benchmark driver: keeps `qd` I/Os in flight on its
//! queue, and writes and checks self-verifying blocks with `--verify`.

use super::job::{Job, Pattern, Progress};
use super::stats::Stats;
use crate::host::engine::{Activity, Cx, Driver};
use crate::host::Done;
use rdmablk_common::mem::{Arena, ArenaBuf};
use rdmablk_common::nvme::{nvm, ReadWriteCmd};
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
            // The arena buffer stays allocated until every part of this I/O
            // has completed (freed in `finish`).
            let data = cx.data(&buf, off, len);
            let ok = cx.paths.submit(sqe, data, !write, slot as u64);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::NamespaceInfo;
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
