//! The gateway group (`[gateway_group]`): gateways in front of one Ceph
//! cluster share the ANA groups of their namespaces. Each ANA group has one
//! owner, the gateway holding its lease: an exclusive RADOS lock with a
//! duration on the object `rdmablk.gwgroup.NAME.ana.G` in the group's pool,
//! renewed every third of the lease. The owner reports the group optimized
//! on every listener; every other gateway reports it inaccessible (two
//! writers of one image would need its exclusive lock to change hands on
//! every write, and a fenced gateway must not be a path hosts keep using).
//!
//! - **Taking a group**: the preferred owner (configuration) tries at once;
//!   the others when the preferred gateway shows no sign of life (its
//!   heartbeat stood still for a whole lease), or when the lease lapsed in
//!   the hands of its owner (dead or hung: not handed over to the preferred
//!   gateway). A standby tries every sixth of the lease. Before it reports
//!   the group optimized, the new owner fences the previous one unless that
//!   one handed the group over: it blocklists every cluster client the
//!   previous owner published in the lease object (its lease connection and
//!   its images' connections), so that none of its writes, delayed or
//!   still in flight, can land later. Then it publishes its own.
//! - **Keeping it**: a renewal that fails ends the ownership at once; a
//!   watchdog ends it when no renewal succeeded for two thirds of the lease
//!   (a hung cluster connection), before the lock can lapse and another
//!   gateway take it: two gateways never both report a group optimized.
//! - **Handing it back**: an owner that is not the group's preferred gateway
//!   gives the group back once the preferred one has been alive for
//!   `failback_delay` and reaches again every host the owner serves (or
//!   lost) that it reached before: it reports the group inaccessible, waits
//!   for the group's commands in flight to end (else it lets the lease
//!   lapse: the next owner fences it), marks the lease object as handed
//!   over (no fencing), and unlocks.
//!
//! - **Following the hosts**: an owner that lost hosts (a partition
//!   between them), or took a group from a gateway whose hosts it does not
//!   reach, hands its groups to a gateway that reaches one of those and
//!   every host it still serves (`hosts`).
//!
//! - **Fencing the silent**: a gateway whose heartbeat stood still for a
//!   lease has its published clients blocklisted by the others, owner or
//!   not (`fence`): a dead gateway's image watches would hold up every
//!   handover of an image's exclusive lock.
//!
//! Here the group's thread and watchdog; `fence` (blocklisting a gone
//! gateway's clients), `heartbeat` (the gateways' signs of life), `hosts`
//! (which hosts each reaches), `lease` (one ANA group's lease), `records`
//! (the shared reservations) and `status` (what reports show).

mod fence;
mod heartbeat;
mod hosts;
mod lease;
mod records;
pub mod status;

use crate::backend::rbd::{self, Cluster, Pool};
use crate::backend::Backend;
use crate::config::{AnaState, GatewayGroup};
use crate::nvme::namespace::Namespace;
use crate::nvme::subsystem::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The lock every lease object carries.
const LOCK: &str = "owner";
/// The lease object's attribute naming its owner: `GATEWAY STATE ADDRESS...`
/// (STATE `held`, `handed-over` by a gateway that stopped, or
/// `handed-to=GATEWAY`).
const OWNER_ATTR: &str = "rdmablk.owner";
/// The prefix of a gateway's heartbeat attribute on the group's members
/// object: a counter it moves every round.
const HEARTBEAT_ATTR: &str = "rdmablk.gateway.";
/// The heartbeat of a gateway that stopped.
const STOPPED: &[u8] = b"stopped";
/// The prefix of a gateway's attribute on the members object naming its
/// cluster clients (`ADDRESS ADDRESS...`; empty once it stopped): fenced
/// when its heartbeat stands still for a lease (`fence`).
const CLIENTS_ATTR: &str = "rdmablk.clients.";
/// How long a fenced client stays blocklisted.
const FENCE_FOR: Duration = Duration::from_secs(3600);
/// How long the group's cluster operations may take: blocklisting waits for
/// the monitors to publish a new OSD map.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the watchdog looks at the leases.
const WATCHDOG_TICK: Duration = Duration::from_millis(50);

/// This gateway's part in its group.
pub struct Group {
    cfg: GatewayGroup,
    registry: Weak<Registry>,
    state: Mutex<State>,
    /// ANA groups taken from a gateway that did not hand them over, and
    /// clients blocklisted for it.
    failovers: AtomicU64,
    fenced: AtomicU64,
    /// Set by [`Group::leave`]: the daemon stops, and takes no group.
    leaving: AtomicBool,
    /// Set by [`Group::stop`]; the lease thread, to join.
    stopping: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Default)]
struct State {
    /// Groups owned, and when their last successful renewal started.
    owned: BTreeMap<u32, Instant>,
    /// Each group's owner as last read from its lease object.
    owners: BTreeMap<u32, String>,
    /// The other gateways' heartbeats: (value, when it last moved, since
    /// when it keeps moving).
    peers: BTreeMap<String, (Vec<u8>, Instant, Instant)>,
    /// This gateway's cluster clients now, and as last published in each
    /// lease object it holds.
    addresses: String,
    published: BTreeMap<u32, String>,
    /// Groups whose lease this gateway lets lapse, and since when.
    lapsing: BTreeMap<u32, Instant>,
    /// This gateway's clients as last published on the members object
    /// (None before its first round).
    clients: Option<String>,
    /// When this gateway last read the members object.
    read_at: Option<Instant>,
    /// The clients fenced for each peer found silent.
    fenced_peers: BTreeMap<String, String>,
    heartbeat: u64,
    /// When this gateway started taking part.
    since: Option<Instant>,
    /// The hosts with a live controller here, as of the last round, and
    /// those it had and lost since when.
    hosts: BTreeSet<String>,
    lost: BTreeMap<String, Instant>,
    /// The other gateways' hosts (from their heartbeats), and since when
    /// each has reached every host here and one lost here.
    reach: BTreeMap<String, (BTreeSet<String>, Option<Instant>)>,
    /// The hosts each other gateway's heartbeats named, and when last
    /// (for [`hosts::LOST_FOR`]): a failback waits for those it had.
    reached: BTreeMap<String, BTreeMap<String, Instant>>,
}

impl Group {
    /// Starts taking part in `cfg`'s group for the namespaces of `registry`:
    /// a thread keeps the leases, another watches them. Every ANA group is
    /// inaccessible on every listener until this gateway owns it.
    pub fn start(cfg: GatewayGroup, registry: &Arc<Registry>) -> std::io::Result<Arc<Group>> {
        let group = Arc::new(Group {
            cfg,
            registry: Arc::downgrade(registry),
            state: Mutex::new(State::default()),
            failovers: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
            leaving: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        group.enforce();
        let g = group.clone();
        let thread = std::thread::Builder::new()
            .name("gateway-group".into())
            .spawn(move || g.run())?;
        *group
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(thread);
        let g = Arc::downgrade(&group);
        std::thread::Builder::new()
            .name("gateway-watch".into())
            .spawn(move || watchdog(g))?;
        Ok(group)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The daemon begins to stop (its connections drain): it takes no
    /// group any more, and keeps those it owns until [`Group::stop`]. A
    /// gateway that took a group now could not serve it.
    pub fn leave(&self) {
        self.leaving.store(true, Ordering::Release);
    }

    /// Hands the groups this gateway owns over (the daemon stops, its I/O
    /// drained: the others take them at their next round, without fencing)
    /// and ends the lease thread.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// Connects (again and again while the cluster cannot be reached),
    /// then keeps the heartbeat and, in a thread per ANA group, the leases,
    /// until the daemon stops. A connection the cluster blocklisted (this
    /// gateway was fenced: it froze, or was cut off, past its lease) is
    /// replaced by a new one: the gateway takes part again as a standby.
    fn run(self: Arc<Self>) {
        let round = self.cfg.lease / 3;
        while !self.stopping.load(Ordering::Acquire) {
            // Blocklisting waits for a new OSD map: longer than a round.
            let connected = rbd::connect(
                &self.cfg.ceph_conf,
                &self.cfg.client_id,
                self.cfg.keyring.as_deref(),
                CLUSTER_TIMEOUT,
            )
            .and_then(|c| c.pool(&self.cfg.pool));
            let pool = match connected {
                Ok(p) => Arc::new(p),
                Err(e) => {
                    tracing::warn!(group = %self.cfg.name, "gateway group: cannot reach the cluster: {e}; every ANA group stays inaccessible here");
                    self.pause(self.cfg.lease);
                    continue;
                }
            };
            self.lock().since.get_or_insert_with(Instant::now);
            tracing::info!(group = %self.cfg.name, gateway = %self.cfg.gateway, "gateway group: taking part");
            let mut keepers = BTreeMap::new();
            let fenced = Arc::new(AtomicBool::new(false));
            let mut first = true;
            while !self.stopping.load(Ordering::Acquire) {
                let started = Instant::now();
                let beat = self.round(&pool);
                if beat.is_ok() {
                    // Before any ANA group is taken on this connection.
                    self.share_reservations(&pool, first);
                    first = false;
                }
                if let Err(e) = beat {
                    if rbd::blocklisted(&e) {
                        tracing::error!(group = %self.cfg.name, "gateway group: the cluster blocklisted this gateway's client (fenced by another gateway); connecting again as a standby");
                        fenced.store(true, Ordering::Release);
                        self.reconnect_images();
                        break;
                    }
                    tracing::warn!(group = %self.cfg.name, "gateway group: {e}");
                }
                for g in self.groups() {
                    if keepers.contains_key(&g) {
                        continue;
                    }
                    let (me, pool, fenced) = (self.clone(), pool.clone(), fenced.clone());
                    let spawned = std::thread::Builder::new()
                        .name(format!("ana-lease-{g}"))
                        .spawn(move || me.keep_group(&pool, g, &fenced));
                    match spawned {
                        Ok(t) => {
                            keepers.insert(g, t);
                        }
                        Err(e) => {
                            tracing::error!(group = %self.cfg.name, "ANA group {g}: cannot start its lease thread: {e}")
                        }
                    }
                }
                self.pause(round.saturating_sub(started.elapsed()));
            }
            for (_, t) in keepers {
                let _ = t.join();
            }
            if !fenced.load(Ordering::Acquire) {
                // The others need not wait a lease to see this gateway gone,
                // nor fence its clients (its images are closed next).
                let members = self.members_object();
                let _ = pool.set_attr(&members, &self.heartbeat_attr(), STOPPED);
                let _ = pool.set_attr(&members, &self.clients_attr(), b"");
            }
        }
    }

    /// Opens every RBD image whose client this gateway published again on
    /// a new connection, waiting up to [`CLUSTER_TIMEOUT`]: the fence
    /// blocklisted every client published, and an operation on a
    /// blocklisted client may never end (librbd's queued behind the
    /// exclusive lock). So no group is taken again before its images have
    /// new clients, rather than an idle image finding out with its next
    /// I/O. An image whose operations found out first, on a new client
    /// already, stays as it is.
    fn reconnect_images(&self) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        let namespaces: Vec<_> = registry
            .subsystems()
            .iter()
            .flat_map(|s| s.namespaces().to_vec())
            .collect();
        // What the fence could blocklist: the clients published in the
        // lease objects held and on the members object.
        let fenced: BTreeSet<String> = {
            let mut st = self.lock();
            let leases = std::mem::take(&mut st.published);
            leases
                .values()
                .chain(st.clients.as_ref())
                .flat_map(|a| a.split(' ').map(str::to_string))
                .collect()
        };
        let replacing: Vec<(&rbd::RbdBackend, Arc<rbd::Image>)> = namespaces
            .iter()
            .filter_map(|ns| match &ns.backend {
                Backend::Rbd(r) => Some((&**r, r.reconnect_if_fenced(&fenced)?)),
                _ => None,
            })
            .collect();
        let until = Instant::now() + CLUSTER_TIMEOUT;
        while !replacing.iter().all(|(r, old)| r.replaced(old)) {
            if Instant::now() >= until {
                tracing::warn!(group = %self.cfg.name, "gateway group: images not open on new connections within {CLUSTER_TIMEOUT:?}; taking part again meanwhile");
                return;
            }
            std::thread::sleep(WATCHDOG_TICK);
        }
        tracing::info!(group = %self.cfg.name, images = replacing.len(), "gateway group: every image open again on a new connection");
    }

    /// Gives the namespaces that share their reservations a record on
    /// `pool`; those without PTPL start empty when `first` finds no other
    /// gateway running (the whole group restarted).
    fn share_reservations(&self, pool: &Arc<Pool>, first: bool) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        let alone = first && self.lock().peers.is_empty();
        let me = format!("{}/{}", self.cfg.gateway, std::process::id());
        records::share(&registry, pool, &self.cfg.name, &me, alone);
    }

    /// Sleeps `d`, or less when the daemon stops.
    fn pause(&self, d: Duration) {
        let until = Instant::now() + d;
        while !self.stopping.load(Ordering::Acquire) && Instant::now() < until {
            std::thread::sleep(WATCHDOG_TICK.min(until.saturating_duration_since(Instant::now())));
        }
    }

    /// The ANA groups the namespaces use now, and those with a preferred
    /// owner.
    fn groups(&self) -> BTreeSet<u32> {
        let mut groups: BTreeSet<u32> = self.cfg.preferred.keys().copied().collect();
        if let Some(r) = self.registry.upgrade() {
            for s in r.subsystems() {
                groups.extend(s.namespaces().iter().map(|n| n.ana_group()));
            }
        }
        groups
    }

    /// This gateway's cluster clients: the lease connection and every
    /// image connection.
    fn addresses(&self, lease: &Arc<Cluster>) -> String {
        let mut all = rbd::image_clients();
        if let Ok(a) = lease.addresses() {
            all.push(a);
        }
        all.sort();
        all.join(" ")
    }

    /// Makes every listener report what this gateway owns optimized and
    /// every other group inaccessible, telling the hosts of what changed.
    fn enforce(&self) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        let owned: BTreeMap<u32, Instant> = self.lock().owned.clone();
        // An owned group is usable until its watchdog limit, checked on
        // every I/O too: a gateway frozen (SIGSTOP, a paused VM) past it
        // refuses I/O the moment it runs again, before its watchdog does.
        let limit = self.cfg.lease * 2 / 3;
        for port in registry.ports() {
            for (g, renewed) in &owned {
                port.ana
                    .usable_until(*g, crate::base::clock::nanos(*renewed + limit));
            }
            let changed: Vec<u32> = (1..=crate::config::MAX_ANA_GROUP)
                .filter(|g| {
                    let want = if owned.contains_key(g) {
                        AnaState::Optimized
                    } else {
                        AnaState::Inaccessible
                    };
                    port.ana.set(*g, want)
                })
                .collect();
            if !changed.is_empty() {
                registry.ana_changed(&port.ana, &changed);
            }
        }
    }

    /// Ends ownerships whose lease was not renewed for two thirds of it.
    fn expire(&self) {
        let limit = self.cfg.lease * 2 / 3;
        let late: Vec<u32> = {
            let mut st = self.lock();
            let late: Vec<u32> = st
                .owned
                .iter()
                .filter(|(_, t)| t.elapsed() > limit)
                .map(|(g, _)| *g)
                .collect();
            for g in &late {
                st.owned.remove(g);
            }
            late
        };
        if !late.is_empty() {
            tracing::error!(group = %self.cfg.name, "ANA groups {late:?}: lease not renewed for {limit:?}; inaccessible here (fenced, or cut off from the cluster)");
            self.enforce();
            self.end_associations_in_flight(&late);
        }
    }

    /// Ends the associations of the subsystems with commands in flight on
    /// namespaces of the `lost` ANA groups: this gateway lost them without
    /// handing them over (cut off from the cluster, fenced, its lease
    /// taken), and those commands would wait in the cluster's client for
    /// its timeout. The hosts, their associations ended, send them again
    /// through the groups' new owner, which fences this gateway's clients
    /// before it serves: none of them lands after its retry.
    fn end_associations_in_flight(&self, lost: &[u32]) {
        let Some(registry) = self.registry.upgrade() else {
            return;
        };
        for s in registry.subsystems() {
            if !busy(&s.namespaces(), lost) {
                continue;
            }
            for c in s.live_controllers() {
                c.kill(&format!(
                    "this gateway lost ANA groups {lost:?} with commands in flight; the host \
                     sends them again through the groups' new owner"
                ));
            }
        }
    }

    /// Waits up to `within` until no command that may still land is in
    /// flight on ANA group `g`'s namespaces; whether none is.
    fn drained(&self, g: u32, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            let Some(registry) = self.registry.upgrade() else {
                return true;
            };
            let any = registry
                .subsystems()
                .iter()
                .any(|s| may_land(&s.namespaces(), g));
            drop(registry);
            if !any {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(WATCHDOG_TICK);
        }
    }
}

/// Whether a command is in flight on one of `namespaces` in ANA `groups`.
fn busy(namespaces: &[Arc<Namespace>], groups: &[u32]) -> bool {
    namespaces
        .iter()
        .any(|ns| groups.contains(&ns.ana_group()) && ns.metrics.in_flight() > 0)
}

/// Whether a command that may still land is in flight on one of
/// `namespaces` in ANA group `g`: not one whose backend operation is on a
/// blocklisted client.
fn may_land(namespaces: &[Arc<Namespace>], g: u32) -> bool {
    namespaces
        .iter()
        .any(|ns| ns.ana_group() == g && ns.metrics.in_flight() > ns.backend.stranded_ops() as u64)
}

/// Ends lapsed ownerships until the group goes.
fn watchdog(group: Weak<Group>) {
    while let Some(g) = group.upgrade() {
        g.expire();
        drop(g);
        std::thread::sleep(WATCHDOG_TICK);
    }
}
