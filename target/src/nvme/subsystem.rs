//! Subsystems, their namespaces and allowed hosts, the live controllers of
//! each, and the discovery subsystem's log.

use crate::backend::rbd::RbdNamespace;
use crate::backend::Backend;
use crate::base::admission::Admission;
use crate::base::error::DaemonError;
use crate::base::ids::{self};
use crate::config::{self, Config, SubsystemConfig};
use crate::nvme::controller::Controller;
use crate::nvme::namespace::{open_namespace, Namespace};
use crate::nvme::port::Port;
use crate::service::ana::AnaStates;
use crate::service::qos::Throttle;
use crate::service::reservation::HostId;
use rdmablk_common::fabrics::discovery::{self, eflags, subtype, DiscoveryEntry};
use rdmablk_common::fabrics::DISCOVERY_NQN;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

/// An NVM subsystem (or the discovery subsystem).
pub struct Subsystem {
    pub nqn: String,
    /// Who may connect (a reload changes it).
    access: Mutex<HostAccess>,
    /// The namespaces now; a reload swaps the table and bumps `generation`,
    /// which queues compare on every I/O command (a read-only load) to
    /// refresh their copy ([`NamespaceView`]).
    namespaces: Mutex<Arc<[Arc<Namespace>]>>,
    generation: AtomicU64,
    /// Serial number reported by every controller of the subsystem.
    pub serial: String,
    controllers: Mutex<Controllers>,
}

/// Who may connect to a subsystem, and who must authenticate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostAccess {
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    /// Hosts that authenticate with DH-HMAC-CHAP (allowed, authenticated).
    pub auth: Vec<Arc<config::HostAuth>>,
    /// Hosts' TLS keys (allowed).
    pub tls_keys: Vec<Arc<config::HostTlsKey>>,
}

impl HostAccess {
    /// As configured for subsystem `s`.
    pub fn of(s: &SubsystemConfig) -> HostAccess {
        HostAccess {
            allow_any_host: s.allow_any_host,
            hosts: s.hosts.clone(),
            auth: s.auth.iter().cloned().map(Arc::new).collect(),
            tls_keys: s.tls_keys.iter().cloned().map(Arc::new).collect(),
        }
    }
}

/// A queue's copy of the namespaces its host sees, with the limits its
/// commands fall under, refreshed when the subsystem's generation moves:
/// the I/O path takes no lock.
pub struct NamespaceView {
    generation: u64,
    table: Vec<(Arc<Namespace>, Option<Throttle>)>,
}

impl NamespaceView {
    /// The namespace `nsid` of `subsys` as host `host` sees it now, and
    /// the limits of its commands there.
    pub fn find(
        &mut self,
        subsys: &Subsystem,
        host: &str,
        nsid: u32,
    ) -> Option<(Arc<Namespace>, Option<Throttle>)> {
        if subsys.generation.load(Ordering::Acquire) != self.generation {
            *self = subsys.view(host);
        }
        let i = self
            .table
            .binary_search_by_key(&nsid, |(n, _)| n.nsid)
            .ok()?;
        Some(self.table[i].clone()).filter(|(n, _)| n.is_active())
    }
}

struct Controllers {
    live: HashMap<u16, Weak<Controller>>,
    next: u16,
    /// The ids this subsystem gives out.
    range: std::ops::RangeInclusive<u16>,
}

impl Subsystem {
    fn new(
        nqn: &str,
        access: HostAccess,
        namespaces: Vec<Arc<Namespace>>,
        cntlids: std::ops::RangeInclusive<u16>,
    ) -> Self {
        let serial = ids::serial_number(nqn);
        Subsystem {
            nqn: nqn.to_string(),
            access: Mutex::new(access),
            namespaces: Mutex::new(namespaces.into()),
            generation: AtomicU64::new(1),
            serial,
            controllers: Mutex::new(Controllers {
                live: HashMap::new(),
                next: *cntlids.start(),
                range: cntlids,
            }),
        }
    }

    /// Whether this is the discovery subsystem.
    pub fn is_discovery(&self) -> bool {
        self.nqn == DISCOVERY_NQN
    }

    /// Whether `hostnqn` may connect (some hosts only over TLS).
    pub fn admits(&self, hostnqn: &str) -> bool {
        self.admits_without_tls(hostnqn) || self.tls_key_of(hostnqn).is_some()
    }

    /// Whether `hostnqn` may connect without TLS: it is allowed otherwise
    /// than by its TLS key.
    pub fn admits_without_tls(&self, hostnqn: &str) -> bool {
        let a = self.access.lock().expect("access lock");
        a.allow_any_host
            || self.is_discovery()
            || a.hosts.iter().any(|h| h == hostnqn)
            || a.auth.iter().any(|h| h.nqn == hostnqn)
    }

    /// The TLS key of `hostnqn`, if it has one here.
    pub fn tls_key_of(&self, hostnqn: &str) -> Option<Arc<config::HostTlsKey>> {
        let a = self.access.lock().expect("access lock");
        a.tls_keys.iter().find(|h| h.nqn == hostnqn).cloned()
    }

    /// The authentication `hostnqn` must pass, if any.
    pub fn auth_of(&self, hostnqn: &str) -> Option<Arc<config::HostAuth>> {
        let a = self.access.lock().expect("access lock");
        a.auth.iter().find(|h| h.nqn == hostnqn).cloned()
    }

    /// Who may connect now.
    pub fn access(&self) -> HostAccess {
        self.access.lock().expect("access lock").clone()
    }

    /// Changes who may connect; returns the live controllers of hosts no
    /// longer admitted (the caller ends them).
    pub fn set_access(&self, access: HostAccess) -> Vec<Arc<Controller>> {
        *self.access.lock().expect("access lock") = access;
        self.live_controllers()
            .into_iter()
            .filter(|c| !self.admits(&c.hostnqn))
            .collect()
    }

    /// The namespace table now.
    pub fn namespaces(&self) -> Arc<[Arc<Namespace>]> {
        self.namespaces.lock().expect("namespaces lock").clone()
    }

    /// What host `host`'s queue sees of the table, with the generation it
    /// is of; by nsid, so that a command finds its namespace in as many
    /// steps as the log of their number.
    pub fn view(&self, host: &str) -> NamespaceView {
        let table = self.namespaces.lock().expect("namespaces lock");
        let mut view: Vec<_> = table
            .iter()
            .filter(|n| n.tenancy.visible_to(host))
            .map(|n| (n.clone(), n.tenancy.throttle_for(host)))
            .collect();
        view.sort_unstable_by_key(|(n, _)| n.nsid);
        NamespaceView {
            generation: self.generation.load(Ordering::Acquire),
            table: view,
        }
    }

    /// Makes queues read the namespaces' hosts and limits again (after a
    /// change of them) at their next command.
    pub fn refresh_views(&self) {
        let _table = self.namespaces.lock().expect("namespaces lock");
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Replaces the namespace table (a reload): queues see it at their next
    /// command.
    pub fn set_namespaces(&self, namespaces: Vec<Arc<Namespace>>) {
        let mut table = self.namespaces.lock().expect("namespaces lock");
        *table = namespaces.into();
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The namespace `nsid`, active or not.
    pub fn namespace(&self, nsid: u32) -> Option<Arc<Namespace>> {
        self.namespaces().iter().find(|n| n.nsid == nsid).cloned()
    }

    /// The namespace `nsid` if it is active and host `host` sees it.
    pub fn visible_namespace(&self, nsid: u32, host: &str) -> Option<Arc<Namespace>> {
        self.namespace(nsid)
            .filter(|n| n.is_active() && n.tenancy.visible_to(host))
    }

    /// The active namespaces host `host` sees, by nsid.
    pub fn visible_namespaces(&self, host: &str) -> Vec<Arc<Namespace>> {
        self.namespaces()
            .iter()
            .filter(|n| n.is_active() && n.tenancy.visible_to(host))
            .cloned()
            .collect()
    }

    /// Whether any namespace has a volatile write cache.
    pub fn volatile_cache(&self) -> bool {
        self.namespaces().iter().any(|n| n.backend.volatile_cache())
    }

    /// Creates a controller with a free id of the subsystem's range (`make`
    /// receives it) and records it; `None` when all ids are taken.
    pub fn add_controller(&self, make: impl FnOnce(u16) -> Controller) -> Option<Arc<Controller>> {
        let mut c = self.controllers.lock().expect("controllers lock");
        c.live.retain(|_, w| w.strong_count() > 0);
        let (first, last) = (*c.range.start(), *c.range.end());
        for _ in first..=last {
            let id = c.next;
            c.next = if id >= last { first } else { id + 1 };
            if let std::collections::hash_map::Entry::Vacant(e) = c.live.entry(id) {
                let ctrl = Arc::new(make(id));
                e.insert(Arc::downgrade(&ctrl));
                return Some(ctrl);
            }
        }
        None
    }

    /// Number of live controllers.
    pub fn controller_count(&self) -> usize {
        let c = self.controllers.lock().expect("controllers lock");
        c.live.values().filter(|w| w.strong_count() > 0).count()
    }

    /// Raises each (host, notice type) of `notices` about namespace `nsid`
    /// on the live controllers of that host.
    pub fn reservation_notices(&self, nsid: u32, notices: &[(HostId, u8)]) {
        if notices.is_empty() {
            return;
        }
        for c in self.live_controllers() {
            for (_, kind) in notices.iter().filter(|(h, _)| *h == c.hostid) {
                c.reservation_notice(*kind, nsid);
            }
        }
    }

    /// The controllers alive now.
    pub fn live_controllers(&self) -> Vec<Arc<Controller>> {
        let c = self.controllers.lock().expect("controllers lock");
        c.live.values().filter_map(Weak::upgrade).collect()
    }

    /// The live controller with this id.
    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        let c = self.controllers.lock().expect("controllers lock");
        c.live.get(&cntlid).and_then(Weak::upgrade)
    }
}

/// Everything the target exports, shared by all pollers. A reload
/// replaces subsystems and listeners and moves the discovery log's
/// generation counter.
pub struct Registry {
    subsystems: RwLock<Vec<Arc<Subsystem>>>,
    pub discovery: Arc<Subsystem>,
    /// Where the running listeners are, for the discovery log.
    ports: RwLock<Vec<Port>>,
    /// The discovery log's generation counter (GENCTR).
    genctr: AtomicU64,
    /// What hosts may hold, daemon-wide.
    pub admission: Admission,
    /// Poller threads (namespaces' metrics have a slot for each).
    pub pollers: usize,
    /// Where namespaces keep their reservations through power loss.
    pub state_directory: std::path::PathBuf,
}

impl Registry {
    /// Opens every namespace's backend and builds the registry, with the
    /// ports of the listeners about to start.
    pub fn open(cfg: &Config, ports: Vec<Port>) -> Result<Registry, DaemonError> {
        let mut subsystems = Vec::new();
        for (si, s) in cfg.subsystems.iter().enumerate() {
            let mut namespaces = Vec::new();
            for (ni, n) in s.namespaces.iter().enumerate() {
                let key = format!("subsystem[{si}].namespace[{ni}]");
                let ns = open_namespace(&s.nqn, n, cfg.pollers.count, &cfg.state_directory)
                    .map_err(|source| DaemonError::Namespace {
                        key,
                        nqn: s.nqn.clone(),
                        source,
                    })?;
                namespaces.push(Arc::new(ns));
            }
            subsystems.push(Arc::new(new_subsystem(s, namespaces)));
        }
        let discovery = HostAccess {
            allow_any_host: true,
            hosts: Vec::new(),
            auth: Vec::new(),
            tls_keys: Vec::new(),
        };
        Ok(Registry {
            subsystems: RwLock::new(subsystems),
            discovery: Arc::new(Subsystem::new(
                DISCOVERY_NQN,
                discovery,
                Vec::new(),
                1..=config::MAX_CNTLID,
            )),
            ports: RwLock::new(ports),
            genctr: AtomicU64::new(1),
            admission: Admission::new(cfg.limits.clone(), cfg.pollers.arenas()),
            pollers: cfg.pollers.count,
            state_directory: cfg.state_directory.clone(),
        })
    }

    /// Starts what namespaces open in the background (RBD images), for
    /// those not started yet: at start and after a reload. Once open, or
    /// resized, a namespace's controllers (of hosts that see it) get a
    /// Namespace Attribute Changed notice.
    pub fn start_backends(self: &Arc<Self>) {
        for s in self.subsystems() {
            for ns in s.namespaces().iter() {
                let Backend::Rbd(r) = &ns.backend else {
                    continue;
                };
                let (registry, nqn) = (Arc::downgrade(self), s.nqn.clone());
                let (nsid, weak) = (ns.nsid, Arc::downgrade(ns));
                let owner: Arc<dyn RbdNamespace> = ns.clone();
                r.start(Arc::downgrade(&owner), move || {
                    // The subsystem as it is now, if it still serves this
                    // very namespace.
                    let Some(sub) = registry.upgrade().and_then(|r| r.find(&nqn)) else {
                        return;
                    };
                    let Some(ns) = sub
                        .namespace(nsid)
                        .filter(|n| std::ptr::eq(Arc::as_ptr(n), weak.as_ptr()))
                    else {
                        return;
                    };
                    for c in sub.live_controllers() {
                        if ns.tenancy.visible_to(&c.hostnqn) {
                            c.namespaces_changed(&[nsid]);
                        }
                    }
                });
            }
        }
    }

    /// The NVM subsystems now.
    pub fn subsystems(&self) -> Vec<Arc<Subsystem>> {
        self.subsystems.read().expect("subsystems lock").clone()
    }

    /// The ports of the listeners now.
    pub fn ports(&self) -> Vec<Port> {
        self.ports.read().expect("ports lock").clone()
    }

    /// Replaces subsystems and ports (a reload) and moves the discovery
    /// log's generation counter.
    pub fn replace(&self, subsystems: Vec<Arc<Subsystem>>, ports: Vec<Port>) {
        *self.subsystems.write().expect("subsystems lock") = subsystems;
        *self.ports.write().expect("ports lock") = ports;
        self.genctr.fetch_add(1, Ordering::AcqRel);
    }

    /// Groups `groups` changed state on the listener whose states are `ana`:
    /// the controllers that came through it and whose subsystem has a
    /// namespace in one of them get an Asymmetric Namespace Access Change
    /// notice.
    pub fn ana_changed(&self, ana: &Arc<AnaStates>, groups: &[u32]) {
        for s in self.subsystems() {
            if !s
                .namespaces()
                .iter()
                .any(|n| groups.contains(&n.ana_group()))
            {
                continue;
            }
            for c in s.live_controllers().iter().filter(|c| c.reports(ana)) {
                c.ana_changed();
            }
        }
    }

    /// The TLS key `hostnqn` uses to reach `subnqn`: the one configured
    /// for it on that subsystem, or for the discovery subsystem, the first
    /// it has on any subsystem.
    pub fn tls_key(&self, hostnqn: &str, subnqn: &str) -> Option<Arc<config::HostTlsKey>> {
        if subnqn == DISCOVERY_NQN {
            return self.subsystems().iter().find_map(|s| s.tls_key_of(hostnqn));
        }
        self.find(subnqn)?.tls_key_of(hostnqn)
    }

    /// The subsystem (or the discovery subsystem) with this NQN.
    pub fn find(&self, nqn: &str) -> Option<Arc<Subsystem>> {
        if nqn == DISCOVERY_NQN {
            return Some(self.discovery.clone());
        }
        let subsystems = self.subsystems.read().expect("subsystems lock");
        subsystems.iter().find(|s| s.nqn == nqn).cloned()
    }

    /// The discovery log page as `hostnqn` may see it, as seen by a host
    /// whose discovery queue reached us at `local`: first this discovery
    /// subsystem on each listener (SUBTYPE 3h, TP 8013; DUPRETINFO so that
    /// hosts do not connect to it again, EPCSD), then one entry per
    /// (subsystem the host is allowed on, listener). Built under the locks
    /// a reload takes, so that it matches its generation counter.
    pub fn discovery_log(&self, hostnqn: &str, local: Option<IpAddr>) -> Vec<u8> {
        let subsystems = self.subsystems.read().expect("subsystems lock");
        let ports = self.ports.read().expect("ports lock");
        let genctr = self.genctr.load(Ordering::Acquire);
        let current = std::iter::once((DISCOVERY_NQN, subtype::CURRENT_DISCOVERY));
        let allowed = subsystems
            .iter()
            .filter(|s| s.admits(hostnqn))
            .map(|s| (s.nqn.as_str(), subtype::NVME));
        let mut entries = Vec::new();
        for (nqn, kind) in current.chain(allowed) {
            for (i, port) in ports.iter().enumerate() {
                let mut e = DiscoveryEntry {
                    portid: i as u16 + 1,
                    subnqn: nqn.to_string(),
                    ..port.discovery_entry(local)
                };
                if kind == subtype::CURRENT_DISCOVERY {
                    e.subtype = kind;
                    e.eflags = eflags::DUPRETINFO | eflags::EPCSD;
                }
                entries.push(e);
            }
        }
        discovery::encode_log(genctr, &entries)
    }
}

/// A subsystem as configured, with its opened namespaces.
pub fn new_subsystem(s: &SubsystemConfig, namespaces: Vec<Arc<Namespace>>) -> Subsystem {
    Subsystem::new(&s.nqn, HostAccess::of(s), namespaces, s.cntlids.clone())
}
