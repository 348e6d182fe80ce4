//! Which hosts each gateway of the group reaches, and the handover that
//! follows from it. A gateway cut off from some hosts (or all of them) but
//! not from the cluster keeps renewing its leases: without more, those
//! hosts' I/O on its groups would wait for the partition to heal while
//! other gateways they reach stand by. So each heartbeat carries the hosts
//! with a live controller on its gateway (the host's keep-alive on a path
//! it lost expires within KATO), and an owner remembers the hosts it lost
//! (for [`LOST_FOR`]). It hands its groups to a live gateway that has
//! reached, for a whole lease, every host it serves and one it lost: no
//! host loses the group, and a host that never had a path here (one path
//! only, by choice) moves nothing. Failback follows the same care: the
//! preferred gateway gets its groups back once it reaches again every host
//! the owner serves that it reached before (a host still reconnecting to
//! it, or one that gave that path up, would lose the group; one that never
//! had a path there, by choice, holds nothing back).

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
    /// now (the discovery subsystem is not one of them).
    pub(super) fn hosts_here(&self) -> BTreeSet<String> {
        let Some(registry) = self.registry.upgrade() else {
            return BTreeSet::new();
        };
        registry
            .subsystems()
            .iter()
            .flat_map(|s| s.live_controllers())
            .filter(|c| c.is_live())
            .map(|c| c.hostnqn.clone())
            .collect()
    }

    /// Whether gateway `peer`'s last heartbeat named every host with a live
    /// controller here that its heartbeats named before (within
    /// [`LOST_FOR`]).
    pub(super) fn reaches_again_every_host_here(&self, peer: &str) -> bool {
        let st = self.lock();
        let Some((theirs, _)) = st.reach.get(peer) else {
            return false;
        };
        let before = st.reached.get(peer);
        st.hosts
            .iter()
            .all(|h| theirs.contains(h) || !before.is_some_and(|b| b.contains_key(h)))
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
