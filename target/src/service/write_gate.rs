//! The order of writes on one namespace across pollers, for the two
//! commands that need one: a Compare and Write (no other write to its
//! blocks between its compare and its write) and a Preempt and Abort (every
//! write already on the backend has finished before it completes).
//!
//! A write passes on the fast path, one atomic count on its poller's own
//! cache line, unless an exclusive pass is held or asked for: then writes
//! take the slow path under a lock, where they wait behind exclusive passes
//! whose blocks they overlap. An exclusive pass waits for the fast writes
//! in flight and the overlapping slow ones. Who waits is told through its
//! poller's `Completions`, as a backend operation ends.

use crate::backend::Waker;
use crate::base::completions::Completions;
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// What a command holds while its write (or exclusive work) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    /// A write on the fast path, counted on this poller.
    Fast(usize),
    /// A pass granted under the lock (a write's, or an exclusive one).
    Held(u64),
}

/// The answer to asking for a pass.
#[derive(Debug, PartialEq, Eq)]
pub enum Entry {
    Pass(Pass),
    /// Wait: [`WriteGate::wait`] says whom to tell once it is granted,
    /// as `Pass::Held` of this id.
    Wait(u64),
}

/// A counter alone on its cache line.
#[repr(align(64))]
#[derive(Default)]
struct Padded(AtomicUsize);

#[derive(Debug)]
struct Claim {
    id: u64,
    blocks: Range<u64>,
    exclusive: bool,
}

impl Claim {
    fn conflicts(&self, blocks: &Range<u64>, exclusive: bool) -> bool {
        (self.exclusive || exclusive)
            && self.blocks.start < blocks.end
            && blocks.start < self.blocks.end
    }
}

#[derive(Default)]
struct Slow {
    held: Vec<Claim>,
    /// Claims waiting, in arrival order, and whom to tell.
    waiting: VecDeque<(Claim, Option<Waker>)>,
    /// Granted before anyone waited for them: told at once by `wait`.
    early: Vec<u64>,
    next: u64,
}

/// A namespace's write gate.
pub struct WriteGate {
    /// Exclusive passes held or waited for: writes take the slow path.
    exclusive: AtomicU32,
    fast: Box<[Padded]>,
    slow: Mutex<Slow>,
}

impl WriteGate {
    /// A gate for writes from `pollers` pollers.
    pub fn new(pollers: usize) -> WriteGate {
        WriteGate {
            exclusive: AtomicU32::new(0),
            fast: (0..pollers.max(1)).map(|_| Padded::default()).collect(),
            slow: Mutex::new(Slow::default()),
        }
    }

    fn fast_writes(&self) -> usize {
        self.fast.iter().map(|c| c.0.load(SeqCst)).sum()
    }

    /// A pass for a write of `blocks` from poller `poller`.
    #[inline]
    pub fn enter_write(&self, poller: usize, blocks: Range<u64>) -> Entry {
        let count = &self.fast[poller].0;
        // Either this write sees the exclusive pass asked for, or the one
        // asking sees this write counted (both sequentially consistent).
        count.fetch_add(1, SeqCst);
        if self.exclusive.load(SeqCst) == 0 {
            return Entry::Pass(Pass::Fast(poller));
        }
        count.fetch_sub(1, SeqCst);
        let mut s = self.slow.lock().expect("write gate");
        let entry = self.claim(&mut s, blocks, false);
        // An exclusive pass may have waited for the count just taken back.
        self.grant(&mut s);
        entry
    }

    /// An exclusive pass for `blocks`: no other write to them runs while
    /// it is held, and none that started before it is still running.
    pub fn enter_exclusive(&self, blocks: Range<u64>) -> Entry {
        let mut s = self.slow.lock().expect("write gate");
        self.exclusive.fetch_add(1, SeqCst);
        self.claim(&mut s, blocks, true)
    }

    fn claim(&self, s: &mut Slow, blocks: Range<u64>, exclusive: bool) -> Entry {
        s.next += 1;
        let claim = Claim {
            id: s.next,
            blocks,
            exclusive,
        };
        if self.grantable(s, &claim, s.waiting.len()) {
            let id = claim.id;
            s.held.push(claim);
            Entry::Pass(Pass::Held(id))
        } else {
            let id = claim.id;
            s.waiting.push_back((claim, None));
            Entry::Wait(id)
        }
    }

    /// Whether `c` may be granted now, before the first `ahead` waiters
    /// (which keep their turn over the blocks they overlap).
    fn grantable(&self, s: &Slow, c: &Claim, ahead: usize) -> bool {
        !s.held.iter().any(|h| h.conflicts(&c.blocks, c.exclusive))
            && !s
                .waiting
                .iter()
                .take(ahead)
                .any(|(w, _)| w.conflicts(&c.blocks, c.exclusive))
            && (!c.exclusive || self.fast_writes() == 0)
    }

    /// Grants what waits and may go now, in order, telling each.
    fn grant(&self, s: &mut Slow) {
        let mut i = 0;
        while i < s.waiting.len() {
            if !self.grantable(s, &s.waiting[i].0, i) {
                i += 1;
                continue;
            }
            let (claim, wake) = s.waiting.remove(i).expect("in range");
            match wake {
                Some((completions, token)) => completions.push(token, 0),
                None => s.early.push(claim.id),
            }
            s.held.push(claim);
        }
    }

    /// Tells the poller of `completions` (with `token`) once the pass `id`
    /// is granted: now, if it already is.
    pub fn wait(&self, id: u64, token: u64, completions: &Arc<Completions>) {
        let mut s = self.slow.lock().expect("write gate");
        if let Some(i) = s.early.iter().position(|&e| e == id) {
            s.early.swap_remove(i);
            drop(s);
            completions.push(token, 0);
            return;
        }
        if let Some((_, wake)) = s.waiting.iter_mut().find(|(c, _)| c.id == id) {
            *wake = Some((completions.clone(), token));
        }
    }

    /// Gives a pass back (or a wait given up: it then never comes).
    pub fn leave(&self, pass: Pass) {
        match pass {
            Pass::Fast(poller) => {
                self.fast[poller].0.fetch_sub(1, SeqCst);
                if self.exclusive.load(SeqCst) != 0 {
                    let mut s = self.slow.lock().expect("write gate");
                    self.grant(&mut s);
                }
            }
            Pass::Held(id) => {
                let mut s = self.slow.lock().expect("write gate");
                let gone = match s.held.iter().position(|c| c.id == id) {
                    Some(i) => Some(s.held.swap_remove(i)),
                    None => s
                        .waiting
                        .iter()
                        .position(|(c, _)| c.id == id)
                        .and_then(|i| s.waiting.remove(i))
                        .map(|(c, _)| c),
                };
                s.early.retain(|&e| e != id);
                if gone.is_some_and(|c| c.exclusive) {
                    self.exclusive.fetch_sub(1, SeqCst);
                }
                self.grant(&mut s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdmablk_common::ring::Wakeup;

    fn completions() -> Arc<Completions> {
        Completions::new(Wakeup::new().expect("eventfd"))
    }

    fn told(c: &Completions) -> Vec<u64> {
        let mut v = Vec::new();
        c.take(&mut v);
        v.into_iter().map(|(t, _)| t).collect()
    }

    #[test]
    fn writes_pass_fast_while_nothing_is_exclusive() {
        let g = WriteGate::new(2);
        assert_eq!(g.enter_write(1, 0..8), Entry::Pass(Pass::Fast(1)));
        g.leave(Pass::Fast(1));
        assert_eq!(g.fast_writes(), 0);
    }

    /// An exclusive pass waits for the fast writes in flight; writes that
    /// overlap it wait for it; others go on.
    #[test]
    fn exclusive_waits_for_fast_writes_and_holds_off_overlapping_ones() {
        let (g, c) = (WriteGate::new(2), completions());
        let w = g.enter_write(0, 0..8);
        let Entry::Wait(x) = g.enter_exclusive(0..1) else {
            panic!("a fast write is in flight")
        };
        g.wait(x, 100, &c);
        let Entry::Pass(other) = g.enter_write(1, 16..24) else {
            panic!("a write elsewhere does not wait")
        };
        let Entry::Wait(y) = g.enter_write(1, 0..4) else {
            panic!("an overlapping write waits")
        };
        g.wait(y, 101, &c);
        assert!(told(&c).is_empty());
        let Entry::Pass(w) = w else { panic!() };
        g.leave(w);
        assert_eq!(
            told(&c),
            [100],
            "the exclusive pass, once the fast write ended"
        );
        g.leave(other);
        g.leave(Pass::Held(x));
        assert_eq!(told(&c), [101]);
        g.leave(Pass::Held(y));
        assert_eq!(g.enter_write(0, 0..8), Entry::Pass(Pass::Fast(0)));
    }

    /// Exclusive passes over the same blocks take turns in order.
    #[test]
    fn exclusive_passes_take_turns() {
        let (g, c) = (WriteGate::new(1), completions());
        let Entry::Pass(a) = g.enter_exclusive(0..8) else {
            panic!()
        };
        let Entry::Wait(b) = g.enter_exclusive(4..5) else {
            panic!()
        };
        assert!(
            matches!(g.enter_exclusive(8..9), Entry::Pass(_)),
            "disjoint"
        );
        g.leave(a);
        g.wait(b, 7, &c);
        assert_eq!(told(&c), [7], "granted before its waker came: told at once");
    }
}
