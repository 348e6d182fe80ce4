//! What `status` and the metrics show of a gateway group.

use super::Group;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

impl Group {
    /// The group as this gateway sees it now.
    pub fn status(&self) -> GroupStatus {
        let st = self.lock();
        GroupStatus {
            name: self.cfg.name.clone(),
            gateway: self.cfg.gateway.clone(),
            lease: self.cfg.lease,
            failovers: self.failovers.load(Ordering::Relaxed),
            fenced: self.fenced.load(Ordering::Relaxed),
            peers: st
                .peers
                .iter()
                .map(|(p, (_, moved, _))| (p.clone(), moved.elapsed() <= self.cfg.lease))
                .collect(),
            ana_groups: st
                .owners
                .iter()
                .map(|(g, owner)| (*g, owner.clone(), st.owned.get(g).map(Instant::elapsed)))
                .collect(),
        }
    }
}

/// What `status` and the metrics show of a gateway group.
pub struct GroupStatus {
    pub name: String,
    /// This gateway.
    pub gateway: String,
    pub lease: Duration,
    /// ANA groups taken from a gateway that did not hand them over.
    pub failovers: u64,
    /// Cluster clients blocklisted.
    pub fenced: u64,
    /// The other gateways that ever beat, and whether each did within the
    /// last lease.
    pub peers: Vec<(String, bool)>,
    /// Each ANA group's owner as last read, with the time since this
    /// gateway last renewed the lease where it owns the group.
    pub ana_groups: Vec<(u32, String, Option<Duration>)>,
}

impl GroupStatus {
    /// `status` lines: the group, its gateways, each ANA group's owner.
    pub fn lines(&self) -> Vec<String> {
        let peers: Vec<String> = self
            .peers
            .iter()
            .map(|(p, alive)| format!("{p} {}", if *alive { "alive" } else { "silent" }))
            .collect();
        let mut out = vec![
            format!(
                "gateway group {} as {}: lease {:?}, {} failover(s), {} client(s) fenced",
                self.name, self.gateway, self.lease, self.failovers, self.fenced
            ),
            format!(
                "  gateways: {} (this one){}",
                self.gateway,
                peers.iter().map(|p| format!(", {p}")).collect::<String>()
            ),
        ];
        for (g, owner, renewed) in &self.ana_groups {
            let here = match renewed {
                Some(t) => format!(" (this gateway, renewed {:.1}s ago)", t.as_secs_f64()),
                None => String::new(),
            };
            out.push(format!("  ANA group {g}: owner {owner}{here}"));
        }
        out
    }
}
