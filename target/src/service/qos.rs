//! QoS limits on the I/O path: how long an I/O command waits before it
//! starts so that a namespace (all its hosts together) or one host on it
//! stays within its commands and bytes per second.
//!
//! Each limit is one shared virtual clock (the generic cell rate
//! algorithm): the time at which its budget is next free, in nanoseconds.
//! A command advances the clocks of the limits it falls under by its cost
//! (one command, or its bytes, at the limit's rate) with one
//! compare-and-swap each, and may start once every clock it found, less
//! [`TOLERANCE`], has passed. No lock, and nothing per poller to lose or
//! overshoot: the rate holds exactly over any window longer than the
//! tolerance, however many pollers share the limit, and a limit's cache
//! line is touched only by the commands it limits. Namespaces without
//! limits never get here.

use crate::base::clock;
use crate::config::{QosClass, QosKey, QosLimits};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How far a command may start ahead of its clock: a burst after an idle
/// spell, and the slack for a poller that wakes late, without losing the
/// budget of the time it overslept.
pub const TOLERANCE: Duration = Duration::from_millis(5);

/// One limit's clock, on a cache line of its own.
#[repr(align(64))]
struct Clock {
    /// Units per second.
    rate: u64,
    /// When its budget is next free (ns from the epoch).
    free_at: AtomicU64,
}

impl Clock {
    /// Takes `units` of the budget; returns the clock as found.
    fn take(&self, units: u64, now: u64) -> u64 {
        let cost = (units as u128 * 1_000_000_000 / self.rate as u128) as u64;
        let mut found = self.free_at.load(Ordering::Relaxed);
        loop {
            let next = found.max(now).saturating_add(cost);
            match self.free_at.compare_exchange_weak(
                found,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return found,
                Err(f) => found = f,
            }
        }
    }
}

/// A set of limits (a namespace's, or one host's on a namespace).
pub struct Limiter {
    limits: QosLimits,
    clocks: [Option<Clock>; 6],
    /// Replaced by other limits: commands waiting under it go now.
    retired: AtomicBool,
}

impl Limiter {
    /// Limits `limits`; `None` when there is none.
    pub fn new(limits: QosLimits) -> Option<Arc<Limiter>> {
        (!limits.is_empty()).then(|| {
            // Clocks count from here on: before any command's time.
            clock::start();
            Arc::new(Limiter {
                limits,
                clocks: QosKey::ALL.map(|k| {
                    limits.get(k).map(|rate| Clock {
                        rate,
                        free_at: AtomicU64::new(0),
                    })
                }),
                retired: AtomicBool::new(false),
            })
        })
    }

    /// Its limits.
    pub fn limits(&self) -> QosLimits {
        self.limits
    }

    /// Marks it replaced.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Takes a command's cost from every limit it falls under; returns the
    /// latest clock found.
    fn take(&self, class: QosClass, bytes: u64, now: u64) -> u64 {
        let mut latest = 0;
        for k in QosKey::ALL.into_iter().filter(|k| k.applies_to(class)) {
            if let Some(c) = &self.clocks[k as usize] {
                let units = if k.is_bandwidth() { bytes } else { 1 };
                if units > 0 {
                    latest = latest.max(c.take(units, now));
                }
            }
        }
        latest
    }
}

/// The limits one host's commands on one namespace fall under.
#[derive(Clone)]
pub struct Throttle {
    pub namespace: Option<Arc<Limiter>>,
    pub host: Option<Arc<Limiter>>,
}

impl Throttle {
    /// The throttle of these limiters; `None` when neither limits.
    pub fn of(namespace: Option<Arc<Limiter>>, host: Option<Arc<Limiter>>) -> Option<Throttle> {
        (namespace.is_some() || host.is_some()).then_some(Throttle { namespace, host })
    }

    fn limiters(&self) -> impl Iterator<Item = &Arc<Limiter>> {
        self.namespace.iter().chain(&self.host)
    }

    /// Takes the cost of a command of `class` moving `bytes` arriving at
    /// `now`; returns when it may start, if later than `now`.
    pub fn admit(&self, class: QosClass, bytes: u64, now: Instant) -> Option<Instant> {
        let t = clock::nanos(now);
        let found = self
            .limiters()
            .map(|l| l.take(class, bytes, t))
            .max()
            .unwrap_or(0);
        let start = found.saturating_sub(TOLERANCE.as_nanos() as u64);
        (start > t).then(|| clock::instant(start))
    }

    /// Whether one of its limiters was replaced (a reload, `qos set`).
    pub fn retired(&self) -> bool {
        self.limiters().any(|l| l.retired.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(pairs: &[(QosKey, u64)]) -> QosLimits {
        let mut l = QosLimits::default();
        for &(k, v) in pairs {
            l.set(k, Some(v));
        }
        l
    }

    /// Commands admitted in a burst are spaced at the rate: the n-th of a
    /// 1,000 IOPS limit may start n ms after the first, less the tolerance.
    #[test]
    fn a_burst_is_spaced_at_the_rate() {
        let t =
            Throttle::of(Limiter::new(limits(&[(QosKey::ReadIops, 1000)])), None).expect("a limit");
        let now = Instant::now();
        let starts: Vec<Option<Instant>> = (0..20)
            .map(|_| t.admit(QosClass::Read, 4096, now))
            .collect();
        // Within the tolerance (5 ms) they go at once.
        assert!(starts[..6].iter().all(Option::is_none));
        for (n, s) in starts.iter().enumerate().skip(6) {
            let wait = s.expect("held").duration_since(now);
            assert_eq!(
                wait,
                Duration::from_millis(n as u64) - TOLERANCE,
                "command {n}"
            );
        }
        // Writes do not fall under a read limit.
        assert!(t.admit(QosClass::Write, 4096, now).is_none());
    }

    /// A bandwidth limit charges bytes; both limiters count and the later
    /// clock decides.
    #[test]
    fn bytes_and_both_limiters() {
        let ns = Limiter::new(limits(&[(QosKey::Bandwidth, 1 << 20)]));
        let host = Limiter::new(limits(&[(QosKey::WriteIops, 10)]));
        let t = Throttle::of(ns, host).expect("limits");
        let now = Instant::now();
        assert!(t.admit(QosClass::Write, 4096, now).is_none());
        // 4 KiB taken at 1 MiB/s (3.9 ms) and one write at 10/s (100 ms):
        // the write clock is the later.
        let s = t.admit(QosClass::Write, 4096, now).expect("held");
        assert_eq!(
            s.duration_since(now),
            Duration::from_millis(100) - TOLERANCE
        );
        // Reads fall under the bandwidth only: 8 KiB taken, 7.8 ms.
        let s = t.admit(QosClass::Read, 4096, now).expect("held");
        assert_eq!(
            s.duration_since(now),
            Duration::from_nanos(7_812_500) - TOLERANCE
        );
    }

    /// Idle time does not accumulate credit beyond the tolerance.
    #[test]
    fn idle_time_is_not_saved_up() {
        let t = Throttle::of(Limiter::new(limits(&[(QosKey::Iops, 100)])), None).expect("limit");
        let now = Instant::now();
        assert!(t.admit(QosClass::Read, 0, now).is_none());
        let later = now + Duration::from_secs(10);
        assert!(t.admit(QosClass::Read, 0, later).is_none());
        assert!(t.admit(QosClass::Read, 0, later).is_some());
    }

    #[test]
    fn no_limit_no_throttle() {
        assert!(Throttle::of(Limiter::new(QosLimits::default()), None).is_none());
    }
}
