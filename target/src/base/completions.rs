//! Completions of operations that end off the poller's ring (librbd's
//! callbacks, the offload thread's jobs), handed back to the poller.

use rdmablk_common::ring::Wakeup;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Completions of backend operations that do not run on the poller's
/// ring (librbd's): the thread that finishes one records it here and, for
/// the first of a batch, wakes the poller through the eventfd its ring
/// polls. The poller dispatches them like ring completions.
pub struct Completions {
    done: Mutex<Vec<(u64, i32)>>,
    wakeup: Wakeup,
    /// Operations started on other threads (`begin`) that have not ended.
    away: AtomicUsize,
    /// Operations handed over so far (only the poller counts them).
    handed: AtomicUsize,
}

/// The poller lets the threads that carry out its operations have its CPU
/// after every this many it handed over (`Completions::handed_over`), and
/// after each round while any is away: they send them on in small batches.
/// Measured with librbd sharing the poller's CPU (bench/rbd.sh, 4K random
/// reads at QD32): handing over after every operation kept the cluster
/// busiest but cost 22-26 us of CPU per I/O; only after each round, 17 us,
/// but requests reached the OSD in bursts and IOPS fell 7 %; after every
/// fourth, 18 us and IOPS above both.
const HANDOFF_EVERY: usize = 4;

impl Completions {
    /// Completions that wake the poller polling `wakeup`.
    pub fn new(wakeup: Wakeup) -> Arc<Completions> {
        Arc::new(Completions {
            done: Mutex::new(Vec::new()),
            wakeup,
            away: AtomicUsize::new(0),
            handed: AtomicUsize::new(0),
        })
    }

    /// The poller started an operation that other threads carry out and
    /// `end` (librbd's): until then the poller yields its CPU to them
    /// between rounds.
    pub fn begin(&self) {
        self.away.fetch_add(1, Ordering::Relaxed);
    }

    /// The poller handed the operation `begin` announced over: every
    /// `HANDOFF_EVERY`th time, it yields its CPU to the threads that carry
    /// them out (they run under `SCHED_BATCH`: `base::sched`).
    pub fn handed_over(&self) {
        if self.handed.fetch_add(1, Ordering::Relaxed) % HANDOFF_EVERY == HANDOFF_EVERY - 1 {
            std::thread::yield_now();
        }
    }

    /// The operation `begin` announced ended: records it as `push` does.
    pub fn end(&self, token: u64, res: i32) {
        self.away.fetch_sub(1, Ordering::Relaxed);
        self.push(token, res);
    }

    /// Operations begun and not yet ended.
    pub fn away(&self) -> usize {
        self.away.load(Ordering::Relaxed)
    }

    /// Records that the operation with user data `token` ended with `res`
    /// (io_uring's convention: a count or `-errno`).
    pub fn push(&self, token: u64, res: i32) {
        let first = {
            let mut done = self.done.lock().expect("completions lock");
            done.push((token, res));
            done.len() == 1
        };
        // Later ones of a batch ride on the first's wake-up: the poller
        // takes everything recorded when it wakes.
        if first {
            self.wakeup.wake();
        }
    }

    /// Moves what was recorded into `into` (empty), for the poller.
    pub fn take(&self, into: &mut Vec<(u64, i32)>) {
        std::mem::swap(&mut *self.done.lock().expect("completions lock"), into);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_away_from_begin_to_end_and_their_ends_are_taken() {
        let c = Completions::new(Wakeup::new().expect("eventfd"));
        c.begin();
        c.begin();
        assert_eq!(c.away(), 2);
        let other = c.clone();
        std::thread::spawn(move || other.end(7, 4096))
            .join()
            .unwrap();
        assert_eq!(c.away(), 1);
        // A completion of work that was not begun here counts for nothing.
        c.push(9, 0);
        assert_eq!(c.away(), 1);
        let mut got = Vec::new();
        c.take(&mut got);
        assert_eq!(got, vec![(7, 4096), (9, 0)]);
        c.end(8, -5);
        assert_eq!(c.away(), 0);
    }
}
