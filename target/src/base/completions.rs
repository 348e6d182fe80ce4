//! Completions of operations that end off the poller's ring (librbd's
//! callbacks, the offload thread's jobs), handed back to the poller.

use rdmablk_common::ring::Wakeup;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Completions of backend operations that do not run on the poller's
/// ring (librbd's): the thread that finishes one records it here. A poller
/// at work (or spinning) finds them at its next round; one asleep in its
/// ring is woken through the eventfd the ring polls, once. The poller
/// dispatches them like ring completions.
pub struct Completions {
    done: Mutex<Vec<(u64, i32)>>,
    /// Some were recorded since the last `take`.
    pending: AtomicBool,
    /// The poller sleeps in its ring, or is about to: the next push wakes
    /// it (and clears this).
    asleep: AtomicBool,
    wakeup: Wakeup,
}

impl Completions {
    /// Completions that wake the poller polling `wakeup`.
    pub fn new(wakeup: Wakeup) -> Arc<Completions> {
        Arc::new(Completions {
            done: Mutex::new(Vec::new()),
            pending: AtomicBool::new(false),
            asleep: AtomicBool::new(false),
            wakeup,
        })
    }

    /// Records that the operation with user data `token` ended with `res`
    /// (io_uring's convention: a count or `-errno`).
    pub fn push(&self, token: u64, res: i32) {
        self.done
            .lock()
            .expect("completions lock")
            .push((token, res));
        // SeqCst here and in `may_sleep`: either this sees the poller
        // asleep and wakes it, or the poller sees `pending` and stays up.
        self.pending.store(true, Ordering::SeqCst);
        if self.asleep.swap(false, Ordering::SeqCst) {
            self.wakeup.wake();
        }
    }

    /// Whether completions wait to be taken.
    pub fn pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// The poller is about to sleep in its ring: true when it may (nothing
    /// is pending; a push from now on wakes it), false when a completion
    /// came meanwhile.
    pub fn may_sleep(&self) -> bool {
        self.asleep.store(true, Ordering::SeqCst);
        if self.pending.load(Ordering::SeqCst) {
            self.asleep.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The poller is up again (whatever woke it): pushes need not wake it.
    pub fn awake(&self) {
        self.asleep.store(false, Ordering::SeqCst);
    }

    /// Moves what was recorded into `into` (empty), for the poller.
    pub fn take(&self, into: &mut Vec<(u64, i32)>) {
        // Cleared first: a push that misses this take sets it again.
        self.pending.store(false, Ordering::SeqCst);
        std::mem::swap(&mut *self.done.lock().expect("completions lock"), into);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `w`'s eventfd was written (a poll on it would complete).
    fn woken(w: &Wakeup) -> bool {
        let mut fds = [libc::pollfd {
            fd: std::os::fd::AsRawFd::as_raw_fd(&std::os::fd::AsFd::as_fd(w)),
            events: libc::POLLIN,
            revents: 0,
        }];
        // SAFETY: polls one valid descriptor of ours, without waiting.
        unsafe { libc::poll(fds.as_mut_ptr(), 1, 0) == 1 }
    }

    #[test]
    fn a_poller_at_work_is_not_woken_and_one_asleep_is_woken_once() {
        let w = Wakeup::new().expect("eventfd");
        let c = Completions::new(w.clone());
        c.push(1, 0);
        assert!(
            c.pending() && !woken(&w),
            "at work: found at the next round"
        );
        assert!(!c.may_sleep(), "a completion is pending: no sleep");
        let mut got = Vec::new();
        c.take(&mut got);
        assert_eq!(got, [(1, 0)]);
        assert!(!c.pending());
        assert!(c.may_sleep());
        c.push(2, 0);
        c.push(3, 0);
        assert!(woken(&w), "asleep: woken");
        w.drain();
        c.push(4, 0);
        assert!(!woken(&w), "woken once, not per completion");
        c.awake();
        got.clear();
        c.take(&mut got);
        assert_eq!(got, [(2, 0), (3, 0), (4, 0)]);
    }
}
