//! What hosts may hold daemon-wide: connected queues, connections still
//! waiting for their Connect, and associations per host NQN. Each unit is a
//! [`Permit`] that gives itself back when dropped, so no exit path can leak
//! one; refusals are logged at most once per second.

use crate::config::Limits;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A count shared by threads, with a limit checked when it grows.
#[derive(Debug, Default)]
pub struct Gauge(AtomicUsize);

impl Gauge {
    /// The current count.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }

    /// Adds `n` unless the count would exceed `limit`; whether it did.
    pub fn try_add(&self, n: usize, limit: usize) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                c.checked_add(n).filter(|&v| v <= limit)
            })
            .is_ok()
    }

    /// Adds `n` whatever the limit (what is already held, moving in).
    pub fn add(&self, n: usize) {
        self.0.fetch_add(n, Ordering::AcqRel);
    }

    /// Gives `n` back.
    pub fn sub(&self, n: usize) {
        let before = self.0.fetch_sub(n, Ordering::AcqRel);
        debug_assert!(before >= n, "gauge below zero");
    }

    /// One unit, if fewer than `limit` are taken.
    pub fn take(self: &Arc<Self>, limit: usize) -> Option<Permit> {
        self.try_add(1, limit).then(|| Permit(self.clone()))
    }
}

/// One unit of a [`Gauge`], given back on drop.
#[derive(Debug)]
pub struct Permit(Arc<Gauge>);

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.sub(1);
    }
}

/// Lets a message through at most once per second, counting the others.
#[derive(Debug)]
pub struct LogThrottle {
    epoch: Instant,
    /// Milliseconds since `epoch` of the last message let through, plus one
    /// (0: none yet).
    last: AtomicU64,
    suppressed: AtomicU64,
}

impl Default for LogThrottle {
    fn default() -> Self {
        LogThrottle {
            epoch: Instant::now(),
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }
}

impl LogThrottle {
    /// `Some(n)` when a message may be logged now, `n` being how many were
    /// held back since the last one; `None` to stay quiet.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(self.epoch.elapsed().as_millis() as u64 + 1)
    }

    fn allow_at(&self, now: u64) -> Option<u64> {
        let last = self.last.load(Ordering::Acquire);
        if last != 0 && now.saturating_sub(last) < 1000
            || self
                .last
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(self.suppressed.swap(0, Ordering::Relaxed))
    }
}

/// Host NQNs remembered with no association before the map is pruned.
const IDLE_HOSTS: usize = 1024;

/// The daemon-wide counts and their limits.
pub struct Admission {
    pub limits: Limits,
    queues: Arc<Gauge>,
    pending: Arc<Gauge>,
    handshakes: Arc<Gauge>,
    hosts: Mutex<HashMap<String, Arc<Gauge>>>,
    /// Refusals of connections and Connects for lack of resources.
    pub refusals: LogThrottle,
}

impl Admission {
    pub fn new(limits: Limits) -> Admission {
        Admission {
            limits,
            queues: Arc::default(),
            pending: Arc::default(),
            handshakes: Arc::default(),
            hosts: Mutex::default(),
            refusals: LogThrottle::default(),
        }
    }

    /// A new connection, held until its Connect; `None` (logged) when
    /// `pending_connections` are already waiting.
    pub fn pending_connection(&self, peer: &dyn std::fmt::Display) -> Option<Permit> {
        let p = self.pending.take(self.limits.pending_connections);
        self.refused_if_none(
            p,
            peer,
            self.limits.pending_connections,
            "too many connections waiting for their Connect (limits.pending_connections)",
        )
    }

    /// `p`, logging (at most once a second) a refusal of `peer` when it is
    /// none: `limit` reached, `why`.
    fn refused_if_none(
        &self,
        p: Option<Permit>,
        peer: &dyn std::fmt::Display,
        limit: usize,
        why: &str,
    ) -> Option<Permit> {
        if p.is_none() {
            if let Some(more) = self.refusals.allow() {
                tracing::warn!(%peer, limit, suppressed = more, "connection refused: {why}");
            }
        }
        p
    }

    /// A TLS handshake in progress; `None` (logged) when `tls_handshakes`
    /// are already.
    pub fn tls_handshake(&self, peer: &dyn std::fmt::Display) -> Option<Permit> {
        let p = self.handshakes.take(self.limits.tls_handshakes);
        self.refused_if_none(
            p,
            peer,
            self.limits.tls_handshakes,
            "too many TLS handshakes in progress (limits.tls_handshakes)",
        )
    }

    /// A connected queue; `None` when `connections` are connected.
    pub fn queue(&self) -> Option<Permit> {
        self.queues.take(self.limits.connections)
    }

    /// An association of `hostnqn`; `None` when it has `associations_per_host`.
    pub fn association(&self, hostnqn: &str) -> Option<Permit> {
        let mut hosts = self.hosts.lock().expect("hosts lock");
        if hosts.len() >= IDLE_HOSTS && !hosts.contains_key(hostnqn) {
            hosts.retain(|_, g| g.get() > 0);
        }
        hosts
            .entry(hostnqn.to_owned())
            .or_default()
            .take(self.limits.associations_per_host)
    }

    /// Connected queues now (for the stats file).
    pub fn queues_connected(&self) -> usize {
        self.queues.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_stop_at_the_limit_and_come_back_on_drop() {
        let g = Arc::new(Gauge::default());
        let a = g.take(2).unwrap();
        let _b = g.take(2).unwrap();
        assert!(g.take(2).is_none());
        drop(a);
        assert_eq!(g.get(), 1);
        assert!(g.take(2).is_some());
    }

    #[test]
    fn associations_are_counted_per_host() {
        let adm = Admission::new(Limits {
            associations_per_host: 1,
            ..Limits::default()
        });
        let a = adm.association("nqn.a").unwrap();
        assert!(adm.association("nqn.a").is_none());
        let _b = adm.association("nqn.b").unwrap();
        drop(a);
        assert!(adm.association("nqn.a").is_some());
    }

    #[test]
    fn throttle_lets_one_message_a_second_through() {
        let t = LogThrottle::default();
        assert_eq!(t.allow_at(5), Some(0));
        assert_eq!(t.allow_at(600), None);
        assert_eq!(t.allow_at(1004), None);
        assert_eq!(t.allow_at(1005), Some(2));
    }
}
