//! Subsystems, their namespaces and allowed hosts, the live controllers of
//! each, and the discovery subsystem's log.

use crate::backend::rbd::RbdNamespace;
use crate::backend::{Backend, FileBackend, MemoryBackend, RbdBackend};
use crate::base::admission::Admission;
use crate::base::error::DaemonError;
use crate::base::ids::{self, NamespaceIds};
use crate::base::metrics::NsMetrics;
use crate::config::{self, BackendConfig, Config, GivenIds, NamespaceConfig, SubsystemConfig};
use crate::nvme::ana::AnaStates;
use crate::nvme::controller::Controller;
use crate::nvme::port::Port;
use crate::nvme::qos::Throttle;
use crate::nvme::reservation::ptpl::{Identity, Persistent, StateFile};
use crate::nvme::reservation::{HostId, Reservations};
use crate::nvme::tenancy::Tenancy;
use crate::nvme::write_gate::WriteGate;
use rdmablk_common::fabrics::discovery::{self, eflags, subtype, DiscoveryEntry};
use rdmablk_common::fabrics::DISCOVERY_NQN;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, Weak};

/// An exported namespace.
pub struct Namespace {
    pub nsid: u32,
    /// Logical block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Size in logical blocks: grows on a reload.
    blocks: AtomicU64,
    /// Writes refused (flipped by a reload).
    read_only: AtomicBool,
    /// Its ANA group (a reload may move it).
    ana_group: AtomicU32,
    pub backend: Backend,
    /// NGUID, UUID and EUI-64, stable across restarts: set when the
    /// namespace is made, or when its RBD image opens (those not given
    /// derive from the image's id).
    ids: OnceLock<NamespaceIds>,
    /// The identifiers the configuration gives.
    given_ids: GivenIds,
    /// Commands, bytes, errors and latency, per poller.
    pub metrics: NsMetrics,
    /// Its registrations and reservation; `None` where the configuration
    /// turned reservations off.
    pub reservations: Option<Reservations>,
    /// Where they persist through power loss.
    state_file: Option<StateFile>,
    /// The order of its writes against Compare and Write and Preempt and
    /// Abort.
    pub gate: WriteGate,
    /// Who sees it, and its QoS limits.
    pub tenancy: Tenancy,
}

impl Namespace {
    /// log2 of the block size.
    pub fn lba_shift(&self) -> u32 {
        self.block_size.trailing_zeros()
    }

    /// Size in logical blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks.load(Ordering::Acquire)
    }

    pub fn read_only(&self) -> bool {
        self.read_only.load(Ordering::Acquire)
    }

    pub fn set_read_only(&self, read_only: bool) {
        self.read_only.store(read_only, Ordering::Release);
    }

    /// Its ANA group.
    #[inline]
    pub fn ana_group(&self) -> u32 {
        self.ana_group.load(Ordering::Acquire)
    }

    pub fn set_ana_group(&self, group: u32) {
        self.ana_group.store(group, Ordering::Release);
    }

    /// Makes `bytes` (a whole number of blocks, not less than now) the
    /// namespace's size; the backend must already hold them.
    pub fn grow_to(&self, bytes: u64) {
        let before = self
            .blocks
            .fetch_max(bytes / self.block_size as u64, Ordering::AcqRel);
        // The state file names the size: a grown namespace keeps its
        // reservations at the next start. Not on a poller: a reload, or
        // the image's thread.
        if before != self.blocks()
            && self
                .reservations
                .as_ref()
                .is_some_and(|r| r.snapshot().ptpl)
        {
            if let Err(e) = self.persist() {
                tracing::error!(
                    nsid = self.nsid,
                    "cannot save the reservation state of the grown namespace: {e}"
                );
            }
        }
    }

    /// Its size as its state file records it (none for RBD images, which
    /// Ceph resizes).
    fn recorded_size(&self) -> Option<u64> {
        (!matches!(self.backend, Backend::Rbd(_))).then(|| self.blocks() * self.block_size as u64)
    }

    /// Whether the namespace is active: it takes I/O and is listed (an RBD
    /// namespace once its image opened).
    pub fn is_active(&self) -> bool {
        self.backend.is_ready()
    }

    /// Its identifiers (zeroes until it is active).
    pub fn ids(&self) -> NamespaceIds {
        self.ids.get().copied().unwrap_or(NamespaceIds {
            nguid: [0; 16],
            uuid: [0; 16],
            eui64: None,
        })
    }

    /// The identifiers its configuration gives.
    pub fn given_ids(&self) -> &GivenIds {
        &self.given_ids
    }
}

impl Namespace {
    /// The namespace its state file or shared record is for.
    pub fn reservations_identity(&self) -> Option<&Identity> {
        self.state_file.as_ref().map(StateFile::identity)
    }
}

impl Persistent for Namespace {
    /// Writes the state file; where a gateway group shares the state, its
    /// record takes this PTPL (the one thing changed outside a reservation
    /// command: Set Features).
    fn persist(&self) -> std::io::Result<()> {
        let Some(r) = &self.reservations else {
            return Ok(());
        };
        if let Some(record) = r.record() {
            let ptpl = r.snapshot().ptpl;
            let res = record.change(&mut |st| {
                st.ptpl = ptpl;
                Ok(crate::nvme::reservation::Outcome {
                    changed: true,
                    ..Default::default()
                })
            });
            return match res {
                0 => Ok(()),
                e => Err(std::io::Error::from_raw_os_error(-e)),
            };
        }
        match &self.state_file {
            Some(f) => f.save(&r.snapshot(), self.recorded_size()),
            None => Ok(()),
        }
    }
}

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
}

impl HostAccess {
    /// As configured for subsystem `s`.
    pub fn of(s: &SubsystemConfig) -> HostAccess {
        HostAccess {
            allow_any_host: s.allow_any_host,
            hosts: s.hosts.clone(),
            auth: s.auth.iter().cloned().map(Arc::new).collect(),
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
        self.table
            .iter()
            .find(|(n, _)| n.nsid == nsid && n.is_active())
            .cloned()
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

    /// Whether `hostnqn` may connect.
    pub fn admits(&self, hostnqn: &str) -> bool {
        let a = self.access.lock().expect("access lock");
        a.allow_any_host
            || self.is_discovery()
            || a.hosts.iter().any(|h| h == hostnqn)
            || a.auth.iter().any(|h| h.nqn == hostnqn)
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
    /// is of.
    pub fn view(&self, host: &str) -> NamespaceView {
        let table = self.namespaces.lock().expect("namespaces lock");
        NamespaceView {
            generation: self.generation.load(Ordering::Acquire),
            table: table
                .iter()
                .filter(|n| n.tenancy.visible_to(host))
                .map(|n| (n.clone(), n.tenancy.throttle_for(host)))
                .collect(),
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
            admission: Admission::new(cfg.limits.clone()),
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
                    ..port.profile.discovery_entry(port.addr, local)
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

impl RbdNamespace for Namespace {
    fn rbd(&self) -> &RbdBackend {
        match &self.backend {
            Backend::Rbd(r) => r,
            _ => unreachable!("an RBD namespace has an RBD backend"),
        }
    }

    fn nsid(&self) -> u32 {
        self.nsid
    }

    fn size(&self) -> u64 {
        self.blocks() * self.block_size as u64
    }

    fn grow_to(&self, bytes: u64) {
        Namespace::grow_to(self, bytes)
    }

    fn derive_ids(&self, key: &str) {
        let _ = self.ids.set(NamespaceIds::derive(key, &self.given_ids));
    }
}

/// A subsystem as configured, with its opened namespaces.
pub fn new_subsystem(s: &SubsystemConfig, namespaces: Vec<Arc<Namespace>>) -> Subsystem {
    Subsystem::new(&s.nqn, HostAccess::of(s), namespaces, s.cntlids.clone())
}

/// Opens a namespace's backend; its metrics have a slot for each of
/// `pollers`. Logs what it opened.
pub fn open_namespace(
    nqn: &str,
    n: &NamespaceConfig,
    pollers: usize,
    state_dir: &Path,
) -> std::io::Result<Namespace> {
    let (backend, size) = match &n.backend {
        BackendConfig::Rbd(image) => {
            // Opened in the background (`Registry::start_backends`): the
            // namespace is inactive until then.
            let backend = RbdBackend::new(image.clone(), n.block_size, n.read_only)?;
            tracing::info!(
                subsystem = %nqn,
                nsid = n.nsid,
                "namespace on {}; inactive until the image is open",
                backend.describe()
            );
            (Backend::Rbd(Box::new(backend)), 0)
        }
        BackendConfig::File { path, create_size } => {
            let f = FileBackend::open(path, *create_size, n.block_size, n.read_only)?;
            let size = f.size();
            (Backend::File(f), size)
        }
        BackendConfig::Memory { size } => {
            // Room to grow on a reload up to what the machine could hold
            // (a memory namespace must fit in memory anyway).
            let reserve = config::machine_memory().unwrap_or(*size);
            (Backend::Memory(MemoryBackend::new(*size, reserve)?), *size)
        }
        BackendConfig::Null { size } => (Backend::Null, *size),
    };
    let rbd = matches!(backend, Backend::Rbd(_));
    let blocks = size / n.block_size as u64;
    if blocks == 0 && !rbd {
        return Err(std::io::Error::other(format!(
            "smaller than one {}-byte block; give it a size",
            n.block_size
        )));
    }
    if !rbd {
        tracing::info!(
            subsystem = %nqn,
            nsid = n.nsid,
            blocks,
            block_size = n.block_size,
            read_only = n.read_only,
            "namespace on {}",
            backend.describe()
        );
    }
    let state_file = n.reservations.then(|| {
        StateFile::new(
            state_dir,
            Identity {
                subsystem: nqn.to_owned(),
                nsid: n.nsid,
                backend: backend_identity(&n.backend),
                block_size: n.block_size,
                size: None,
            },
        )
    });
    let reservations = state_file
        .as_ref()
        .map(|f| Reservations::new(f.load((!rbd).then_some(size))));
    Ok(Namespace {
        nsid: n.nsid,
        block_size: n.block_size,
        blocks: AtomicU64::new(blocks),
        read_only: AtomicBool::new(n.read_only),
        ana_group: AtomicU32::new(n.ana_group),
        backend,
        // An RBD namespace's derive from its image's id, once it is open.
        ids: if rbd {
            OnceLock::new()
        } else {
            OnceLock::from(NamespaceIds::derive(&format!("{nqn}/{}", n.nsid), &n.ids))
        },
        given_ids: n.ids,
        metrics: NsMetrics::new(pollers),
        reservations,
        state_file,
        gate: WriteGate::new(pollers),
        tenancy: Tenancy::new(n),
    })
}

/// What a state file names as the namespace's storage.
fn backend_identity(b: &BackendConfig) -> String {
    match b {
        BackendConfig::File { path, .. } => format!("file:{}", path.display()),
        BackendConfig::Rbd(image) => format!("rbd:{}", image.spec()),
        BackendConfig::Memory { .. } => "memory".into(),
        BackendConfig::Null { .. } => "null".into(),
    }
}
