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
//!   `failback_delay`: it reports the group inaccessible, marks the lease
//!   object as handed over (no fencing), and unlocks.

use crate::app::records;
use crate::backend::rbd::{self, Cluster, Pool};
use crate::config::{AnaState, GatewayGroup};
use crate::nvme::subsystem::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The lock every lease object carries.
const LOCK: &str = "owner";
/// The lease object's attribute naming its owner: `GATEWAY STATE ADDRESS...`
/// (STATE `held` or `handed-over`).
const OWNER_ATTR: &str = "rdmablk.owner";
/// The prefix of a gateway's heartbeat attribute on the group's members
/// object: a counter it moves every round.
const HEARTBEAT_ATTR: &str = "rdmablk.gateway.";
/// The heartbeat of a gateway that stopped.
const STOPPED: &[u8] = b"stopped";
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
    /// This gateway's cluster clients now, and as last published in owned
    /// lease objects.
    addresses: String,
    published: String,
    heartbeat: u64,
    /// When this gateway started taking part.
    since: Option<Instant>,
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

    fn object(&self, group: u32) -> String {
        format!("rdmablk.gwgroup.{}.ana.{group}", self.cfg.name)
    }

    /// The object whose attributes are the gateways' heartbeats.
    fn members_object(&self) -> String {
        format!("rdmablk.gwgroup.{}.gateways", self.cfg.name)
    }

    fn heartbeat_attr(&self) -> String {
        format!("{HEARTBEAT_ATTR}{}", self.cfg.gateway)
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
                // The others need not wait a lease to see this gateway gone.
                let _ = pool.set_attr(&self.members_object(), &self.heartbeat_attr(), STOPPED);
            }
        }
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

    /// Keeps, takes or hands back ANA group `g` every round; hands it over
    /// when the daemon stops. Ends with the connection when it was `fenced`.
    fn keep_group(&self, pool: &Pool, g: u32, fenced: &AtomicBool) {
        let round = self.cfg.lease / 3;
        while !self.stopping.load(Ordering::Acquire) {
            if fenced.load(Ordering::Acquire) {
                self.lock().owned.remove(&g);
                self.enforce();
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
            self.hand_back(pool, g, "the other gateways (this one stops)", &addresses);
        }
    }

    /// One round of the group: heartbeat, peers, this gateway's clients.
    fn round(&self, pool: &Pool) -> std::io::Result<()> {
        let beat = {
            let mut st = self.lock();
            st.heartbeat += 1;
            st.heartbeat
        };
        let addresses = self.addresses(pool.cluster());
        self.lock().addresses = addresses;
        let members = self.members_object();
        pool.set_attr(
            &members,
            &self.heartbeat_attr(),
            beat.to_string().as_bytes(),
        )?;
        self.watch_peers(&pool.get_attrs(&members)?);
        self.enforce();
        Ok(())
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
                continue;
            }
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
    fn alive_since(&self, gw: &str) -> Option<Instant> {
        let st = self.lock();
        if !st.peers.contains_key(gw) && st.since.is_some_and(|s| s.elapsed() > self.cfg.lease) {
            return None; // stopped
        }
        let (_, moved, since) = st.peers.get(gw)?;
        (moved.elapsed() <= self.cfg.lease).then_some(*since)
    }

    /// Keeps, takes or hands back ANA group `g`.
    fn keep(&self, pool: &Pool, g: u32, addresses: &str) {
        let oid = self.object(g);
        let me = &self.cfg.gateway;
        let preferred = self.cfg.preferred.get(&g);
        let owned = self.lock().owned.contains_key(&g);
        let started = Instant::now();
        if owned {
            if let Some(p) = preferred.filter(|p| *p != me) {
                let back = self.alive_since(p);
                if back.is_some_and(|t| t.elapsed() >= self.cfg.failback_delay) {
                    self.hand_back(pool, g, p, addresses);
                    return;
                }
            }
            match pool.lock_exclusive(&oid, LOCK, me, me, self.cfg.lease, true) {
                Ok(()) => {
                    let republish = self.lock().published != addresses;
                    if republish {
                        let _ = self.publish(pool, &oid, "held", addresses);
                    }
                    self.lock().owned.insert(g, started);
                    self.enforce();
                }
                Err(e) => {
                    tracing::error!(group = %self.cfg.name, "ANA group {g}: lease lost ({e}); inaccessible here");
                    self.lock().owned.remove(&g);
                    self.enforce();
                }
            }
            return;
        }
        // Not ours: the preferred gateway tries at once; the others (after
        // a lease of watching) once it looks dead, or once the holder, any
        // gateway, stopped renewing: a lease that lapsed while "held" is a
        // dead or hung owner, where one "handed-over" is the preferred
        // gateway's to take.
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
        let may_try = match preferred {
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

    /// Group `g`'s lease was just taken: fences its previous owner unless it
    /// handed the group over, publishes this gateway, reports it optimized.
    fn take(&self, pool: &Pool, g: u32, oid: &str, started: Instant, addresses: &str) {
        let previous = pool.get_attr(oid, OWNER_ATTR).ok().flatten();
        let previous = previous.map(|p| String::from_utf8_lossy(&p).into_owned());
        let mut words = previous.as_deref().unwrap_or_default().split(' ');
        let (owner, state) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
        // Every client the previous owner published that is not one of this
        // gateway's own (an earlier process under the same name is fenced
        // too: it may be frozen, not dead).
        let mine: Vec<&str> = addresses.split(' ').collect();
        let clients: Vec<&str> = words
            .filter(|a| !a.is_empty() && !mine.contains(a))
            .collect();
        if state != "handed-over" && !clients.is_empty() {
            // All at once: each waits for the monitors' next OSD map.
            let results: Vec<std::io::Result<()>> = std::thread::scope(|s| {
                let calls: Vec<_> = clients
                    .iter()
                    .map(|a| s.spawn(move || pool.cluster().blocklist(a, FENCE_FOR)))
                    .collect();
                calls
                    .into_iter()
                    .map(|c| {
                        c.join()
                            .unwrap_or_else(|_| Err(std::io::Error::other("panicked")))
                    })
                    .collect()
            });
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
        if let Err(e) = self.publish(pool, oid, "held", addresses) {
            tracing::error!(group = %self.cfg.name, "ANA group {g}: cannot publish this gateway: {e}");
            let _ = pool.unlock(oid, LOCK, &self.cfg.gateway);
            return;
        }
        let from = if owner.is_empty() { "nobody" } else { owner };
        tracing::info!(group = %self.cfg.name, "ANA group {g}: owned by this gateway (from {from}); optimized here");
        let mut st = self.lock();
        st.owned.insert(g, started);
        st.owners.insert(g, self.cfg.gateway.clone());
        drop(st);
        self.enforce();
    }

    /// Gives group `g` back to its preferred owner `to`.
    fn hand_back(&self, pool: &Pool, g: u32, to: &str, addresses: &str) {
        self.lock().owned.remove(&g);
        self.enforce();
        let oid = self.object(g);
        let _ = self.publish(pool, &oid, "handed-over", addresses);
        let _ = pool.unlock(&oid, LOCK, &self.cfg.gateway);
        tracing::info!(group = %self.cfg.name, "ANA group {g}: handed back to {to}; inaccessible here");
    }

    /// Writes who owns the lease object now.
    fn publish(&self, pool: &Pool, oid: &str, state: &str, addresses: &str) -> std::io::Result<()> {
        let text = format!("{} {state} {addresses}", self.cfg.gateway);
        pool.set_attr(oid, OWNER_ATTR, text.as_bytes())?;
        self.lock().published = addresses.to_string();
        Ok(())
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
        }
    }

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

/// Ends lapsed ownerships until the group goes.
fn watchdog(group: Weak<Group>) {
    while let Some(g) = group.upgrade() {
        g.expire();
        drop(g);
        std::thread::sleep(WATCHDOG_TICK);
    }
}
