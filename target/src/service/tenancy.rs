//! Who sees a namespace (its `hosts`) and the QoS limits its commands fall
//! under (its `qos`, and each host's `host_qos`). A reload and
//! `rdmablk-target qos set` change them; queues read them only when their
//! subsystem's generation moves (`NamespaceView`), never per command.

use crate::config::{NamespaceConfig, QosLimits};
use crate::service::qos::{Limiter, Throttle};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A namespace's hosts and limits.
pub struct Tenancy(Mutex<Inner>);

struct Inner {
    /// Who sees it; `None`: every host the subsystem admits.
    hosts: Option<Vec<String>>,
    /// All hosts together.
    shared: Option<Arc<Limiter>>,
    /// Single hosts, by NQN.
    per_host: BTreeMap<String, Arc<Limiter>>,
}

impl Tenancy {
    /// As namespace `n` is configured.
    pub fn new(n: &NamespaceConfig) -> Tenancy {
        Tenancy(Mutex::new(Inner {
            hosts: n.hosts.clone(),
            shared: Limiter::new(n.qos),
            per_host: n
                .host_qos
                .iter()
                .filter_map(|h| Limiter::new(h.limits).map(|l| (h.nqn.clone(), l)))
                .collect(),
        }))
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().expect("tenancy lock")
    }

    /// Whether host `nqn` sees the namespace.
    pub fn visible_to(&self, nqn: &str) -> bool {
        let t = self.inner();
        t.hosts.as_ref().is_none_or(|h| h.iter().any(|n| n == nqn))
    }

    /// The hosts that see it (`None`: all the subsystem admits).
    pub fn hosts(&self) -> Option<Vec<String>> {
        self.inner().hosts.clone()
    }

    /// The limits host `nqn`'s commands fall under, if any.
    pub fn throttle_for(&self, nqn: &str) -> Option<Throttle> {
        let t = self.inner();
        Throttle::of(t.shared.clone(), t.per_host.get(nqn).cloned())
    }

    /// The limits: all hosts together, and each host's.
    pub fn limits(&self) -> (QosLimits, Vec<(String, QosLimits)>) {
        let t = self.inner();
        let shared = t.shared.as_ref().map(|l| l.limits()).unwrap_or_default();
        let hosts = t
            .per_host
            .iter()
            .map(|(n, l)| (n.clone(), l.limits()))
            .collect();
        (shared, hosts)
    }

    /// Makes `n`'s hosts and limits the namespace's; returns what changed,
    /// one phrase each.
    pub fn apply(&self, n: &NamespaceConfig) -> Vec<String> {
        let mut changed = Vec::new();
        let hosts_changed = {
            let mut t = self.inner();
            std::mem::replace(&mut t.hosts, n.hosts.clone()) != n.hosts
        };
        if hosts_changed {
            changed.push(match &n.hosts {
                Some(h) => format!("visible to {} host(s)", h.len()),
                None => "visible to every host".into(),
            });
        }
        if self.set_limits(None, n.qos) {
            changed.push(format!("qos {}", n.qos));
        }
        let (_, before) = self.limits();
        for (nqn, _) in before {
            let kept = n.host_qos.iter().any(|h| h.nqn == nqn);
            if !kept && self.set_limits(Some(&nqn), QosLimits::default()) {
                changed.push(format!("qos for {nqn} none"));
            }
        }
        for h in &n.host_qos {
            if self.set_limits(Some(&h.nqn), h.limits) {
                changed.push(format!("qos for {} {}", h.nqn, h.limits));
            }
        }
        changed
    }

    /// Sets the limits of all hosts together (`host` `None`) or of one
    /// host; returns whether they changed. Commands waiting under the
    /// limits replaced go at once.
    pub fn set_limits(&self, host: Option<&str>, limits: QosLimits) -> bool {
        let mut t = self.inner();
        let old = match host {
            None => t.shared.clone(),
            Some(h) => t.per_host.get(h).cloned(),
        };
        if old.as_ref().map(|l| l.limits()).unwrap_or_default() == limits {
            return false;
        }
        if let Some(o) = old {
            o.retire();
        }
        match (host, Limiter::new(limits)) {
            (None, new) => t.shared = new,
            (Some(h), Some(l)) => {
                t.per_host.insert(h.to_owned(), l);
            }
            (Some(h), None) => {
                t.per_host.remove(h);
            }
        }
        true
    }
}
