//! The gateway group's shared reservations: every RBD namespace with
//! reservations gets a record ([`crate::service::reservation::shared`]) in
//! the group's pool, `rdmablk.gwgroup.GROUP.resv.NQN.nsNSID`, on each
//! connection of this gateway to the cluster; a gateway that takes an ANA
//! group reads the records of its namespaces first. Both run a few at a
//! time, so that a thousand namespaces take the time of a few dozen.

use crate::backend::rbd::Pool;
use crate::backend::Backend;
use crate::base::lanes::in_parallel;
use crate::nvme::namespace::Namespace;
use crate::nvme::subsystem::{Registry, Subsystem};
use crate::service::reservation::shared::{self, Record};
use crate::service::reservation::{HostId, State};
use std::sync::{Arc, Weak};

/// A namespace of a subsystem, as its record reaches it.
struct Holder {
    ns: Weak<Namespace>,
    subsys: Weak<Subsystem>,
    nsid: u32,
}

impl shared::Holder for Holder {
    fn install(&self, st: State, aborted: &[HostId]) {
        if let Some(r) = self
            .ns
            .upgrade()
            .as_ref()
            .and_then(|n| n.reservations.as_ref())
        {
            r.install(st, aborted);
        }
    }

    fn notices(&self, notices: &[(HostId, u8)]) {
        if let Some(s) = self.subsys.upgrade() {
            s.reservation_notices(self.nsid, notices);
        }
    }
}

/// Records opened or read at once: each waits for the cluster (a few
/// round trips), and a gateway may have thousands.
const AT_ONCE: usize = 16;

/// Gives every namespace of `registry` that shares its reservations a
/// record on `pool` (those that have one there keep it), [`AT_ONCE`] at a
/// time. `reset`: records without PTPL start empty (no other gateway of
/// the group runs).
pub fn share(registry: &Registry, pool: &Arc<Pool>, group: &str, me: &str, reset: bool) {
    let mut todo = Vec::new();
    for s in registry.subsystems() {
        for ns in s.namespaces().iter() {
            let (Some(r), Some(_)) = (&ns.reservations, ns.reservations_identity()) else {
                continue;
            };
            if matches!(ns.backend, Backend::Rbd(_)) && !r.record().is_some_and(|x| x.on(pool)) {
                todo.push((s.clone(), ns.clone()));
            }
        }
    }
    in_parallel(&todo, AT_ONCE, |(s, ns)| {
        let (Some(r), Some(identity)) = (&ns.reservations, ns.reservations_identity()) else {
            return Ok::<(), ()>(());
        };
        let oid = format!("rdmablk.gwgroup.{group}.resv.{}.ns{}", s.nqn, ns.nsid);
        let holder = Arc::new(Holder {
            ns: Arc::downgrade(ns),
            subsys: Arc::downgrade(s),
            nsid: ns.nsid,
        });
        match Record::open(
            pool,
            oid.clone(),
            identity.clone(),
            me.to_string(),
            holder,
            reset,
        ) {
            Ok(record) => {
                tracing::info!(subsystem = %s.nqn, nsid = ns.nsid, "reservations shared by the gateway group ({oid})");
                r.set_record(record);
            }
            Err(e) => {
                tracing::error!(subsystem = %s.nqn, nsid = ns.nsid, "cannot share reservations through {oid}: {e}")
            }
        }
        Ok(())
    });
}

/// Reads the records of the namespaces in ANA group `g` (before this
/// gateway serves them), [`AT_ONCE`] at a time.
pub fn refresh(registry: &Registry, g: u32) -> std::io::Result<()> {
    let records: Vec<Arc<Record>> = registry
        .subsystems()
        .iter()
        .flat_map(|s| {
            s.namespaces()
                .iter()
                .filter(|n| n.ana_group() == g)
                .filter_map(|n| n.reservations.as_ref().and_then(|r| r.record()))
                .collect::<Vec<_>>()
        })
        .collect();
    match in_parallel(&records, AT_ONCE, |r| r.refresh().map(drop))
        .into_iter()
        .next()
    {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
