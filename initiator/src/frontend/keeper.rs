//! What every front-end does around its engines: one engine thread per I/O
//! queue, and a coordinator that waits for SIGINT/SIGTERM while keeping the
//! association alive (a lost one is re-established with backoff, engines
//! get new queues, until ctrl-loss-tmo runs out).

use crate::host::engine::{Driver, Engine, Reconnect, Waker};
use crate::host::{IoQueue, NamespaceInfo, Params, Session};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MAX_BACKOFF: Duration = Duration::from_secs(10);
const TICK: Duration = Duration::from_millis(100);

/// What the coordinator keeps of each engine.
struct EngineLink {
    replace: Sender<(u64, IoQueue)>,
    waker: Waker,
}

/// The engine threads of a front-end.
pub struct Engines {
    links: Vec<EngineLink>,
    threads: Vec<JoinHandle<Result<(), String>>>,
    lost: Receiver<(usize, u64)>,
}

impl Engines {
    /// Opens I/O queues 1..=`n` of `session` and runs one engine thread
    /// (named `name-Q`, arena of `arena_bytes`) per queue with the driver
    /// `make(queue index, engine waker)` builds.
    pub fn spawn<D, F>(
        session: &Session,
        n: u16,
        arena_bytes: usize,
        name: &str,
        mut make: F,
    ) -> Result<Engines, String>
    where
        D: Driver + Send + 'static,
        F: FnMut(usize, Waker) -> Result<D, String>,
    {
        let (lost_tx, lost) = mpsc::channel();
        let mut links = Vec::new();
        let mut threads = Vec::new();
        for q in 0..n as usize {
            let queue = session
                .open_io_queue(q as u16 + 1)
                .map_err(|e| e.to_string())?;
            let (replace, replacements) = mpsc::channel();
            let engine = Engine::new(queue, arena_bytes, TICK)
                .map_err(|e| format!("I/O engine: {e}"))?
                .with_reconnect(Reconnect {
                    index: q,
                    lost: lost_tx.clone(),
                    replacements,
                });
            let mut driver = make(q, engine.waker())?;
            links.push(EngineLink {
                replace,
                waker: engine.waker(),
            });
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{}", q + 1))
                    .spawn(move || engine.run(&mut driver))
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

    /// Waits for every engine; the first error, if any.
    pub fn join(self) -> Option<String> {
        let mut failure = None;
        for t in self.threads {
            match t.join() {
                Ok(Err(e)) => failure = failure.or(Some(e)),
                Err(_) => failure = failure.or(Some("an engine thread panicked".into())),
                Ok(Ok(())) => {}
            }
        }
        failure
    }
}

/// What [`Keeper::watch`] ended with.
pub struct Watched {
    /// Ok on SIGINT/SIGTERM; Err when an engine ended on its own or the
    /// association stayed lost past ctrl-loss-tmo.
    pub result: Result<(), String>,
    /// The live association, if there is one (to shut down).
    pub session: Option<Session>,
}

/// Keeps the association alive: notices its loss (a queue failed, or
/// keep-alive did) and re-establishes it with backoff.
pub struct Keeper {
    params: Params,
    session: Option<Session>,
    ns: NamespaceInfo,
    /// Generation of the queues handed to the engines.
    generation: u64,
    lost_since: Option<Instant>,
    next_try: Instant,
    backoff: Duration,
    ctrl_loss_tmo: Duration,
}

impl Keeper {
    pub fn new(session: Session, ns: NamespaceInfo, ctrl_loss_tmo: Duration) -> Keeper {
        Keeper {
            params: session.params().clone(),
            session: Some(session),
            ns,
            generation: 0,
            lost_since: None,
            next_try: Instant::now(),
            backoff: Duration::from_secs(1),
            ctrl_loss_tmo,
        }
    }

    /// Runs until SIGINT/SIGTERM (logged with `on_signal`), an engine ends
    /// on its own, or the association stays lost past ctrl-loss-tmo.
    /// Signals must be blocked in every thread.
    pub fn watch(mut self, engines: &Engines, on_signal: &str) -> Watched {
        let result = self.watch_until_done(engines, on_signal);
        Watched {
            result,
            session: self.session.take(),
        }
    }

    fn watch_until_done(&mut self, engines: &Engines, on_signal: &str) -> Result<(), String> {
        let mut set = nix::sys::signal::SigSet::empty();
        set.add(nix::sys::signal::Signal::SIGINT);
        set.add(nix::sys::signal::Signal::SIGTERM);
        let timeout = libc::timespec {
            tv_sec: 0,
            tv_nsec: 200_000_000,
        };
        loop {
            // SAFETY: sigtimedwait reads the signal set and the timeout, both valid.
            let sig = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &timeout) };
            if sig > 0 {
                tracing::info!("signal {sig}: {on_signal}");
                return Ok(());
            }
            if engines.threads.iter().any(|t| t.is_finished()) {
                return Err("an I/O engine ended".into());
            }
            let mut lost_now = self.session.as_ref().is_some_and(Session::is_lost);
            while let Ok((engine, generation)) = engines.lost.try_recv() {
                if generation == self.generation {
                    tracing::warn!(queue = engine + 1, "I/O queue lost");
                    lost_now = true;
                }
            }
            if lost_now && self.lost_since.is_none() {
                tracing::warn!(
                    "association lost; reconnecting for up to {:?}",
                    self.ctrl_loss_tmo
                );
                self.lost_since = Some(Instant::now());
                self.next_try = Instant::now();
                self.backoff = Duration::from_secs(1);
                // Closing the admin queue ends the old controller on the target.
                self.session = None;
            }
            let Some(since) = self.lost_since else {
                continue;
            };
            if since.elapsed() > self.ctrl_loss_tmo {
                return Err(format!(
                    "the association stayed lost for {:?} (ctrl-loss-tmo)",
                    self.ctrl_loss_tmo
                ));
            }
            if Instant::now() >= self.next_try {
                match self.reconnect(&engines.links) {
                    Ok(()) => {
                        tracing::info!(
                            generation = self.generation,
                            "association re-established after {:?}",
                            since.elapsed()
                        );
                        self.lost_since = None;
                    }
                    Err(e) => {
                        tracing::warn!("reconnect failed: {e}; next try in {:?}", self.backoff);
                        self.next_try = Instant::now() + self.backoff;
                        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                    }
                }
            }
        }
    }

    /// One attempt: a new association, and a new queue for every engine.
    fn reconnect(&mut self, engines: &[EngineLink]) -> Result<(), String> {
        let params = self.params.clone();
        let session = Session::connect(&params).map_err(|e| e.to_string())?;
        let ns = session.namespace(self.ns.nsid).map_err(|e| e.to_string())?;
        if ns != self.ns {
            return Err(format!(
                "namespace {} changed ({ns:?}, was {:?})",
                ns.nsid, self.ns
            ));
        }
        let mut queues = Vec::new();
        for q in 0..engines.len() {
            queues.push(
                session
                    .open_io_queue(q as u16 + 1)
                    .map_err(|e| e.to_string())?,
            );
        }
        self.generation += 1;
        for (e, q) in engines.iter().zip(queues) {
            let _ = e.replace.send((self.generation, q));
            e.waker.wake();
        }
        self.session = Some(session);
        Ok(())
    }
}
