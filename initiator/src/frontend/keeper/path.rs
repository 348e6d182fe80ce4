//! One path's keeper: a thread of its own that keeps the path's association
//! (reconnecting with backoff after a loss, for up to ctrl-loss-tmo) and the
//! path's ANA state current, so that a gateway that stops answering holds
//! up only its own path: its blocking admin commands wait here, not in the
//! coordinator.

use super::EngineLink;
use crate::host::attach::difference;
use crate::host::engine::PathChange;
use crate::host::{HostError, NamespaceInfo, Params, PathState, Session};
use rdmablk_common::nvme::ana::AnaState;
use rdmablk_common::nvme::identify::NamespaceIdentifiers;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How often a lost path is tried while no path serves I/O: the backoff
/// spares a target that is down while other paths carry the I/O, not a
/// host whose I/O waits for any path at all.
const STARVED_RETRY: Duration = Duration::from_secs(1);
/// How often the path's ANA state is read (besides at a notice or after a
/// path status).
const ANA_POLL: Duration = Duration::from_secs(1);
/// How often the worker looks at its path when nothing wakes it.
const TICK: Duration = Duration::from_millis(100);
/// `cntlid` when the path has no association.
const NO_CONTROLLER: u32 = u32::MAX;

/// What the coordinator sees of a path.
pub(super) struct PathShared {
    pub(super) params: Params,
    /// The ANA state the engines follow.
    pub(super) state: Arc<PathState>,
    /// The path has a live association.
    live: AtomicBool,
    /// Its controller id, or [`NO_CONTROLLER`].
    cntlid: AtomicU32,
    /// The TLS cipher suite of its association, when encrypted.
    tls_cipher: Mutex<Option<String>>,
}

impl PathShared {
    /// Whether I/O may go through it now.
    pub(super) fn usable(&self) -> bool {
        self.live() && self.state.ana().is_usable()
    }

    pub(super) fn live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    pub(super) fn cntlid(&self) -> Option<u16> {
        let c = self.cntlid.load(Ordering::Acquire);
        (c != NO_CONTROLLER).then_some(c as u16)
    }

    /// The TLS cipher suite of its association, when encrypted.
    pub(super) fn tls_cipher(&self) -> Option<String> {
        self.tls_cipher
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_session(&self, s: Option<&Session>) {
        if let Some(s) = s {
            *self
                .tls_cipher
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = s.tls_cipher.clone();
        }
        self.live.store(s.is_some(), Ordering::Release);
        let c = s.map_or(NO_CONTROLLER, |s| s.cntlid as u32);
        self.cntlid.store(c, Ordering::Release);
    }
}

/// A path's keeper.
pub(super) struct PathKeeper {
    index: usize,
    pub(super) shared: Arc<PathShared>,
    pub(super) session: Option<Session>,
    /// The state last read from the controller (engines may have set the
    /// shared one meanwhile, after a path status).
    known: AnaState,
    /// Generation of the queues handed to the engines on this path.
    generation: u64,
    lost_since: Option<Instant>,
    /// When the last reconnect started.
    tried: Instant,
    /// When the next is due after the backoff.
    next_try: Instant,
    backoff: Duration,
    /// Reconnecting stopped: lost for longer than ctrl-loss-tmo.
    abandoned: bool,
    ns: NamespaceInfo,
    ids: NamespaceIdentifiers,
    ctrl_loss_tmo: Duration,
}

impl PathKeeper {
    /// Path `index`, live through `session`, for namespace `ns` (`ids`);
    /// its ANA state read at once.
    pub(super) fn new(
        index: usize,
        session: Session,
        ns: NamespaceInfo,
        ids: NamespaceIdentifiers,
        ctrl_loss_tmo: Duration,
    ) -> PathKeeper {
        let shared = Arc::new(PathShared {
            params: session.params().clone(),
            state: Arc::default(),
            live: AtomicBool::new(false),
            cntlid: AtomicU32::new(NO_CONTROLLER),
            tls_cipher: Mutex::default(),
        });
        shared.set_session(Some(&session));
        let mut p = PathKeeper {
            index,
            shared,
            session: Some(session),
            known: AnaState::Optimized,
            generation: 0,
            lost_since: None,
            tried: Instant::now(),
            next_try: Instant::now(),
            backoff: Duration::from_secs(1),
            abandoned: false,
            ns,
            ids,
            ctrl_loss_tmo,
        };
        let _ = p.read_ana();
        p
    }

    fn addr(&self) -> std::net::SocketAddr {
        self.shared.params.addr
    }

    /// Keeps the path until `stop`: `lost` brings the generations of queues
    /// the engines lost, `engines` take the new queues, `paths` are every
    /// path of the namespace (this one too). Returns the live association,
    /// if any (to shut down).
    pub(super) fn run(
        mut self,
        lost: Receiver<u64>,
        engines: Vec<EngineLink>,
        paths: Vec<Arc<PathShared>>,
        stop: Arc<AtomicBool>,
    ) -> Option<Session> {
        let mut last_ana = Instant::now();
        while !stop.load(Ordering::Acquire) {
            match lost.recv_timeout(TICK) {
                Ok(generation) if generation == self.generation => {
                    tracing::warn!(path = %self.addr(), "I/O queue lost");
                    self.lose(&engines);
                }
                Ok(_) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if self.session.as_ref().is_some_and(Session::is_lost) {
                self.lose(&engines);
            }
            let starved = !paths.iter().any(|p| p.usable());
            self.keep(&engines, starved);
            let notice = self.session.as_ref().is_some_and(Session::take_ana_notice);
            if notice {
                tracing::info!(path = %self.addr(), "ANA Change notice");
            }
            let due = last_ana.elapsed() >= ANA_POLL;
            if self.shared.state.take_recheck() || notice || due {
                if !self.read_ana() {
                    // A controller that does not answer within KATO: the
                    // association is as good as lost.
                    self.lose(&engines);
                }
                if due {
                    last_ana = Instant::now();
                }
            }
        }
        self.session.take()
    }

    /// The association is gone: the engines fail their queues on this path
    /// (commands in flight go to another path), its admin queue closes
    /// (which ends the controller on the target) and reconnecting starts.
    fn lose(&mut self, engines: &[EngineLink]) {
        let Some(session) = self.session.take() else {
            return;
        };
        self.shared.set_session(None);
        for e in engines {
            let _ = e.changes.send(PathChange::Lost(self.index));
            e.waker.wake();
        }
        tracing::warn!(
            path = %self.addr(),
            "association lost; reconnecting for up to {:?}",
            self.ctrl_loss_tmo
        );
        // After the engines moved on: ending the keep-alive may wait for
        // its command's deadline.
        drop(session);
        self.lost_since = Some(Instant::now());
        self.next_try = Instant::now();
        self.backoff = Duration::from_secs(1);
    }

    /// Reconnects when the path is lost and its next try is due: after
    /// the backoff, or a second after the last try while no path serves
    /// I/O (`starved`).
    fn keep(&mut self, engines: &[EngineLink], starved: bool) {
        let Some(since) = self.lost_since else {
            return;
        };
        let due =
            Instant::now() >= self.next_try || (starved && self.tried.elapsed() >= STARVED_RETRY);
        if self.abandoned || !due {
            return;
        }
        if since.elapsed() > self.ctrl_loss_tmo {
            tracing::error!(path = %self.addr(), "path lost for {:?} (ctrl-loss-tmo): no more reconnecting", self.ctrl_loss_tmo);
            self.abandoned = true;
            return;
        }
        self.tried = Instant::now();
        match self.reconnect(engines) {
            Ok(()) => {
                tracing::info!(
                    path = %self.addr(),
                    generation = self.generation,
                    "association re-established after {:?}",
                    since.elapsed()
                );
                self.lost_since = None;
                let _ = self.read_ana();
            }
            Err(e) => {
                let next = if starved {
                    format!("{STARVED_RETRY:?} (no path serves I/O)")
                } else {
                    format!("{:?}", self.backoff)
                };
                tracing::warn!(path = %self.addr(), "reconnect failed: {e}; next try in {next}");
                self.next_try = Instant::now() + self.backoff;
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    /// One attempt: a new association, the same namespace, and a new queue
    /// on it for every engine.
    fn reconnect(&mut self, engines: &[EngineLink]) -> Result<(), String> {
        let session = Session::connect(&self.shared.params).map_err(|e| e.to_string())?;
        let nsid = self.ns.nsid;
        let ns = session.namespace(nsid).map_err(|e| e.to_string())?;
        let ids = session.namespace_ids(nsid).map_err(|e| e.to_string())?;
        if let Some(why) = difference(&self.ns, &self.ids, &ns, &ids).or_else(|| {
            (ns.read_only != self.ns.read_only).then(|| "its write protection changed".into())
        }) {
            return Err(format!("namespace {nsid} changed: {why}"));
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
            let _ = e
                .changes
                .send(PathChange::Replaced(self.index, self.generation, q));
            e.waker.wake();
        }
        self.shared.set_session(Some(&session));
        self.session = Some(session);
        Ok(())
    }

    /// Reads the path's ANA state into what its engines follow; false when
    /// the controller did not answer.
    fn read_ana(&mut self) -> bool {
        let Some(s) = &self.session else {
            return true;
        };
        let addr = self.shared.params.addr;
        match s.ana_state(self.ns.nsid) {
            Ok(now) => {
                self.shared.state.set_ana(now);
                if now != self.known {
                    tracing::info!(path = %addr, "ANA state {} -> {now}", self.known);
                    self.known = now;
                }
                true
            }
            Err(e) => {
                tracing::warn!(path = %addr, "reading the ANA log: {e}");
                self.shared.state.set_ana(AnaState::Inaccessible);
                !matches!(e, HostError::Protocol(_) | HostError::Io(_))
            }
        }
    }
}
