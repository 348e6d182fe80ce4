//! Which hosts each gateway of the group reaches, and the handover that
//! follows from it. A gateway cut off from some hosts (or all of them) but
//! not from the cluster keeps renewing its leases: without more, those
//! hosts' I/O on its groups would wait for the partition to heal while
//! other gateways they reach stand by. So each heartbeat carries the hosts
//! with a live controller and an I/O queue on its gateway (the host's
//! keep-alive on a path it lost expires within KATO), and an owner remembers the hosts it lost
//! (for [`LOST_FOR`]). It hands its groups to a live gateway that has
//! reached, for a whole lease, every host it serves and one it lost: no
//! host loses the group, and a host that never had a path here (one path
//! only, by choice) moves nothing. A gateway that takes a group from a
//! dead or cut-off owner counts the hosts that owner served and it does
//! not reach as lost too.
//! Failback follows the same care: the preferred gateway gets its groups
//! back once it reaches again every host the owner serves or lost that it
//! reached before (a host still reconnecting to it, or one that gave that
//! path up, would lose the group; one that never had a path there, by
//! choice, holds nothing back).

use super::{Group, State};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// How long a host lost by this gateway counts as lost: past it, a host
/// that never came back is one that left.
pub(super) const LOST_FOR: Duration = Duration::from_secs(600);

/// Records this gateway's hosts now, and which it lost (had, and has not).
pub(super) fn follow_own(st: &mut State, hosts: BTreeSet<String>) {
    let now = Instant::now();
    for gone in st.hosts.difference(&hosts) {
        st.lost.insert(gone.clone(), now);
    }
    st.lost
        .retain(|h, since| !hosts.contains(h) && since.elapsed() < LOST_FOR);
    st.hosts = hosts;
}

/// A group taken from gateway `previous` (dead or cut off, not handing it
/// over): the hosts its last heartbeat named that this gateway does not
/// reach count as lost here. They used the group through it; a gateway
/// that reaches them (and every host here) gets the group after a lease,
/// as when this gateway lost them itself. A preferred gateway that just
/// started, which no host reached again yet, would otherwise keep a group
/// that its hosts cannot use.
pub(super) fn inherit_hosts(st: &mut State, previous: &str) {
    let now = Instant::now();
    let Some((theirs, _)) = st.reach.get(previous) else {
        return;
    };
    let missing: Vec<String> = theirs.difference(&st.hosts).cloned().collect();
    for h in missing {
        st.lost.entry(h).or_insert(now);
    }
}

/// A heartbeat's value: the counter, then the hosts, one per line.
pub(super) fn beat(counter: u64, hosts: &BTreeSet<String>) -> Vec<u8> {
    let mut text = counter.to_string();
    for h in hosts {
        text.push('\n');
        text.push_str(h);
    }
    text.into_bytes()
}

/// Records gateway `peer`'s hosts (from its heartbeat), and since when it
/// has reached every host of this gateway and one it lost.
pub(super) fn follow_reach(st: &mut State, peer: &str, theirs: BTreeSet<String>) {
    let now = Instant::now();
    let reached = st.reached.entry(peer.to_string()).or_default();
    reached.retain(|_, seen| seen.elapsed() < LOST_FOR);
    reached.extend(theirs.iter().map(|h| (h.clone(), now)));
    let more = theirs.is_superset(&st.hosts) && st.lost.keys().any(|h| theirs.contains(h));
    let e = st.reach.entry(peer.to_string()).or_default();
    e.0 = theirs;
    e.1 = if more {
        e.1.or(Some(Instant::now()))
    } else {
        None
    };
}

/// Whether gateway `peer`'s last heartbeat named every host with a live
/// controller here, or lost here, that its heartbeats named before (within
/// [`LOST_FOR`]). A host this gateway lost counts: an owner cut off from
/// its hosts serves none, and handing its groups back to a gateway those
/// hosts do not reach either would strand them.
pub(super) fn reaches_again_our_hosts(st: &State, peer: &str) -> bool {
    let Some((theirs, _)) = st.reach.get(peer) else {
        return false;
    };
    let before = st.reached.get(peer);
    st.hosts
        .iter()
        .chain(st.lost.keys())
        .all(|h| theirs.contains(h) || !before.is_some_and(|b| b.contains_key(h)))
}

/// The hosts a heartbeat names (none in a bare counter).
pub(super) fn hosts_of(beat: &[u8]) -> BTreeSet<String> {
    String::from_utf8_lossy(beat)
        .lines()
        .skip(1)
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .collect()
}

impl Group {
    /// The hosts with a live controller on this gateway's NVM subsystems
    /// now (the discovery subsystem is not one of them) that has an I/O
    /// queue. A controller with its admin queue alone uses no namespace: a
    /// tool that reads the ANA log and leaves is not a host lost when it
    /// goes (counted, it would hold a failback back for LOST_FOR).
    pub(super) fn hosts_here(&self) -> BTreeSet<String> {
        let Some(registry) = self.registry.upgrade() else {
            return BTreeSet::new();
        };
        registry
            .subsystems()
            .iter()
            .flat_map(|s| s.live_controllers())
            .filter(|c| c.is_live() && c.queues_connected() > 1)
            .map(|c| c.hostnqn.clone())
            .collect()
    }

    /// A live gateway that has reached every host of this gateway and one
    /// it lost for a whole lease, and been alive without a break meanwhile
    /// (a gateway that just started again is judged on its new hosts):
    /// `preferred` if it is one, else the one reaching most (then by name).
    pub(super) fn gateway_reaching_more(&self, preferred: Option<&String>) -> Option<String> {
        let lease = self.cfg.lease;
        let reaching: Vec<(String, usize, Instant)> = {
            let st = self.lock();
            st.reach
                .iter()
                .filter_map(|(gw, (hosts, since))| Some((gw.clone(), hosts.len(), (*since)?)))
                .collect()
        };
        let live: Vec<(String, usize)> = reaching
            .into_iter()
            .filter(|(gw, _, since)| {
                self.alive_since(gw)
                    .is_some_and(|alive| alive.max(*since).elapsed() >= lease)
            })
            .map(|(gw, n, _)| (gw, n))
            .collect();
        if let Some(p) = preferred.filter(|p| live.iter().any(|(gw, _)| gw == *p)) {
            return Some(p.clone());
        }
        live.into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            .map(|(gw, _)| gw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(hosts: &[&str]) -> BTreeSet<String> {
        hosts.iter().map(|h| h.to_string()).collect()
    }

    /// A state where gateway `gw-a` named `before` in earlier heartbeats
    /// and `now` in its last.
    fn reaching(before: &[&str], now: &[&str]) -> State {
        let mut st = State::default();
        let seen = before.iter().map(|h| (h.to_string(), Instant::now()));
        st.reached.insert("gw-a".into(), seen.collect());
        st.reach.insert("gw-a".into(), (set(now), None));
        st
    }

    #[test]
    fn failback_waits_for_a_host_the_owner_lost_that_the_preferred_had() {
        // The owner lost host h (cut off from it): it serves nobody.
        let mut st = reaching(&["h"], &[]);
        st.lost.insert("h".into(), Instant::now());
        assert!(
            !reaches_again_our_hosts(&st, "gw-a"),
            "h would lose the group"
        );
        st.reach.insert("gw-a".into(), (set(&["h"]), None));
        assert!(reaches_again_our_hosts(&st, "gw-a"), "h is back there");
    }

    #[test]
    fn a_host_that_never_had_a_path_to_the_preferred_holds_nothing_back() {
        let mut st = reaching(&["h"], &["h"]);
        st.hosts = set(&["h", "one-path"]);
        st.lost.insert("one-path-lost".into(), Instant::now());
        assert!(reaches_again_our_hosts(&st, "gw-a"));
        assert!(!reaches_again_our_hosts(&st, "gw-b"), "no heartbeat seen");
    }

    #[test]
    fn a_group_taken_from_a_dead_owner_counts_its_hosts_not_reached_here_as_lost() {
        let mut st = reaching(&[], &["h", "k"]);
        st.hosts = set(&["k"]);
        inherit_hosts(&mut st, "gw-a");
        assert_eq!(
            st.lost.keys().cloned().collect::<BTreeSet<_>>(),
            set(&["h"])
        );
        inherit_hosts(&mut st, "gw-unknown");
        assert_eq!(st.lost.len(), 1, "nothing known of that one");
        // Once h has a controller here, it is no longer lost.
        follow_own(&mut st, set(&["h", "k"]));
        assert!(st.lost.is_empty());
    }

    #[test]
    fn a_heartbeat_carries_its_hosts() {
        let hosts: BTreeSet<String> = ["nqn.a", "nqn.b"].map(String::from).into();
        let b = beat(41, &hosts);
        assert_eq!(b, b"41\nnqn.a\nnqn.b");
        assert_eq!(hosts_of(&b), hosts);
        assert!(hosts_of(b"41").is_empty(), "a bare counter names no host");
        assert!(hosts_of(&beat(7, &BTreeSet::new())).is_empty());
    }
}
