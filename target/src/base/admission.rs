//! What hosts may hold daemon-wide: connected queues, connections still
//! waiting for their Connect, and associations per host NQN. Each unit is a
//! [`Permit`] that gives itself back when dropped, so no exit path can leak
//! one; refusals are logged at most once per second.
//!
//! Connections that say nothing cannot keep a host that speaks out: when
//! the pending places are full, a new connection takes the place of the
//! oldest one that has stayed [`Silent`] (no ICReq) for longer than
//! [`SILENT_GRACE`] since its accept, which is hung up; only with none is
//! the newcomer refused. However many such connections a flood opens, a
//! host that sends its ICReq promptly gets in.

use crate::config::Limits;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long a new connection may take to speak before a newcomer may push
/// it out of a full set of pending places: a host sends its ICReq at once.
pub const SILENT_GRACE: Duration = Duration::from_millis(100);

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

/// How [`Admission::new_connection`] ends a silent connection (its poller
/// then sees it closed and frees it).
pub type HangUp = Box<dyn FnOnce() + Send>;

/// What a silent connection and the book of them share.
struct SilentState {
    since: Instant,
    hang_up: Mutex<Option<HangUp>>,
}

impl SilentState {
    /// Hangs the connection up, unless it spoke or went meanwhile; whether
    /// it did.
    fn push_out(&self) -> bool {
        let mut armed = self.hang_up.lock().expect("silent lock");
        armed.take().map(|h| h()).is_some()
    }
}

/// The mark of a pending connection that has not spoken yet: a newcomer
/// may push it out (see the module doc). Dropping it (the connection spoke,
/// or went) disarms its hang-up, under the lock the hang-up runs under:
/// drop it before what the hang-up ends (a socket's descriptor).
pub struct Silent(Arc<SilentState>);

impl Drop for Silent {
    fn drop(&mut self) {
        self.0.hang_up.lock().expect("silent lock").take();
    }
}

/// The daemon-wide counts and their limits.
pub struct Admission {
    pub limits: Limits,
    /// `limits.association_buffer` in effect for these pollers' arenas.
    pub association_buffer: u64,
    queues: Arc<Gauge>,
    pending: Arc<Gauge>,
    handshakes: Arc<Gauge>,
    hosts: Mutex<HashMap<String, Arc<Gauge>>>,
    /// Pending connections that have not spoken, in accept order.
    silent: Mutex<VecDeque<Weak<SilentState>>>,
    /// Refusals of connections and Connects for lack of resources.
    pub refusals: LogThrottle,
}

impl Admission {
    /// Admission under `limits`, for pollers whose arenas hold `arenas`
    /// bytes in all.
    pub fn new(limits: Limits, arenas: u64) -> Admission {
        Admission {
            association_buffer: limits.association_buffer(arenas),
            limits,
            queues: Arc::default(),
            pending: Arc::default(),
            handshakes: Arc::default(),
            hosts: Mutex::default(),
            silent: Mutex::default(),
            refusals: LogThrottle::default(),
        }
    }

    /// A place for a new connection until its Connect, and its [`Silent`]
    /// mark, to drop once it speaks; when `pending_connections` are
    /// waiting, the place of the oldest one silent for over
    /// [`SILENT_GRACE`], which is ended with its `hang_up`; `None` (logged)
    /// when none is.
    pub fn new_connection(
        &self,
        peer: &dyn std::fmt::Display,
        hang_up: HangUp,
    ) -> Option<(Permit, Silent)> {
        let limit = self.limits.pending_connections;
        let place = self.pending.take(limit).or_else(|| {
            // The pushed-out connection gives its place back once its
            // poller sees it closed: meanwhile the newcomer's is one over
            // the limit, and the places stay below twice the limit.
            (self.push_out_silent() && self.pending.try_add(1, 2 * limit))
                .then(|| Permit(self.pending.clone()))
        });
        let place = self.refused_if_none(
            place,
            peer,
            limit,
            "too many connections waiting for their Connect, none of them silent \
             (limits.pending_connections)",
        )?;
        let silent = Arc::new(SilentState {
            since: Instant::now(),
            hang_up: Mutex::new(Some(hang_up)),
        });
        let mut book = self.silent.lock().expect("silent lock");
        if book.len() >= 2 * limit {
            book.retain(|w| w.strong_count() > 0);
        }
        book.push_back(Arc::downgrade(&silent));
        Some((place, Silent(silent)))
    }

    /// Hangs up the oldest connection silent for over [`SILENT_GRACE`];
    /// whether there was one.
    fn push_out_silent(&self) -> bool {
        let mut book = self.silent.lock().expect("silent lock");
        let now = Instant::now();
        while let Some(w) = book.front() {
            let Some(s) = w.upgrade() else {
                book.pop_front();
                continue;
            };
            if now.duration_since(s.since) <= SILENT_GRACE {
                return false; // the others came later
            }
            book.pop_front();
            if s.push_out() {
                tracing::debug!("a connection silent since its accept was closed for a new one");
                return true;
            }
        }
        false
    }

    /// A place among connections waiting for their Connect, for one that
    /// already spoke (a Disconnect put it back there); `None` (logged) when
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
        let adm = Admission::new(
            Limits {
                associations_per_host: 1,
                ..Limits::default()
            },
            64 << 20,
        );
        let a = adm.association("nqn.a").unwrap();
        assert!(adm.association("nqn.a").is_none());
        let _b = adm.association("nqn.b").unwrap();
        drop(a);
        assert!(adm.association("nqn.a").is_some());
    }

    /// A hang-up that counts itself.
    fn counting(n: &Arc<AtomicUsize>) -> HangUp {
        let n = n.clone();
        Box::new(move || {
            n.fetch_add(1, Ordering::SeqCst);
        })
    }

    #[test]
    fn a_new_connection_pushes_out_the_oldest_silent_one_past_its_grace() {
        let adm = Admission::new(
            Limits {
                pending_connections: 2,
                ..Limits::default()
            },
            64 << 20,
        );
        let hung = Arc::new(AtomicUsize::new(0));
        let (_a, a_silent) = adm.new_connection(&"a", counting(&hung)).unwrap();
        let (_b, b_silent) = adm.new_connection(&"b", counting(&hung)).unwrap();
        assert!(
            adm.new_connection(&"c", counting(&hung)).is_none(),
            "within their grace, the silent keep their places"
        );
        std::thread::sleep(SILENT_GRACE + Duration::from_millis(20));
        drop(a_silent); // a spoke: it keeps its place
        let c = adm.new_connection(&"c", counting(&hung));
        assert!(c.is_some(), "b, silent past its grace, made room");
        assert_eq!(hung.load(Ordering::SeqCst), 1, "b was hung up, once");
        drop(b_silent);
        assert!(
            adm.new_connection(&"d", counting(&hung)).is_none(),
            "c is within its grace and a spoke: nobody to push out"
        );
        assert_eq!(hung.load(Ordering::SeqCst), 1);
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
