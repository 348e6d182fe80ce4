//! The gateways' heartbeats: each round this gateway moves its counter on
//! the group's members object, with the hosts it reaches, and follows the
//! others'.

use super::{hosts, Group, HEARTBEAT_ATTR, STOPPED};
use crate::backend::rbd::Pool;
use std::sync::Arc;
use std::time::Instant;

impl Group {
    /// The object whose attributes are the gateways' heartbeats.
    pub(super) fn members_object(&self) -> String {
        format!("rdmablk.gwgroup.{}.gateways", self.cfg.name)
    }

    pub(super) fn heartbeat_attr(&self) -> String {
        format!("{HEARTBEAT_ATTR}{}", self.cfg.gateway)
    }

    /// One round of the group: heartbeat, peers, this gateway's clients,
    /// silent peers fenced.
    pub(super) fn round(self: &Arc<Self>, pool: &Pool) -> std::io::Result<()> {
        let hosts = self.hosts_here();
        let beat = {
            let mut st = self.lock();
            st.heartbeat += 1;
            let beat = hosts::beat(st.heartbeat, &hosts);
            hosts::follow_own(&mut st, hosts);
            beat
        };
        let addresses = self.addresses(pool.cluster());
        self.lock().addresses.clone_from(&addresses);
        let members = self.members_object();
        self.publish_clients(pool, &members, &addresses)?;
        pool.set_attr(&members, &self.heartbeat_attr(), &beat)?;
        let attrs = pool.get_attrs(&members)?;
        self.watch_peers(&attrs);
        let read_before = self.lock().read_at.replace(Instant::now());
        self.fence_silent_peers(pool.cluster(), &attrs, read_before);
        self.enforce();
        Ok(())
    }

    /// Follows the other gateways' heartbeats (`attrs`: the members
    /// object's attributes).
    fn watch_peers(&self, attrs: &[(String, Vec<u8>)]) {
        let now = Instant::now();
        let lease = self.cfg.lease;
        let mut st = self.lock();
        for (name, beat) in attrs {
            let Some(p) = name.strip_prefix(HEARTBEAT_ATTR) else {
                continue;
            };
            if p == self.cfg.gateway {
                continue;
            }
            if beat == STOPPED {
                st.peers.remove(p);
                st.reach.remove(p);
                continue;
            }
            hosts::follow_reach(&mut st, p, hosts::hosts_of(beat));
            let e = st
                .peers
                .entry(p.to_string())
                .or_insert((beat.clone(), now, now));
            if e.0 != *beat {
                if e.1.elapsed() > lease {
                    e.2 = now; // back after a silence
                }
                e.0.clone_from(beat);
                e.1 = now;
            }
        }
    }

    /// Whether gateway `gw` showed life within the last lease, and since
    /// when without a break.
    pub(super) fn alive_since(&self, gw: &str) -> Option<Instant> {
        let st = self.lock();
        if !st.peers.contains_key(gw) && st.since.is_some_and(|s| s.elapsed() > self.cfg.lease) {
            return None; // stopped
        }
        let (_, moved, since) = st.peers.get(gw)?;
        (moved.elapsed() <= self.cfg.lease).then_some(*since)
    }
}
