//! What every front-end does around its engines: one engine thread per I/O
//! queue index (each with a queue on every path), and a coordinator that
//! waits for SIGINT/SIGTERM while keeping every path alive: a lost
//! association is re-established with backoff (engines get new queues on
//! that path) until ctrl-loss-tmo runs out for it, and each path's ANA
//! state is read from its controller (at once on an ANA Change notice or
//! after a path status, and every second) for the engines to follow. The front-end gives up only when
//! no path has been usable for ctrl-loss-tmo.

use super::state::{self, Connection, PathReport, StateFile};
use crate::host::attach::difference;
use crate::host::engine::{Driver, Engine, Lost, Reconnect, Replacement, Waker};
use crate::host::{Attachment, NamespaceInfo, Params, PathState, Paths, Session};
use rdmablk_common::nvme::ana::AnaState;
use rdmablk_common::nvme::identify::NamespaceIdentifiers;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MAX_BACKOFF: Duration = Duration::from_secs(10);
const TICK: Duration = Duration::from_millis(100);
/// How often each path's ANA state is read (besides after a path status).
const ANA_POLL: Duration = Duration::from_secs(1);

/// What the coordinator keeps of each engine.
struct EngineLink {
    replace: Sender<Replacement>,
    waker: Waker,
}

/// How many engines to run and how.
pub struct EngineSpec<'a> {
    /// Engines (I/O queue indices 1..=queues).
    pub queues: u16,
    /// Each engine's arena.
    pub arena_bytes: usize,
    /// Threads are named `name-Q`.
    pub name: &'a str,
    /// Spin on the rings instead of sleeping in them.
    pub busy_poll: bool,
}

/// The engine threads of a front-end, each returning its driver.
pub struct Engines<D> {
    links: Vec<EngineLink>,
    threads: Vec<JoinHandle<(Result<(), String>, D)>>,
    lost: Receiver<Lost>,
}

impl<D: Driver + Send + 'static> Engines<D> {
    /// Opens an I/O queue for each engine on every path of `keeper` and runs
    /// the engines of `spec`, each with the driver `make(queue index, engine
    /// waker)` builds.
    pub fn spawn<F>(keeper: &Keeper, spec: EngineSpec, mut make: F) -> Result<Engines<D>, String>
    where
        F: FnMut(usize, Waker) -> Result<D, String>,
    {
        let EngineSpec {
            queues: n,
            arena_bytes,
            name,
            busy_poll,
        } = spec;
        let (lost_tx, lost) = mpsc::channel();
        let mut links = Vec::new();
        let mut threads = Vec::new();
        for q in 0..n as usize {
            let mut queues = Vec::new();
            for p in &keeper.paths {
                let session = p
                    .session
                    .as_ref()
                    .expect("every path is connected at start");
                let queue = session
                    .open_io_queue(q as u16 + 1)
                    .map_err(|e| format!("{}: {e}", p.params.addr))?;
                queues.push((queue, p.state.clone()));
            }
            let (replace, replacements) = mpsc::channel();
            let reconnect = Reconnect {
                index: q,
                lost: lost_tx.clone(),
                replacements,
            };
            let engine = Engine::new(Paths::new(queues), arena_bytes, TICK, reconnect)
                .map_err(|e| format!("I/O engine: {e}"))?
                .with_busy_poll(busy_poll);
            let mut driver = make(q, engine.waker())?;
            links.push(EngineLink {
                replace,
                waker: engine.waker(),
            });
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{}", q + 1))
                    .spawn(move || (engine.run(&mut driver), driver))
                    .map_err(|e| e.to_string())?,
            );
        }
        Ok(Engines {
            links,
            threads,
            lost,
        })
    }

    /// Wakes every engine (to notice a stop or a give-up).
    pub fn wake_all(&self) {
        for l in &self.links {
            l.waker.wake();
        }
    }

    /// Waits for every engine: the first error, if any, and the drivers.
    pub fn join(self) -> (Option<String>, Vec<D>) {
        let mut failure = None;
        let mut drivers = Vec::new();
        for t in self.threads {
            match t.join() {
                Ok((r, d)) => {
                    if let Err(e) = r {
                        failure = failure.or(Some(e));
                    }
                    drivers.push(d);
                }
                Err(_) => failure = failure.or(Some("an engine thread panicked".into())),
            }
        }
        (failure, drivers)
    }

    fn any_finished(&self) -> bool {
        self.threads.iter().any(|t| t.is_finished())
    }

    fn all_finished(&self) -> bool {
        self.threads.iter().all(|t| t.is_finished())
    }
}

/// When [`Keeper::watch`] ends.
pub enum Until<'a> {
    /// At SIGINT or SIGTERM (logged with this text); an engine that ends
    /// before is an error. Signals must be blocked in every thread.
    Signal(&'a str),
    /// When every engine has ended (signals are someone else's).
    EnginesDone,
}

/// What [`Keeper::watch`] ended with.
pub struct Watched {
    /// Ok on SIGINT/SIGTERM; Err when an engine ended on its own or no path
    /// was usable for ctrl-loss-tmo.
    pub result: Result<(), String>,
    /// The live associations (to shut down).
    pub sessions: Vec<Session>,
}

/// One path as the coordinator keeps it.
struct PathKeeper {
    params: Params,
    session: Option<Session>,
    state: Arc<PathState>,
    /// The state last read from the controller (engines may have set
    /// `state` meanwhile, after a path status).
    known: AnaState,
    /// Generation of the queues handed to the engines on this path.
    generation: u64,
    lost_since: Option<Instant>,
    next_try: Instant,
    backoff: Duration,
    /// Reconnecting stopped: lost for longer than ctrl-loss-tmo.
    abandoned: bool,
}

impl PathKeeper {
    /// Whether I/O may go through it now.
    fn usable(&self) -> bool {
        self.session.is_some() && self.state.ana().is_usable()
    }
}

/// Keeps every path's association alive and its ANA state current.
pub struct Keeper {
    paths: Vec<PathKeeper>,
    /// What `rdmablk list` shows of this process, once published.
    published: Option<(StateFile, String)>,
    ns: NamespaceInfo,
    ids: NamespaceIdentifiers,
    ctrl_loss_tmo: Duration,
    /// Since when no path has been usable.
    unusable_since: Option<Instant>,
    last_ana: Instant,
}

impl Keeper {
    /// Keeps the paths of `a`, reading their ANA states first.
    pub fn new(a: Attachment, ctrl_loss_tmo: Duration) -> Keeper {
        let now = Instant::now();
        let mut k = Keeper {
            paths: a
                .sessions
                .into_iter()
                .map(|s| PathKeeper {
                    params: s.params().clone(),
                    session: Some(s),
                    state: Arc::default(),
                    known: AnaState::Optimized,
                    generation: 0,
                    lost_since: None,
                    next_try: now,
                    backoff: Duration::from_secs(1),
                    abandoned: false,
                })
                .collect(),
            published: None,
            ns: a.ns,
            ids: a.ids,
            ctrl_loss_tmo,
            unusable_since: None,
            last_ana: now,
        };
        for i in 0..k.paths.len() {
            k.read_ana(i);
        }
        k
    }

    /// Shows this connection, served by `frontend`, to `rdmablk list` from
    /// now on.
    pub fn publish(&mut self, frontend: &str) {
        match StateFile::new() {
            Ok(f) => {
                self.published = Some((f, frontend.to_string()));
                self.report();
            }
            Err(e) => tracing::warn!(
                "{}: {e}; rdmablk list will not show this connection",
                state::run_dir().display()
            ),
        }
    }

    /// Updates what `rdmablk list` shows, when published.
    fn report(&mut self) {
        let Some((file, frontend)) = &mut self.published else {
            return;
        };
        let c = Connection {
            pid: std::process::id(),
            subnqn: self.paths[0].params.subnqn.clone(),
            nsid: self.ns.nsid,
            frontend: frontend.clone(),
            paths: self
                .paths
                .iter()
                .map(|p| PathReport {
                    transport: p.params.transport.name().to_string(),
                    address: p.params.addr.to_string(),
                    cntlid: p.session.as_ref().map(|s| s.cntlid),
                    ana: p.state.ana().name().to_string(),
                    live: p.session.is_some(),
                })
                .collect(),
        };
        file.update(&c);
    }

    /// Runs until `until`, or until no path has been usable for
    /// ctrl-loss-tmo.
    pub fn watch<D: Driver + Send + 'static>(
        mut self,
        engines: &Engines<D>,
        until: Until,
    ) -> Watched {
        let result = self.watch_until_done(engines, until);
        Watched {
            result,
            sessions: self
                .paths
                .iter_mut()
                .filter_map(|p| p.session.take())
                .collect(),
        }
    }

    fn watch_until_done<D: Driver + Send + 'static>(
        &mut self,
        engines: &Engines<D>,
        until: Until,
    ) -> Result<(), String> {
        let mut set = nix::sys::signal::SigSet::empty();
        set.add(nix::sys::signal::Signal::SIGINT);
        set.add(nix::sys::signal::Signal::SIGTERM);
        let timeout = libc::timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        loop {
            match until {
                Until::Signal(on_signal) => {
                    // SAFETY: sigtimedwait reads the signal set and the
                    // timeout, both valid.
                    let sig =
                        unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &timeout) };
                    if sig > 0 {
                        tracing::info!("signal {sig}: {on_signal}");
                        return Ok(());
                    }
                    if engines.any_finished() {
                        return Err("an I/O engine ended".into());
                    }
                }
                Until::EnginesDone => {
                    if engines.all_finished() {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            while let Ok((engine, path, generation)) = engines.lost.try_recv() {
                if self.paths[path].generation == generation && self.paths[path].session.is_some() {
                    tracing::warn!(queue = engine + 1, path = %self.paths[path].params.addr, "I/O queue lost");
                    self.lose(path);
                }
            }
            for i in 0..self.paths.len() {
                if self.paths[i].session.as_ref().is_some_and(Session::is_lost) {
                    self.lose(i);
                }
                self.keep(i, &engines.links);
            }
            let due = self.last_ana.elapsed() >= ANA_POLL;
            for i in 0..self.paths.len() {
                let p = &self.paths[i];
                let notice = p.session.as_ref().is_some_and(Session::take_ana_notice);
                if notice {
                    tracing::info!(path = %p.params.addr, "ANA Change notice");
                }
                if p.state.take_recheck() || notice || due {
                    self.read_ana(i);
                }
            }
            if due {
                self.last_ana = Instant::now();
            }
            self.report();
            if self.paths.iter().any(PathKeeper::usable) {
                self.unusable_since = None;
                continue;
            }
            let since = *self.unusable_since.get_or_insert_with(Instant::now);
            if since.elapsed() > self.ctrl_loss_tmo {
                return Err(format!(
                    "no path was usable for {:?} (ctrl-loss-tmo)",
                    self.ctrl_loss_tmo
                ));
            }
        }
    }

    /// Path `i`'s association is gone: its admin queue closes (which ends
    /// the controller on the target) and reconnecting starts.
    fn lose(&mut self, i: usize) {
        let p = &mut self.paths[i];
        if p.session.take().is_none() {
            return;
        }
        tracing::warn!(
            path = %p.params.addr,
            "association lost; reconnecting for up to {:?}",
            self.ctrl_loss_tmo
        );
        p.lost_since = Some(Instant::now());
        p.next_try = Instant::now();
        p.backoff = Duration::from_secs(1);
    }

    /// Reconnects path `i` when it is lost and its next try is due.
    fn keep(&mut self, i: usize, engines: &[EngineLink]) {
        let p = &mut self.paths[i];
        let Some(since) = p.lost_since else {
            return;
        };
        if p.abandoned || Instant::now() < p.next_try {
            return;
        }
        if since.elapsed() > self.ctrl_loss_tmo {
            tracing::error!(path = %p.params.addr, "path lost for {:?} (ctrl-loss-tmo): no more reconnecting", self.ctrl_loss_tmo);
            p.abandoned = true;
            return;
        }
        match self.reconnect(i, engines) {
            Ok(()) => {
                let p = &mut self.paths[i];
                tracing::info!(
                    path = %p.params.addr,
                    generation = p.generation,
                    "association re-established after {:?}",
                    since.elapsed()
                );
                p.lost_since = None;
                self.read_ana(i);
            }
            Err(e) => {
                let p = &mut self.paths[i];
                tracing::warn!(path = %p.params.addr, "reconnect failed: {e}; next try in {:?}", p.backoff);
                p.next_try = Instant::now() + p.backoff;
                p.backoff = (p.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// One attempt: a new association on path `i`, the same namespace, and
    /// a new queue on it for every engine.
    fn reconnect(&mut self, i: usize, engines: &[EngineLink]) -> Result<(), String> {
        let p = &mut self.paths[i];
        let session = Session::connect(&p.params).map_err(|e| e.to_string())?;
        let ns = session.namespace(self.ns.nsid).map_err(|e| e.to_string())?;
        let ids = session
            .namespace_ids(self.ns.nsid)
            .map_err(|e| e.to_string())?;
        if let Some(why) = difference(&self.ns, &self.ids, &ns, &ids).or_else(|| {
            (ns.read_only != self.ns.read_only).then(|| "its write protection changed".into())
        }) {
            return Err(format!("namespace {} changed: {why}", ns.nsid));
        }
        let mut queues = Vec::new();
        for q in 0..engines.len() {
            queues.push(
                session
                    .open_io_queue(q as u16 + 1)
                    .map_err(|e| e.to_string())?,
            );
        }
        p.generation += 1;
        for (e, q) in engines.iter().zip(queues) {
            let _ = e.replace.send((i, p.generation, q));
            e.waker.wake();
        }
        p.session = Some(session);
        Ok(())
    }

    /// Reads path `i`'s ANA state into what its engines follow.
    fn read_ana(&mut self, i: usize) {
        let nsid = self.ns.nsid;
        let p = &mut self.paths[i];
        let Some(s) = &p.session else {
            return;
        };
        match s.ana_state(nsid) {
            Ok(now) => {
                p.state.set_ana(now);
                if now != p.known {
                    tracing::info!(path = %p.params.addr, "ANA state {} -> {now}", p.known);
                    p.known = now;
                }
            }
            Err(e) => {
                tracing::warn!(path = %p.params.addr, "reading the ANA log: {e}");
                p.state.set_ana(AnaState::Inaccessible);
            }
        }
    }
}
