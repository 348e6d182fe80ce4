//! Live reconfiguration. A new configuration is checked whole against the
//! running one (including opening new backends and binding new listeners)
//! before anything changes; then its difference is applied, hosts are told
//! through asynchronous events, and removed namespaces drain and flush.
//! Connections the change does not concern are untouched. Every kept
//! listener's ANA states become the file's again (undoing `ana set`).

use crate::config::{
    self, BackendConfig, Config, ConfigError, ListenerConfig, NamespaceConfig, SubsystemConfig,
};
use crate::engine::poller::PollerLink;
use crate::nvme::controller::Controller;
use crate::nvme::namespace::{self, Namespace};
use crate::nvme::port::Port;
use crate::nvme::subsystem::{self, HostAccess, Registry, Subsystem};
use crate::transport::{self, ListenerHandle};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a removed namespace's commands in flight may take to finish
/// before its backend is flushed anyway.
const NAMESPACE_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What the daemon runs now: its configuration, its listeners, and what a
/// reload needs to start new ones.
pub struct Running {
    pub path: Option<std::path::PathBuf>,
    pub cfg: Config,
    pub listeners: Vec<Listening>,
    pub pollers: Arc<Vec<PollerLink>>,
    pub registry: Arc<Registry>,
    /// The gateway group this gateway takes part in: it sets the ANA states.
    pub gateway: Option<Arc<crate::app::gateway::Group>>,
}

/// A running listener: as configured, its port (with its ANA states) and
/// its thread.
pub struct Listening {
    pub cfg: ListenerConfig,
    pub port: Port,
    pub handle: ListenerHandle,
}

impl Listening {
    /// Starts listener `l` on `port`, handing its connections to `pollers`.
    pub fn start(
        l: &ListenerConfig,
        port: Port,
        pollers: &Arc<Vec<PollerLink>>,
        registry: &Arc<Registry>,
    ) -> Result<Listening, crate::base::error::DaemonError> {
        let handle = transport::start(&port, pollers, registry)?;
        Ok(Listening {
            cfg: l.clone(),
            port,
            handle,
        })
    }

    /// `transport://address`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.cfg.transport, self.cfg.address)
    }
}

/// A namespace change of one subsystem.
enum NsChange {
    Add(Arc<Namespace>),
    Remove(Arc<Namespace>),
    /// Grow to this many bytes.
    Grow(Arc<Namespace>, u64),
    ReadOnly(Arc<Namespace>, bool),
    /// Move to this ANA group.
    AnaGroup(Arc<Namespace>, u32),
    /// Take these hosts and QoS limits.
    Tenancy(Arc<Namespace>, Box<NamespaceConfig>),
}

impl NsChange {
    /// The namespace whose attributes change, for the hosts that see it
    /// (a change of who sees it is found by comparing their views).
    fn attributes_of(&self) -> Option<u32> {
        match self {
            NsChange::Add(n) | NsChange::Remove(n) => Some(n.nsid),
            NsChange::Grow(n, _) | NsChange::ReadOnly(n, _) => Some(n.nsid),
            NsChange::AnaGroup(..) | NsChange::Tenancy(..) => None,
        }
    }
}

/// Everything a reload will do, prepared (backends opened, listeners
/// bound) but not yet visible.
#[derive(Default)]
struct Plan {
    subsystems: Vec<Arc<Subsystem>>,
    added: Vec<String>,
    removed: Vec<Arc<Subsystem>>,
    namespaces: Vec<(Arc<Subsystem>, Vec<NsChange>)>,
    access: Vec<(Arc<Subsystem>, HostAccess)>,
    new_listeners: Vec<Listening>,
    /// Listeners that go.
    old_listeners: Vec<ListenerConfig>,
    /// Listeners that stay, as the new configuration has them.
    kept_listeners: Vec<ListenerConfig>,
}

fn refuse(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        problem: problem.into(),
    }
}

const RESTART: &str = "changed; this needs a restart (the running configuration stays)";

/// Re-reads the configuration file and applies it. Returns what changed,
/// one line each; on an error nothing changed.
pub fn reload(running: &mut Running) -> Result<Vec<String>, ConfigError> {
    let Some(path) = running.path.clone() else {
        return Err(refuse(
            "--config",
            "the daemon was started without a configuration file; there is nothing to re-read",
        ));
    };
    let new = config::load(&path)?;
    new.check_machine()?;
    apply(running, new)
}

/// Checks `new` against the running configuration, then applies it.
pub fn apply(running: &mut Running, new: Config) -> Result<Vec<String>, ConfigError> {
    let old = &running.cfg;
    if new.pollers.count != old.pollers.count {
        return Err(refuse("pollers.count", RESTART));
    }
    if new.pollers.arena_bytes != old.pollers.arena_bytes {
        return Err(refuse("pollers.arena", RESTART));
    }
    if new.pollers.busy_poll != old.pollers.busy_poll {
        return Err(refuse("pollers.busy_poll", RESTART));
    }
    if new.pollers.spin != old.pollers.spin {
        return Err(refuse("pollers.spin_min/spin_max", RESTART));
    }
    if new.limits != old.limits {
        return Err(refuse("limits", RESTART));
    }
    if new.metrics != old.metrics {
        return Err(refuse("metrics.listen", RESTART));
    }
    if new.state_directory != old.state_directory {
        return Err(refuse("reservations.state_directory", RESTART));
    }
    if new.gateway_group != old.gateway_group {
        return Err(refuse("gateway_group", RESTART));
    }
    let plan = prepare(running, &new)?;
    let summary = commit(running, plan);
    running.registry.start_backends();
    running.cfg = new;
    Ok(summary)
}

/// Opens, binds and checks everything the new configuration adds.
fn prepare(running: &Running, new: &Config) -> Result<Plan, ConfigError> {
    let registry = &running.registry;
    let current: HashMap<String, Arc<Subsystem>> = registry
        .subsystems()
        .into_iter()
        .map(|s| (s.nqn.clone(), s))
        .collect();
    let mut plan = Plan::default();
    for (si, s) in new.subsystems.iter().enumerate() {
        let key = format!("subsystem[{si}]");
        let Some(sub) = current.get(&s.nqn) else {
            let mut namespaces = Vec::new();
            for (ni, n) in s.namespaces.iter().enumerate() {
                namespaces.push(open(
                    &s.nqn,
                    n,
                    &format!("{key}.namespace[{ni}]"),
                    registry,
                )?);
            }
            plan.subsystems
                .push(Arc::new(subsystem::new_subsystem(s, namespaces)));
            plan.added.push(s.nqn.clone());
            continue;
        };
        plan.subsystems.push(sub.clone());
        let access = HostAccess::of(s);
        if access != sub.access() {
            plan.access.push((sub.clone(), access));
        }
        let old = running
            .cfg
            .subsystems
            .iter()
            .find(|o| o.nqn == s.nqn)
            .expect("a running subsystem is in the running configuration");
        if s.cntlids != old.cntlids {
            return Err(refuse(format!("{key}.cntlid_min"), RESTART));
        }
        let changes = namespace_changes(&key, old, s, sub, registry)?;
        if !changes.is_empty() {
            plan.namespaces.push((sub.clone(), changes));
        }
    }
    plan.removed = current
        .values()
        .filter(|s| !new.subsystems.iter().any(|n| n.nqn == s.nqn))
        .cloned()
        .collect();
    let runs = |l: &ListenerConfig, among: &[ListenerConfig]| {
        among.iter().any(|o| o.endpoint() == l.endpoint())
    };
    for (i, l) in new.listeners.iter().enumerate() {
        if runs(l, &running.cfg.listeners) {
            plan.kept_listeners.push(l.clone());
            continue;
        }
        let port = transport::port(l);
        if running.gateway.is_some() {
            // The group's leases say what is usable: nothing until then.
            port.ana.start_all(crate::config::AnaState::Inaccessible);
        }
        match Listening::start(l, port, &running.pollers, registry) {
            Ok(started) => plan.new_listeners.push(started),
            Err(e) => {
                // Nothing changes: the listeners already started go.
                for started in plan.new_listeners {
                    started.handle.stop();
                }
                return Err(refuse(format!("listener[{i}]"), e.to_string()));
            }
        }
    }
    plan.old_listeners = running
        .cfg
        .listeners
        .iter()
        .filter(|l| !runs(l, &new.listeners))
        .cloned()
        .collect();
    Ok(plan)
}

/// The namespace changes of subsystem `key` from `old` to `new`.
fn namespace_changes(
    key: &str,
    old: &SubsystemConfig,
    new: &SubsystemConfig,
    sub: &Subsystem,
    registry: &Registry,
) -> Result<Vec<NsChange>, ConfigError> {
    let mut changes = Vec::new();
    for (ni, n) in new.namespaces.iter().enumerate() {
        let nkey = format!("{key}.namespace[{ni}]");
        let Some(o) = old.namespaces.iter().find(|o| o.nsid == n.nsid) else {
            changes.push(NsChange::Add(open(&new.nqn, n, &nkey, registry)?));
            continue;
        };
        let live = sub
            .namespace(n.nsid)
            .expect("a configured namespace is live");
        if n.block_size != o.block_size {
            return Err(refuse(format!("{nkey}.block_size"), RESTART));
        }
        if n.reservations != o.reservations {
            return Err(refuse(format!("{nkey}.reservations"), RESTART));
        }
        if n.ids != o.ids {
            return Err(refuse(
                format!("{nkey}.nguid/uuid/eui64"),
                "changed while the namespace is served; hosts would find another disk \
                 under the same nsid: remove the namespace (reload), then add it back \
                 with the new identifiers, or restart (the running configuration stays)",
            ));
        }
        if !same_storage(&o.backend, &n.backend) {
            // Other storage under the same nsid: a removal and an addition.
            changes.push(NsChange::Remove(live));
            changes.push(NsChange::Add(open(&new.nqn, n, &nkey, registry)?));
            continue;
        }
        if let (BackendConfig::Rbd(a), BackendConfig::Rbd(b)) = (&o.backend, &n.backend) {
            // The same image: its cluster connection's settings stay (the
            // connection is shared, and reopening would take the namespace
            // away from hosts).
            if a != b {
                return Err(refuse(
                    format!("{nkey}.ceph_conf/client_id/keyring/timeout"),
                    RESTART,
                ));
            }
        } else if let Some(grow) = size_change(&nkey, n, &live)? {
            // (An image's size is its own, followed live.)
            changes.push(grow);
        }
        if n.ana_group != live.ana_group() {
            // (A namespace opened again below gets its group from the
            // configuration; this moves the one that stays.)
            changes.push(NsChange::AnaGroup(live.clone(), n.ana_group));
        }
        if (&n.hosts, &n.qos, &n.host_qos) != (&o.hosts, &o.qos, &o.host_qos) {
            changes.push(NsChange::Tenancy(live.clone(), Box::new(n.clone())));
        }
        if n.read_only != o.read_only {
            if !n.read_only && !live.backend.writable() {
                // Opened read-only: writing needs it opened again.
                changes.push(NsChange::Remove(live));
                changes.push(NsChange::Add(open(&new.nqn, n, &nkey, registry)?));
            } else {
                changes.push(NsChange::ReadOnly(live, n.read_only));
            }
        }
    }
    for o in &old.namespaces {
        if !new.namespaces.iter().any(|n| n.nsid == o.nsid) {
            if let Some(live) = sub.namespace(o.nsid) {
                changes.push(NsChange::Remove(live));
            }
        }
    }
    Ok(changes)
}

/// The growth of a file, memory or null namespace to the size configured or
/// found now, if any; shrinking, and growing memory past its reservation,
/// are refused.
fn size_change(
    nkey: &str,
    n: &NamespaceConfig,
    live: &Arc<Namespace>,
) -> Result<Option<NsChange>, ConfigError> {
    let size = storage_size(live, &n.backend)
        .map_err(|e| refuse(format!("{nkey}.path"), e.to_string()))?;
    let now = live.blocks() * live.block_size as u64;
    let size = size / n.block_size as u64 * n.block_size as u64;
    if size < now {
        return Err(refuse(
            format!("{nkey}.size"),
            format!("{size} bytes is smaller than the {now} served now; shrinking is refused"),
        ));
    }
    if size > now {
        if let BackendConfig::Memory { .. } = n.backend {
            if size > live.backend.capacity() {
                return Err(refuse(
                    format!("{nkey}.size"),
                    format!(
                        "a memory namespace grows live up to {} bytes; this needs a restart",
                        live.backend.capacity()
                    ),
                ));
            }
        }
        return Ok(Some(NsChange::Grow(live.clone(), size)));
    }
    Ok(None)
}

/// Whether two backends are the same storage (sizes aside).
fn same_storage(a: &BackendConfig, b: &BackendConfig) -> bool {
    match (a, b) {
        (BackendConfig::File { path: p, .. }, BackendConfig::File { path: q, .. }) => p == q,
        (BackendConfig::Memory { .. }, BackendConfig::Memory { .. }) => true,
        (BackendConfig::Null { .. }, BackendConfig::Null { .. }) => true,
        (BackendConfig::Rbd(a), BackendConfig::Rbd(b)) => a.spec() == b.spec(),
        _ => false,
    }
}

/// The size the namespace would have now: its file's (which the operator
/// may have grown), or the configured size.
fn storage_size(live: &Namespace, b: &BackendConfig) -> std::io::Result<u64> {
    match b {
        BackendConfig::File { .. } => live.backend.current_size(),
        BackendConfig::Memory { size } | BackendConfig::Null { size } => Ok(*size),
        BackendConfig::Rbd(_) => {
            unreachable!("an RBD namespace's size is followed by its own thread")
        }
    }
}

fn open(
    nqn: &str,
    n: &NamespaceConfig,
    key: &str,
    registry: &Registry,
) -> Result<Arc<Namespace>, ConfigError> {
    namespace::open_namespace(nqn, n, registry.pollers, &registry.state_directory)
        .map(Arc::new)
        .map_err(|e| refuse(key, e.to_string()))
}

/// Makes the plan visible and tells hosts; returns what changed.
fn commit(running: &mut Running, plan: Plan) -> Vec<String> {
    let registry = running.registry.clone();
    let discovery_changed = !plan.added.is_empty()
        || !plan.removed.is_empty()
        || !plan.access.is_empty()
        || !plan.new_listeners.is_empty()
        || !plan.old_listeners.is_empty();
    let mut summary = Vec::new();
    let mut drained = Vec::new();
    for (sub, changes) in &plan.namespaces {
        let before = views(sub);
        let mut table: Vec<Arc<Namespace>> = sub.namespaces().to_vec();
        for c in changes {
            match c {
                NsChange::Add(n) => {
                    table.push(n.clone());
                    summary.push(format!("{}: namespace {} added", sub.nqn, n.nsid));
                }
                NsChange::Remove(n) => {
                    table.retain(|t| !Arc::ptr_eq(t, n));
                    drained.push((sub.nqn.clone(), n.clone()));
                    summary.push(format!("{}: namespace {} removed", sub.nqn, n.nsid));
                }
                NsChange::Grow(n, bytes) => {
                    n.grow_to(*bytes);
                    summary.push(format!(
                        "{}: namespace {} grown to {bytes} bytes",
                        sub.nqn, n.nsid
                    ));
                }
                NsChange::ReadOnly(n, ro) => {
                    n.set_read_only(*ro);
                    let what = if *ro { "read-only" } else { "writable" };
                    summary.push(format!("{}: namespace {} {what}", sub.nqn, n.nsid));
                }
                NsChange::AnaGroup(n, group) => {
                    n.set_ana_group(*group);
                    summary.push(format!(
                        "{}: namespace {} moved to ANA group {group}",
                        sub.nqn, n.nsid
                    ));
                }
                NsChange::Tenancy(n, cfg) => {
                    for what in n.tenancy.apply(cfg) {
                        summary.push(format!("{}: namespace {} {what}", sub.nqn, n.nsid));
                    }
                }
            }
        }
        table.sort_by_key(|n| n.nsid);
        sub.set_namespaces(table);
        let changed: BTreeSet<u32> = changes.iter().filter_map(NsChange::attributes_of).collect();
        let moved = changes.iter().any(|c| matches!(c, NsChange::AnaGroup(..)));
        for (c, seen) in before {
            let now = visible(sub, &c);
            // Namespaces whose attributes changed that the host sees (or
            // saw), and those it sees now and did not, or the reverse.
            let mut nsids: BTreeSet<u32> = changed
                .iter()
                .copied()
                .filter(|n| seen.contains(n) || now.contains(n))
                .collect();
            nsids.extend(seen.symmetric_difference(&now));
            if !nsids.is_empty() {
                c.namespaces_changed(&nsids.into_iter().collect::<Vec<_>>());
            }
            if moved {
                c.ana_changed();
            }
        }
    }
    for (sub, access) in plan.access {
        for c in sub.set_access(access) {
            c.kill("its host was removed from the subsystem's allowed hosts by a reload");
        }
        summary.push(format!("{}: allowed hosts changed", sub.nqn));
    }
    for sub in &plan.removed {
        for c in sub.live_controllers() {
            c.kill("its subsystem was removed by a reload");
        }
        for n in sub.namespaces().iter() {
            drained.push((sub.nqn.clone(), n.clone()));
        }
        summary.push(format!("{}: subsystem removed", sub.nqn));
    }
    for nqn in &plan.added {
        summary.push(format!("{nqn}: subsystem added"));
    }
    let mut listeners: Vec<Listening> = Vec::new();
    for mut l in std::mem::take(&mut running.listeners) {
        if plan.old_listeners.contains(&l.cfg) {
            summary.push(format!("stopped listening on {}", l.url()));
            l.handle.stop();
            continue;
        }
        if let Some(new) = plan
            .kept_listeners
            .iter()
            .find(|k| k.endpoint() == l.cfg.endpoint())
        {
            l.cfg = new.clone();
            // (In a gateway group the leases decide every state.)
            let changed = match &running.gateway {
                Some(_) => Vec::new(),
                None => l.port.ana.apply(new),
            };
            for g in &changed {
                summary.push(format!(
                    "ANA group {g} {} on {}",
                    l.port.ana.state(*g),
                    l.url()
                ));
            }
            registry.ana_changed(&l.port.ana, &changed);
            if l.port.tls.set(new.tls) {
                summary.push(format!("TLS {} on {}", new.tls.name(), l.url()));
            }
        }
        listeners.push(l);
    }
    for l in plan.new_listeners {
        summary.push(format!("listening on {}", l.url()));
        listeners.push(l);
    }
    if discovery_changed {
        registry.replace(
            plan.subsystems,
            listeners.iter().map(|l| l.port.clone()).collect(),
        );
        for c in registry.discovery.live_controllers() {
            c.discovery_changed();
        }
    }
    running.listeners = listeners;
    for (nqn, n) in drained {
        drain_and_flush(&nqn, &n);
    }
    for line in &summary {
        tracing::info!("reload: {line}");
    }
    summary
}

/// The live controllers of `sub`, each with the namespaces its host sees.
fn views(sub: &Subsystem) -> Vec<(Arc<Controller>, BTreeSet<u32>)> {
    sub.live_controllers()
        .into_iter()
        .map(|c| {
            let seen = visible(sub, &c);
            (c, seen)
        })
        .collect()
}

/// The namespaces controller `c`'s host sees in `sub`.
fn visible(sub: &Subsystem, c: &Controller) -> BTreeSet<u32> {
    sub.visible_namespaces(&c.hostnqn)
        .iter()
        .map(|n| n.nsid)
        .collect()
}

/// Waits (at most [`NAMESPACE_DRAIN_TIMEOUT`]) for a removed namespace's commands in
/// flight, then flushes its backend. Queues that still hold the namespace
/// keep it open until their next command sees it gone.
fn drain_and_flush(nqn: &str, n: &Namespace) {
    let start = Instant::now();
    while n.metrics.in_flight() > 0 && start.elapsed() < NAMESPACE_DRAIN_TIMEOUT {
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Err(e) = n.backend.sync_all() {
        tracing::error!(
            subsystem = nqn,
            nsid = n.nsid,
            "flushing a removed namespace: {e}"
        );
    }
}
