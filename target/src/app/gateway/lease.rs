//! One ANA group's lease: keeping it, taking it (fencing the previous
//! owner unless it handed the group over), handing it back, and what the
//! lease object says of its owner.

use super::{fence, hosts, records, Group, LOCK, OWNER_ATTR};

/// The lease object's state once its owner stopped: any gateway may take
/// the group, the preferred one first.
const HANDED_OVER: &str = "handed-over";
/// The state's prefix when the owner gave the group to one gateway, named
/// after it (failback, or a gateway reaching hosts the owner lost).
const HANDED_TO: &str = "handed-to=";
/// For how many leases a gateway that let a lease lapse (its commands in
/// flight did not end) stays out of that group: time for another gateway
/// to take it, fencing this one.
const LAPSE_FOR: u32 = 2;
use crate::backend::rbd::Pool;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

impl Group {
    pub(super) fn object(&self, group: u32) -> String {
        format!("rdmablk.gwgroup.{}.ana.{group}", self.cfg.name)
    }

    /// Keeps, takes or hands back ANA group `g` every round; hands it over
    /// when the daemon stops. Ends with the connection when it was `fenced`.
    pub(super) fn keep_group(&self, pool: &Pool, g: u32, fenced: &AtomicBool) {
        let round = self.cfg.lease / 3;
        while !self.stopping.load(Ordering::Acquire) {
            if fenced.load(Ordering::Acquire) {
                let owned = self.lock().owned.remove(&g).is_some();
                self.enforce();
                if owned {
                    self.end_associations_in_flight(&[g]);
                }
                return;
            }
            let started = Instant::now();
            let addresses = self.lock().addresses.clone();
            self.keep(pool, g, &addresses);
            // A standby looks twice as often: a lapsed lease is taken
            // within half a round.
            let owned = self.lock().owned.contains_key(&g);
            let round = if owned { round } else { round / 2 };
            self.pause(round.saturating_sub(started.elapsed()));
        }
        if self.lock().owned.contains_key(&g) {
            let addresses = self.lock().addresses.clone();
            self.hand_back(pool, g, &addresses);
        }
    }

    /// Keeps, takes or hands back ANA group `g`.
    fn keep(&self, pool: &Pool, g: u32, addresses: &str) {
        let oid = self.object(g);
        let me = &self.cfg.gateway;
        let preferred = self.cfg.preferred.get(&g);
        let owned = self.lock().owned.contains_key(&g);
        let started = Instant::now();
        if owned {
            // Back to the preferred gateway once it has been alive for the
            // failback delay and reaches again the hosts served (or lost)
            // here that it reached before: a host without a path there yet
            // (it reconnects with a backoff) or any more (it gave the path
            // up, or a partition cut it) would lose the group.
            if let Some(p) = preferred.filter(|p| *p != me) {
                let back = self.alive_since(p);
                if back.is_some_and(|t| t.elapsed() >= self.cfg.failback_delay)
                    && hosts::reaches_again_our_hosts(&self.lock(), p)
                {
                    self.hand_over(pool, g, p, &format!("handed back to {p}"), addresses);
                    return;
                }
            }
            if let Some(p) = self.gateway_reaching_more(preferred) {
                let what = format!("handed over to {p}, which reaches hosts this gateway lost");
                self.hand_over(pool, g, &p, &what, addresses);
                return;
            }
            match pool.lock_exclusive(&oid, LOCK, me, me, self.cfg.lease, true) {
                Ok(()) => {
                    let republish =
                        self.lock().published.get(&g).map(String::as_str) != Some(addresses);
                    if republish {
                        let _ = self.publish(pool, g, "held", addresses);
                    }
                    self.lock().owned.insert(g, started);
                    self.enforce();
                }
                Err(e) => {
                    tracing::error!(group = %self.cfg.name, "ANA group {g}: lease lost ({e}); inaccessible here");
                    self.lock().owned.remove(&g);
                    self.enforce();
                    self.end_associations_in_flight(&[g]);
                }
            }
            return;
        }
        if self.leaving.load(Ordering::Acquire) || self.lets_lapse(g) {
            return;
        }
        // Not ours: the preferred gateway tries at once; the others (after
        // a lease of watching) once it looks dead, or once the holder, any
        // gateway, stopped renewing: a lease that lapsed while "held" is a
        // dead or hung owner, where one "handed-over" is the preferred
        // gateway's to take, and one "handed-to=GW" is GW's while it lives.
        let owner = pool
            .get_attr(&oid, OWNER_ATTR)
            .ok()
            .flatten()
            .map(|o| String::from_utf8_lossy(&o).into_owned())
            .unwrap_or_default();
        let mut words = owner.split(' ');
        let (name, state) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        if !name.is_empty() {
            self.lock().owners.insert(g, name.to_string());
        }
        // A group handed to a live gateway is that gateway's to take.
        let handed_to = state.strip_prefix(HANDED_TO);
        let may_try = match preferred {
            _ if handed_to == Some(me.as_str()) => true,
            _ if handed_to.is_some_and(|to| self.alive_since(to).is_some()) => false,
            None => true,
            Some(p) if p == me => true,
            Some(p) => {
                let watched = self
                    .lock()
                    .since
                    .is_some_and(|s| s.elapsed() > self.cfg.lease);
                watched && (state == "held" || self.alive_since(p).is_none())
            }
        };
        if may_try
            && pool
                .lock_exclusive(&oid, LOCK, me, me, self.cfg.lease, false)
                .is_ok()
        {
            self.take(pool, g, &oid, started, addresses);
        }
    }

    /// Whether this gateway let group `g`'s lease lapse less than
    /// [`LAPSE_FOR`] leases ago, its commands in flight not ending: another
    /// gateway is to take the group, and fence this one.
    fn lets_lapse(&self, g: u32) -> bool {
        let mut st = self.lock();
        match st.lapsing.get(&g) {
            Some(t) if t.elapsed() < self.cfg.lease * LAPSE_FOR => true,
            Some(_) => {
                st.lapsing.remove(&g);
                false
            }
            None => false,
        }
    }

    /// Group `g`'s lease was just taken: fences its previous owner unless it
    /// handed the group over, publishes this gateway, reports it optimized.
    fn take(&self, pool: &Pool, g: u32, oid: &str, started: Instant, addresses: &str) {
        let previous = pool.get_attr(oid, OWNER_ATTR).ok().flatten();
        let previous = previous.map(|p| String::from_utf8_lossy(&p).into_owned());
        let mut words = previous.as_deref().unwrap_or_default().splitn(3, ' ');
        let (owner, state) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        // Every client the previous owner published that is not one of this
        // gateway's own (an earlier process under the same name is fenced
        // too: it may be frozen, not dead).
        let clients = fence::others(words.next().unwrap_or(""), addresses);
        let handed = state == HANDED_OVER || state.starts_with(HANDED_TO);
        if !handed && !clients.is_empty() {
            let results = fence::blocklist_all(pool.cluster(), &clients);
            for (a, r) in clients.iter().zip(results) {
                if let Err(e) = r {
                    // Without the fence the group is not served: the lease
                    // lapses and another round tries again.
                    tracing::error!(group = %self.cfg.name, "ANA group {g}: cannot fence {owner}'s client {a}: {e}");
                    let _ = pool.unlock(oid, LOCK, &self.cfg.gateway);
                    return;
                }
                self.fenced.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(group = %self.cfg.name, "ANA group {g}: fenced {owner}'s client {a} (blocklisted)");
            }
            self.failovers.fetch_add(1, Ordering::Relaxed);
        }
        // The reservations as the previous owner left them.
        if let Some(Err(e)) = self.registry.upgrade().map(|r| records::refresh(&r, g)) {
            tracing::error!(group = %self.cfg.name, "ANA group {g}: cannot read its shared reservations: {e}");
            let _ = pool.unlock(oid, LOCK, &self.cfg.gateway);
            return;
        }
        if let Err(e) = self.publish(pool, g, "held", addresses) {
            tracing::error!(group = %self.cfg.name, "ANA group {g}: cannot publish this gateway: {e}");
            let _ = pool.unlock(oid, LOCK, &self.cfg.gateway);
            return;
        }
        let from = if owner.is_empty() { "nobody" } else { owner };
        tracing::info!(group = %self.cfg.name, "ANA group {g}: owned by this gateway (from {from}); optimized here");
        let mut st = self.lock();
        if !handed && !owner.is_empty() && owner != self.cfg.gateway {
            // Taken from a dead or cut-off owner: its hosts are this
            // gateway's to serve. (One that handed the group over chose
            // this gateway for the hosts it reaches.)
            hosts::inherit_hosts(&mut st, owner);
        }
        st.owned.insert(g, started);
        st.owners.insert(g, self.cfg.gateway.clone());
        drop(st);
        self.enforce();
    }

    /// Gives group `g` over to gateway `to` (`what` happened, for the log):
    /// inaccessible here, the lease object marked handed to it, unlocked.
    /// It takes the group without fencing this gateway.
    ///
    /// Commands that passed the ANA check before then may still be on their
    /// way to the cluster, and `to` will not fence them off: they end
    /// first (a host that sent one again through `to` could see the first
    /// land after newer writes). When they do not within a third of the
    /// lease, the lease is left to lapse instead: the next owner fences
    /// this gateway (which stays out of the group for [`LAPSE_FOR`] leases, and
    /// ends the associations of those commands: the hosts send them again
    /// through the next owner).
    fn hand_over(&self, pool: &Pool, g: u32, to: &str, what: &str, addresses: &str) {
        self.lock().owned.remove(&g);
        self.enforce();
        if self.drained(g, self.cfg.lease / 3) {
            let _ = self.publish(pool, g, &format!("{HANDED_TO}{to}"), addresses);
            let _ = pool.unlock(&self.object(g), LOCK, &self.cfg.gateway);
            tracing::info!(group = %self.cfg.name, "ANA group {g}: {what}; inaccessible here");
        } else {
            tracing::warn!(group = %self.cfg.name, "ANA group {g}: not {what}: commands in flight here did not end; the lease lapses and the next owner fences this gateway");
            self.lock().lapsing.insert(g, Instant::now());
        }
        // Commands still here (on blocklisted clients once drained) may
        // never end: their hosts send them again through the next owner.
        self.end_associations_in_flight(&[g]);
    }

    /// Gives group `g` up as the daemon stops: any gateway may take it
    /// (the preferred one first), without fencing this one.
    fn hand_back(&self, pool: &Pool, g: u32, addresses: &str) {
        self.lock().owned.remove(&g);
        self.enforce();
        let oid = self.object(g);
        let _ = self.publish(pool, g, HANDED_OVER, addresses);
        let _ = pool.unlock(&oid, LOCK, &self.cfg.gateway);
        tracing::info!(group = %self.cfg.name, "ANA group {g}: handed back to the other gateways (this one stops); inaccessible here");
    }

    /// Writes who owns group `g`'s lease object now, in `state`, with this
    /// gateway's cluster clients: those a gateway taking a lease "held"
    /// fences.
    fn publish(&self, pool: &Pool, g: u32, state: &str, addresses: &str) -> std::io::Result<()> {
        let text = format!("{} {state} {addresses}", self.cfg.gateway);
        pool.set_attr(&self.object(g), OWNER_ATTR, text.as_bytes())?;
        let mut st = self.lock();
        if state == "held" {
            st.published.insert(g, addresses.to_string());
        } else {
            st.published.remove(&g);
        }
        Ok(())
    }
}
