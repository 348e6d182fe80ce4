//! Completions of operations that end off the poller's ring (librbd's
//! callbacks, the offload thread's jobs), handed back to the poller.

use rdmablk_common::ring::Wakeup;
use std::sync::{Arc, Mutex};

/// Completions of backend operations that do not run on the poller's
/// ring (librbd's): the thread that finishes one records it here and, for
/// the first of a batch, wakes the poller through the eventfd its ring
/// polls. The poller dispatches them like ring completions.
pub struct Completions {
    done: Mutex<Vec<(u64, i32)>>,
    wakeup: Wakeup,
}

impl Completions {
    /// Completions that wake the poller polling `wakeup`.
    pub fn new(wakeup: Wakeup) -> Arc<Completions> {
        Arc::new(Completions {
            done: Mutex::new(Vec::new()),
            wakeup,
        })
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
