//! Fencing gateways that are gone without a handover: blocklisting the
//! cluster clients they published. An owner's clients are fenced by the
//! gateway taking its group (`lease`); here, every gateway's clients on the
//! members object, fenced once its heartbeat stood still for a lease (or by
//! its own next process): a dead gateway's image watches stay on the
//! cluster until they time out (30 s), and meanwhile every handover of an
//! image's exclusive lock waits librbd's notify timeout (5 s) for them.

use super::{Group, CLIENTS_ATTR, FENCE_FOR};
use crate::backend::rbd::{Cluster, Pool};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// Blocklists every client of `clients` on `cluster`, all at once (each
/// waits for the monitors' next OSD map); each one's result.
pub(super) fn blocklist_all(cluster: &Cluster, clients: &[&str]) -> Vec<std::io::Result<()>> {
    std::thread::scope(|s| {
        let calls: Vec<_> = clients
            .iter()
            .map(|a| s.spawn(move || cluster.blocklist(a, FENCE_FOR)))
            .collect();
        calls
            .into_iter()
            .map(|c| {
                c.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("panicked")))
            })
            .collect()
    })
}

/// The clients in a published list (`ADDRESS ADDRESS...`) that are not in
/// `ours`.
pub(super) fn others<'a>(published: &'a str, ours: &str) -> Vec<&'a str> {
    let ours: Vec<&str> = ours.split(' ').collect();
    published
        .split(' ')
        .filter(|a| !a.is_empty() && !ours.contains(a))
        .collect()
}

impl Group {
    /// This gateway's attribute on the members object naming its clients.
    pub(super) fn clients_attr(&self) -> String {
        format!("{CLIENTS_ATTR}{}", self.cfg.gateway)
    }

    /// Publishes this gateway's cluster clients `addresses` on the members
    /// object when they changed. At its first round, it first fences those
    /// an earlier process of this gateway published: dead, or frozen.
    pub(super) fn publish_clients(
        self: &Arc<Self>,
        pool: &Pool,
        members: &str,
        addresses: &str,
    ) -> std::io::Result<()> {
        let last = self.lock().clients.clone();
        if last.as_deref() == Some(addresses) {
            return Ok(());
        }
        if last.is_none() {
            if let Some(before) = pool.get_attr(members, &self.clients_attr())? {
                let before = String::from_utf8_lossy(&before).into_owned();
                let stale: Vec<String> = others(&before, addresses)
                    .into_iter()
                    .map(str::to_string)
                    .collect();
                self.fence_in_background(pool.cluster(), "this gateway's previous process", stale);
            }
        }
        pool.set_attr(members, &self.clients_attr(), addresses.as_bytes())?;
        self.lock().clients = Some(addresses.to_string());
        Ok(())
    }

    /// Fences, once per set of clients, every peer whose heartbeat stood
    /// still for a lease (dead, hung, or cut off from the cluster) while
    /// this gateway kept reading the heartbeats (`read_before`: its previous
    /// read): `attrs` are the members object's attributes. A peer that
    /// stopped (its heartbeat says so) closed its images: nothing to fence.
    pub(super) fn fence_silent_peers(
        self: &Arc<Self>,
        cluster: &Arc<Cluster>,
        attrs: &[(String, Vec<u8>)],
        read_before: Option<Instant>,
    ) {
        // After a silence of its own (frozen, cut off), this gateway has
        // not seen the others move: it waits for a round that has.
        if read_before.is_none_or(|t| t.elapsed() > self.cfg.lease / 2) {
            return;
        }
        let mut silent = Vec::new();
        {
            let mut st = self.lock();
            for (name, value) in attrs {
                let Some(p) = name.strip_prefix(CLIENTS_ATTR) else {
                    continue;
                };
                let still = st
                    .peers
                    .get(p)
                    .is_some_and(|(_, moved, _)| moved.elapsed() > self.cfg.lease);
                let clients = String::from_utf8_lossy(value).into_owned();
                if p == self.cfg.gateway || !still || st.fenced_peers.get(p) == Some(&clients) {
                    continue;
                }
                st.fenced_peers.insert(p.to_string(), clients.clone());
                silent.push((p.to_string(), clients));
            }
        }
        for (p, clients) in silent {
            let clients = clients.split_whitespace().map(str::to_string).collect();
            self.fence_in_background(cluster, &format!("{p} (silent for a lease)"), clients);
        }
    }

    /// Blocklists `clients` of `whose` on a thread of its own: the round
    /// goes on meanwhile.
    fn fence_in_background(
        self: &Arc<Self>,
        cluster: &Arc<Cluster>,
        whose: &str,
        clients: Vec<String>,
    ) {
        if clients.is_empty() {
            return;
        }
        let (me, cluster, who) = (self.clone(), cluster.clone(), whose.to_string());
        let spawned = std::thread::Builder::new()
            .name("gateway-fence".into())
            .spawn(move || {
                let all: Vec<&str> = clients.iter().map(String::as_str).collect();
                for (a, r) in all.iter().zip(blocklist_all(&cluster, &all)) {
                    match r {
                        Ok(()) => {
                            me.fenced.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(group = %me.cfg.name, "fenced {who}: client {a} (blocklisted)");
                        }
                        Err(e) => {
                            tracing::warn!(group = %me.cfg.name, "cannot fence {who}: client {a}: {e}")
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(group = %self.cfg.name, "no thread to fence {whose}: {e}");
        }
    }
}
