//! Serving: the daemon's life from its configuration to its exit. The
//! pollers get the transports' endpoints from here, listeners start, the
//! reports and the control socket run beside them, and signals reload or
//! stop it.

use crate::app::gateway::Group;
use crate::app::reload::{self, Listening, Running};
use crate::app::report::{http, prometheus, stats};
use crate::app::{control, notify};
use crate::backend::Backend;
use crate::base::error::{starting, DaemonError};
use crate::base::metrics::PollerCounters;
use crate::config::{AnaState, Config};
use crate::engine::poller::{self, PollerLink, Shared, Transports};
use crate::nvme::namespace::Namespace;
use crate::nvme::port::Port;
use crate::nvme::subsystem::Registry;
use crate::transport;
use nix::sys::signal::{SigSet, Signal};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What the daemon was asked for besides its configuration.
pub struct Daemon {
    /// The configuration file (a reload re-reads it).
    pub config_path: Option<PathBuf>,
    /// Where to write the stats file every second.
    pub stats: Option<PathBuf>,
    /// Where to answer `reload` and `status`.
    pub control: Option<PathBuf>,
}

/// Serves `cfg` until SIGTERM or SIGINT (SIGHUP reloads); `embedded` says
/// it is the built-in default (a hint on how to connect is printed).
pub fn serve(cfg: Config, embedded: bool, daemon: Daemon) -> Result<(), DaemonError> {
    // Signals are taken synchronously by this thread; block them before any
    // other thread exists so that all inherit the mask.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGHUP);
    signals
        .thread_block()
        .map_err(|source| DaemonError::Signals {
            what: "blocking signals",
            source,
        })?;

    raise_open_files_limit(&cfg)?;
    let ports: Vec<Port> = cfg.listeners.iter().map(transport::port).collect();
    if cfg.gateway_group.is_some() {
        // Nothing is usable here until this gateway owns it.
        for p in &ports {
            p.ana.start_all(AnaState::Inaccessible);
        }
    }
    let registry = Arc::new(Registry::open(&cfg, ports.clone())?);
    registry.start_backends();
    let shared = Arc::new(Shared {
        registry: registry.clone(),
        stop: AtomicBool::new(false),
        connections: AtomicUsize::new(0),
        buffers_in_use: (0..cfg.pollers.count)
            .map(|_| AtomicUsize::new(0))
            .collect(),
        io_commands: (0..cfg.pollers.count).map(|_| AtomicU64::new(0)).collect(),
        pollers: (0..cfg.pollers.count)
            .map(|_| PollerCounters::default())
            .collect(),
        poll_mode: cfg.pollers.mode(),
        undrained: AtomicUsize::new(0),
        undrained_ops: AtomicUsize::new(0),
    });
    let started = std::time::Instant::now();
    let transports = Transports {
        ring_ops: transport::ring_ops().collect(),
        endpoints: transport::endpoints,
    };
    let (links, threads): (Vec<PollerLink>, Vec<_>) = (0..cfg.pollers.count)
        .map(|i| {
            poller::spawn(
                i,
                shared.clone(),
                cfg.pollers.arena_bytes as usize,
                shared.poll_mode,
                &transports,
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(starting("pollers"))?
        .into_iter()
        .unzip();
    let pollers = Arc::new(links);
    // A controller that ends has its queues closed at once, by their
    // pollers (not at their next tick).
    {
        let pollers = Arc::downgrade(&pollers);
        crate::nvme::controller::on_end(move || {
            for p in pollers.upgrade().iter().flat_map(|p| p.iter()) {
                p.wake();
            }
        });
    }

    // Set once the gateway group has started.
    let group_status: Arc<OnceLock<Arc<Group>>> = Arc::default();
    // Before the listeners: once a host can connect, the metrics answer.
    if let Some(addr) = cfg.metrics {
        let listener = std::net::TcpListener::bind(addr).map_err(|source| DaemonError::Listen {
            url: format!("http://{addr}/metrics"),
            source,
            hint: "",
        })?;
        let (shared, group) = (shared.clone(), group_status.clone());
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                http::serve(listener, || {
                    let status = group.get().map(|g| g.status());
                    prometheus::render(&shared, started, status.as_ref())
                })
            })
            .map_err(starting("the metrics endpoint"))?;
        tracing::info!("metrics on http://{addr}/metrics");
    }
    // Bound before the listeners: once a host can connect, `reload` and
    // `status` reach the daemon (they wait in the backlog until it serves).
    let control = match &daemon.control {
        Some(path) => Some((
            control::bind(path).map_err(|source| DaemonError::Listen {
                url: format!("unix:{}", path.display()),
                source,
                hint: " (the control socket)",
            })?,
            path,
        )),
        None => None,
    };
    let mut listeners = Vec::new();
    for (l, port) in cfg.listeners.iter().zip(ports) {
        listeners.push(Listening::start(l, port, &pollers, &registry)?);
        let any_host = cfg.subsystems.iter().any(|s| s.allow_any_host);
        if any_host && !l.address.ip().is_loopback() {
            tracing::warn!(
                "listening on {} with subsystems that admit any host; list allowed hosts in a config file",
                l.address
            );
        }
    }
    for s in registry.subsystems() {
        let access = s.access();
        tracing::info!(
            subsystem = %s.nqn,
            namespaces = s.namespaces().len(),
            allow_any_host = access.allow_any_host,
            hosts = access.hosts.len(),
            "subsystem ready"
        );
    }
    if embedded {
        let l = &cfg.listeners[0];
        println!(
            "serving the embedded default; connect with: rdmablk connect -t tcp -a {} -s {} -n {} --nbd unix:/tmp/rdmablk.sock",
            l.address.ip(),
            l.address.port(),
            cfg.subsystems[0].nqn
        );
    }
    // Once the listeners are bound (their ANA groups are all inaccessible
    // until this gateway owns one).
    let gateway = match &cfg.gateway_group {
        Some(g) => Some(Group::start(g.clone(), &registry).map_err(starting("the gateway group"))?),
        None => None,
    };
    if let Some(g) = &gateway {
        let _ = group_status.set(g.clone());
    }
    let running = Arc::new(Mutex::new(Running {
        path: daemon.config_path,
        cfg: cfg.clone(),
        listeners,
        pollers: pollers.clone(),
        registry: registry.clone(),
        gateway,
    }));
    if let Some((listener, path)) = control {
        let (running, shared) = (running.clone(), shared.clone());
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || control::serve(listener, running, shared, started))
            .map_err(starting("the control socket"))?;
        tracing::info!("control socket {}", path.display());
    }
    if let Some(path) = daemon.stats {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("stats".into())
            .spawn(move || stats::write_every_second(&path, &shared))
            .map_err(starting("the stats writer"))?;
    }
    notify::notify("READY=1");

    let sig = loop {
        let sig = signals.wait().map_err(|source| DaemonError::Signals {
            what: "waiting for signals",
            source,
        })?;
        if sig != Signal::SIGHUP {
            break sig;
        }
        notify::notify("RELOADING=1");
        match reload::reload(&mut running.lock().expect("running configuration")) {
            Ok(changes) => tracing::info!("SIGHUP: reloaded ({} change(s))", changes.len()),
            Err(e) => {
                tracing::warn!("SIGHUP: reload refused, the running configuration stays: {e}")
            }
        }
        notify::notify("READY=1");
    };
    notify::notify("STOPPING=1");
    if let Some(g) = &running.lock().expect("running configuration").gateway {
        g.leave();
    }
    tracing::info!(
        "{sig:?}: draining {} connection(s)",
        shared.connections.load(Ordering::Acquire)
    );
    shared.stop.store(true, Ordering::Release);
    for p in pollers.iter() {
        p.wake();
    }
    for t in threads {
        let _ = t.join();
    }
    let undrained = shared.undrained.load(Ordering::Acquire);
    if undrained > 0 {
        let ops = shared.undrained_ops.load(Ordering::Acquire);
        if ops > 0 && ops == stranded_ops(&registry) {
            // Every operation left is librbd's on a client the cluster
            // blocklisted: none of them can land, so the stop goes on.
            tracing::warn!(
                "{ops} operation(s) of blocklisted cluster connections never ended; they \
                 cannot land (the cluster refuses those clients): stopping as usual"
            );
        } else {
            // Their operations may still land: the gateway group's leases
            // are not handed over (they lapse, and the next owner fences
            // this gateway first), and no image is closed or flushed under
            // them.
            return Err(DaemonError::Undrained { queues: undrained });
        }
    }
    if let Some(g) = &running.lock().expect("running configuration").gateway {
        // Nothing is in flight: the other gateways may take over at once.
        let t = std::time::Instant::now();
        g.stop();
        tracing::debug!("gateway group left in {:?}", t.elapsed());
    }
    let t = std::time::Instant::now();
    let result = close_namespaces(&registry);
    tracing::debug!("namespaces flushed and closed in {:?}", t.elapsed());
    tracing::info!("stopped");
    result
}

/// Operations in flight on every namespace that can no longer land
/// ([`crate::backend::Backend::stranded_ops`]).
fn stranded_ops(registry: &Registry) -> usize {
    registry
        .subsystems()
        .iter()
        .flat_map(|s| s.namespaces().to_vec())
        .map(|ns| ns.backend.stranded_ops())
        .sum()
}

/// How many namespaces are flushed and closed at once at shutdown: an RBD
/// image's close waits for its watchers (up to librbd's notify timeout when
/// one of them is gone), so one by one, many would outlast the stop timeout.
const CLOSE_AT_ONCE: usize = 32;
/// How long the closes may take in all: within systemd's stop timeout
/// (30 s), after the drain. A cluster that does not answer (a full or
/// unreachable OSD) holds a close for as long as it does.
const CLOSE_WITHIN: Duration = Duration::from_secs(20);

/// Flushes and closes every namespace's backend, [`CLOSE_AT_ONCE`] at a
/// time, once the pollers ended (nothing is in flight); the last flush
/// error is the result. Past [`CLOSE_WITHIN`], see [`left_open`] (the
/// closing threads are left to the process's end).
fn close_namespaces(registry: &Registry) -> Result<(), DaemonError> {
    let list: Arc<Vec<(String, Arc<Namespace>)>> = Arc::new(
        registry
            .subsystems()
            .iter()
            .flat_map(|s| {
                s.namespaces()
                    .iter()
                    .map(|ns| (s.nqn.clone(), ns.clone()))
                    .collect::<Vec<_>>()
            })
            .collect(),
    );
    let next = Arc::new(AtomicUsize::new(0));
    let (done, results) = std::sync::mpsc::channel();
    for _ in 0..CLOSE_AT_ONCE.min(list.len()) {
        let (list, next, done) = (list.clone(), next.clone(), done.clone());
        let spawned = std::thread::Builder::new()
            .name("close".into())
            .spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((nqn, ns)) = list.get(i) else { return };
                let flushed = ns.backend.sync_all();
                ns.backend.close();
                let flushed = flushed.map_err(|source| DaemonError::Flush {
                    nqn: nqn.clone(),
                    nsid: ns.nsid,
                    source,
                });
                let _ = done.send((i, flushed));
            });
        if let Err(e) = spawned {
            tracing::error!("no thread to close namespaces: {e}");
        }
    }
    drop(done);
    let deadline = Instant::now() + CLOSE_WITHIN;
    let mut closed = vec![false; list.len()];
    let mut result = Ok(());
    for _ in 0..list.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match results.recv_timeout(left) {
            Ok((i, flushed)) => {
                closed[i] = true;
                if let Err(e) = flushed {
                    result = Err(e);
                }
            }
            Err(_) => return left_open(&list, &closed),
        }
    }
    result
}

/// The stop's end with namespaces still closing at its deadline: the
/// watches of the RBD images still open are ended at once by blocklisting
/// this process's own cluster clients for a minute. A clean stop when they
/// are all RBD images (what they acknowledged is durable: there is no
/// client cache), as with thousands of them (librbd's close is slower the
/// more images its client has open); an error when a file or device may
/// hold writes not flushed, or the clients could not be blocklisted.
fn left_open(list: &[(String, Arc<Namespace>)], closed: &[bool]) -> Result<(), DaemonError> {
    let left: Vec<&Arc<Namespace>> = list
        .iter()
        .zip(closed)
        .filter(|(_, &c)| !c)
        .map(|((_, ns), _)| ns)
        .collect();
    let clients = crate::backend::rbd::blocklist_own_clients();
    let rbd_only = left.iter().all(|ns| matches!(ns.backend, Backend::Rbd(_)));
    if rbd_only && clients > 0 {
        tracing::warn!(
            images = left.len(),
            clients,
            "RBD images still closing {CLOSE_WITHIN:?} after the stop began (librbd's close is \
             slower the more images are open); left open, their clients blocklisted so that \
             their watches end now; what they acknowledged was durable"
        );
        return Ok(());
    }
    Err(DaemonError::Unclosed {
        namespaces: left.len(),
        within: CLOSE_WITHIN,
        clients,
    })
}

/// Descriptors beside connections and namespaces: each poller's ring,
/// eventfd and RDMA channels, listeners, the metrics and control sockets,
/// log and state files, the cluster's sockets.
const OTHER_FILES: u64 = 256;
const FILES_PER_POLLER: u64 = 8;

/// Descriptors the configuration may need at once: every connection
/// (`limits.connections` connected, twice `limits.pending_connections`
/// waiting: a silent one pushed out gives its place back once its poller
/// closes it), each namespace's file or device, and the rest.
fn open_files_needed(cfg: &Config) -> u64 {
    let namespaces: usize = cfg.subsystems.iter().map(|s| s.namespaces.len()).sum();
    let l = &cfg.limits;
    (l.connections + 2 * l.pending_connections + namespaces) as u64
        + FILES_PER_POLLER * cfg.pollers.count as u64
        + OTHER_FILES
}

/// Raises the limit of open files to what the configuration needs (the
/// hard limit at least: `limits.connections` should be what binds, not
/// the default soft limit of 1024); an error when it cannot.
fn raise_open_files_limit(cfg: &Config) -> Result<(), DaemonError> {
    let needed = open_files_needed(cfg);
    match rdmablk_common::usage::raise_open_files_limit_to(needed) {
        Ok(Some((soft, now))) => {
            tracing::debug!(needed, "open files limit raised from {soft} to {now}");
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(source) => Err(DaemonError::OpenFiles { needed, source }),
    }
}
