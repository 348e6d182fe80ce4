//! What every front-end does around its engines: one engine thread per I/O
//! queue index (each with a queue on every path), a keeper thread per path
//! (`path`: it re-establishes a lost association with backoff, engines
//! getting new queues on that path, until ctrl-loss-tmo runs out for it, and
//! reads the path's ANA state at an ANA Change notice, after a path status
//! and every second, for the engines to follow), and a coordinator that
//! waits for SIGINT/SIGTERM and gives the front-end up only when no path
//! has been usable for ctrl-loss-tmo.

mod path;

use super::state::{self, Connection, PathReport, StateFile};
use crate::host::engine::{Driver, Engine, Lost, PathChange, Reconnect, Waker};
use crate::host::{Attachment, Paths, Session};
use crate::signals::StopSignals;
use path::{PathKeeper, PathShared};
use rdmablk_common::spin::PollMode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TICK: Duration = Duration::from_millis(100);

/// What the coordinator keeps of each engine.
struct EngineLink {
    changes: Sender<PathChange>,
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
    /// How the engines wait for work.
    pub poll: PollMode,
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
            poll,
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
                    .map_err(|e| format!("{}: {e}", p.shared.params.addr))?;
                queues.push((queue, p.shared.state.clone()));
            }
            let (changes_tx, changes) = mpsc::channel();
            let reconnect = Reconnect {
                index: q,
                lost: lost_tx.clone(),
                changes,
            };
            let engine = Engine::new(Paths::new(queues), arena_bytes, TICK, reconnect)
                .map_err(|e| format!("I/O engine: {e}"))?
                .with_poll_mode(poll);
            let mut driver = make(q, engine.waker())?;
            links.push(EngineLink {
                changes: changes_tx,
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

/// Keeps every path's association alive and its ANA state current, a
/// thread per path ([`path::PathKeeper`]), and decides when the front-end
/// gives up.
pub struct Keeper {
    paths: Vec<PathKeeper>,
    /// What `rdmablk list` shows of this process, once published.
    published: Option<(StateFile, String)>,
    nsid: u32,
    ctrl_loss_tmo: Duration,
}

impl Keeper {
    /// Keeps the paths of `a`, reading their ANA states first.
    pub fn new(a: Attachment, ctrl_loss_tmo: Duration) -> Keeper {
        let (ns, ids) = (a.ns, a.ids);
        Keeper {
            paths: a
                .sessions
                .into_iter()
                .enumerate()
                .map(|(i, s)| PathKeeper::new(i, s, ns, ids, ctrl_loss_tmo))
                .collect(),
            published: None,
            nsid: ns.nsid,
            ctrl_loss_tmo,
        }
    }

    /// Shows this connection, served by `frontend`, to `rdmablk list` from
    /// now on.
    pub fn publish(&mut self, frontend: &str) {
        match StateFile::new() {
            Ok(f) => {
                self.published = Some((f, frontend.to_string()));
                let shared: Vec<Arc<PathShared>> =
                    self.paths.iter().map(|p| p.shared.clone()).collect();
                self.report(&shared);
            }
            Err(e) => tracing::warn!(
                "{}: {e}; rdmablk list will not show this connection",
                state::run_dir().display()
            ),
        }
    }

    /// Updates what `rdmablk list` shows, when published.
    fn report(&mut self, paths: &[Arc<PathShared>]) {
        let Some((file, frontend)) = &mut self.published else {
            return;
        };
        let c = Connection {
            pid: std::process::id(),
            subnqn: paths[0].params.subnqn.clone(),
            nsid: self.nsid,
            frontend: frontend.clone(),
            paths: paths
                .iter()
                .map(|p| PathReport {
                    transport: p.params.transport.name().to_string(),
                    address: p.params.addr.to_string(),
                    cntlid: p.cntlid(),
                    ana: p.state.ana().name().to_string(),
                    live: p.live(),
                    tls: p.tls_cipher(),
                })
                .collect(),
        };
        file.update(&c);
    }

    /// Runs until `until`, or until no path has been usable for
    /// ctrl-loss-tmo; each path is kept by a thread of its own meanwhile.
    pub fn watch<D: Driver + Send + 'static>(
        mut self,
        engines: &Engines<D>,
        until: Until,
    ) -> Watched {
        let stop = Arc::new(AtomicBool::new(false));
        let shared: Vec<Arc<PathShared>> = self.paths.iter().map(|p| p.shared.clone()).collect();
        let mut lost = Vec::new();
        let mut threads = Vec::new();
        for (i, p) in std::mem::take(&mut self.paths).into_iter().enumerate() {
            let (tx, rx) = mpsc::channel();
            let links: Vec<EngineLink> = engines
                .links
                .iter()
                .map(|l| EngineLink {
                    changes: l.changes.clone(),
                    waker: l.waker.clone(),
                })
                .collect();
            lost.push(tx);
            let stop = stop.clone();
            let paths = shared.clone();
            match std::thread::Builder::new()
                .name(format!("path-{}", i + 1))
                .spawn(move || p.run(rx, links, paths, stop))
            {
                Ok(t) => threads.push(t),
                Err(e) => tracing::error!("cannot start a path's keeper: {e}"),
            }
        }
        let result = self.watch_until_done(engines, until, &shared, &lost);
        stop.store(true, Ordering::Release);
        let sessions = threads
            .into_iter()
            .filter_map(|t| t.join().ok().flatten())
            .collect();
        Watched { result, sessions }
    }

    fn watch_until_done<D: Driver + Send + 'static>(
        &mut self,
        engines: &Engines<D>,
        until: Until,
        paths: &[Arc<PathShared>],
        lost: &[Sender<u64>],
    ) -> Result<(), String> {
        let signals = match until {
            Until::Signal(_) => Some(StopSignals::new()?),
            Until::EnginesDone => None,
        };
        let mut unusable_since: Option<Instant> = None;
        loop {
            match until {
                Until::Signal(on_signal) => {
                    let signals = signals.as_ref().expect("made for Until::Signal");
                    if let Some(sig) = signals.wait(Duration::from_millis(100)) {
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
                tracing::debug!(queue = engine + 1, path, generation, "queue loss reported");
                let _ = lost[path].send(generation);
            }
            self.report(paths);
            if paths.iter().any(|p| p.usable()) {
                unusable_since = None;
                continue;
            }
            let since = *unusable_since.get_or_insert_with(Instant::now);
            if since.elapsed() > self.ctrl_loss_tmo {
                return Err(format!(
                    "no path was usable for {:?} (ctrl-loss-tmo)",
                    self.ctrl_loss_tmo
                ));
            }
        }
    }
}
