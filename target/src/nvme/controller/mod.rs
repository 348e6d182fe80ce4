//! The NVMe controller as NVMe over Fabrics sees it: Connect (association of
//! queues with a controller), properties, keep-alive, and the admin command
//! set. Transport independent: a transport hands in a command and its data
//! and gets back a status, dword 0 and the data to return.
//!
//! One file per concern, as nvmet has one per command family: `connect`
//! (Connect and the queue's association), `fabrics` (properties and
//! keep-alive), `admin` (the admin command dispatch), `identify`,
//! `log_page`, `features`, `aen` (asynchronous events), `reservation` (its
//! notices, mask and persistence) and `transfer` (the
//! data each command calls for).

mod admin;
pub mod aen;
mod connect;
mod fabrics;
mod features;
mod identify;
mod log_page;
mod reservation;
mod transfer;

pub use connect::{connect, Association};
pub use transfer::{admin_transfer_len, fabrics_transfer_len, TransferLen};

use crate::base::admission::{Gauge, Permit};
use crate::base::offload::Job;
use crate::nvme::fabric::TransportCaps;
use crate::nvme::port::{Arrival, TlsPeer};
use crate::nvme::subsystem::{Registry, Subsystem};
use crate::service::ana::AnaStates;
use crate::service::reservation::ptpl::Persistent;
use aen::Events;
use rdmablk_common::nvme::Status;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// I/O queues a controller grants at most.
pub const MAX_IO_QUEUES: u16 = 64;
/// Outstanding Asynchronous Event Requests at most (AERL + 1).
pub const MAX_AERS: usize = 4;
/// NVMe version 2.0.0: the mandatory features of NVMe Base 2.0 for an I/O
/// controller over Fabrics are implemented (the README lists them).
const VERSION: u32 = 0x0002_0000;
/// Command Retry Delay Times 1 to 3 (Identify Controller CRDT1..3), in
/// 100 ms units: 100 ms, 1 s, 10 s.
pub const CRDT: [u16; 3] = [1, 10, 100];

/// Controllers ended so far, by any cause.
static ENDS: AtomicU64 = AtomicU64::new(0);
/// Told when a controller ends (the daemon wakes its pollers, which close
/// the ended controller's queues at once).
static ON_END: OnceLock<Box<dyn Fn() + Send + Sync>> = OnceLock::new();

/// The number of controllers ended so far: a queue's poller that sees it
/// move checks its queues' controllers.
pub fn ends() -> u64 {
    ENDS.load(Ordering::Acquire)
}

/// Sets what a controller's end tells (once, at start).
pub fn on_end(tell: impl Fn() + Send + Sync + 'static) {
    let _ = ON_END.set(Box::new(tell));
}

/// A controller: one association of a host with a subsystem.
pub struct Controller {
    pub cntlid: u16,
    pub subsys: Arc<Subsystem>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    registry: Arc<Registry>,
    caps: TransportCaps,
    /// Where the admin queue reached this target: the listener's ANA states
    /// (which this controller reports), the local address (for discovery
    /// entries of wildcard listeners).
    arrival: Arrival,
    /// Keep-alive timeout in ms; 0 disables it.
    kato_ms: AtomicU32,
    /// Arena bytes all queues of the association hold (its budget's gauge).
    pub buffers: Arc<Gauge>,
    /// This association's place among its host's (limits.associations_per_host).
    _host: Permit,
    /// Milliseconds since `epoch` at the last Keep Alive.
    last_keep_alive: AtomicU64,
    epoch: Instant,
    /// 0 while the association lives; then 1 + milliseconds since `epoch`
    /// when it ended.
    ended_ms: AtomicU64,
    /// Bumped (under the state lock) by each controller reset or shutdown:
    /// I/O queues connected under an older generation are deleted. Read
    /// without the lock on every I/O command.
    generation: AtomicU32,
    state: Mutex<State>,
}

struct State {
    cc: u32,
    csts: u32,
    /// Since when the controller waits for CC.EN = 1 (after its Connect or a
    /// reset); `None` while enabled.
    disabled_since: Option<Instant>,
    /// I/O queues granted (Set Features Number of Queues).
    io_queues: u16,
    /// Which I/O queue ids are connected.
    connected: Vec<bool>,
    /// Advanced Command Retry Enable (Host Behavior Support).
    acre: bool,
    features: HashMap<u8, u32>,
    events: Events,
    notices: reservation::Notices,
}

/// A refused Connect: status, CQE dword 0 and why, for the log.
#[derive(Debug)]
pub struct Refusal {
    pub status: Status,
    pub dw0: u32,
    pub reason: String,
}

/// The outcome of a command the controller executed.
pub enum Reply {
    /// Completes now with status, CQE dwords 0 and 1, and data for the host.
    Done {
        status: Status,
        dw0: u32,
        dw1: u32,
        data: Vec<u8>,
    },
    /// An Asynchronous Event Request: held until an event (or the end of the
    /// association).
    Held,
    /// Executes again once this job, started off the poller, has run.
    After(Job),
    /// Completes once this namespace's reservation state is written
    /// (success), or could not be (Internal Error).
    Persist(Arc<dyn Persistent>),
}

impl Reply {
    fn status(status: Status) -> Reply {
        Reply::Done {
            status,
            dw0: 0,
            dw1: 0,
            data: Vec::new(),
        }
    }

    fn ok(dw0: u32) -> Reply {
        Reply::Done {
            status: Status::SUCCESS,
            dw0,
            dw1: 0,
            data: Vec::new(),
        }
    }

    fn data(data: Vec<u8>) -> Reply {
        Reply::Done {
            status: Status::SUCCESS,
            dw0: 0,
            dw1: 0,
            data,
        }
    }
}

impl Controller {
    /// What the transport of the admin queue serves.
    pub fn caps(&self) -> TransportCaps {
        self.caps
    }

    /// The TLS session its admin queue runs in, if it is encrypted.
    pub fn tls(&self) -> Option<&TlsPeer> {
        self.arrival.tls.as_deref()
    }

    /// The ANA states of the listener the controller came through.
    #[inline]
    pub fn ana(&self) -> &AnaStates {
        &self.arrival.ana
    }

    /// Whether the controller came through the listener whose states are `ana`.
    pub fn reports(&self, ana: &Arc<AnaStates>) -> bool {
        Arc::ptr_eq(&self.arrival.ana, ana)
    }

    /// Queues connected to the controller: its admin queue and I/O queues.
    pub fn queues_connected(&self) -> usize {
        let st = self.state.lock().expect("controller state");
        1 + st.connected.iter().filter(|&&c| c).count()
    }

    /// Whether the association is still alive (no keep-alive expiry, no
    /// admin queue loss).
    pub fn is_live(&self) -> bool {
        self.ended_ms.load(Ordering::Acquire) == 0
    }

    /// Whether the association ended more than `grace` ago.
    pub fn ended_for(&self, grace: Duration) -> bool {
        let ended = self.ended_ms.load(Ordering::Acquire);
        ended != 0 && (self.now_ms() + 1).saturating_sub(ended) > grace.as_millis() as u64
    }

    /// Ends the association: every queue of it closes.
    pub fn kill(&self, why: &str) {
        let now = self.now_ms() + 1;
        if self
            .ended_ms
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            tracing::info!(cntlid = self.cntlid, subsystem = %self.subsys.nqn, host = %self.hostnqn, "controller ends: {why}");
            ENDS.fetch_add(1, Ordering::AcqRel);
            if let Some(tell) = ON_END.get() {
                tell();
            }
        }
    }

    /// Bumped by each controller reset or shutdown.
    pub fn generation(&self) -> u32 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the controller has waited for CC.EN = 1 longer than `limit`.
    pub fn enable_overdue(&self, limit: Duration) -> bool {
        let st = self.state.lock().expect("controller state");
        st.disabled_since.is_some_and(|t| t.elapsed() > limit)
    }

    /// Whether the host enabled Advanced Command Retry (Host Behavior Support).
    pub fn acre(&self) -> bool {
        self.state.lock().expect("controller state").acre
    }

    /// The Command Retry Delay for `status`: once the host enabled Advanced
    /// Command Retry (Host Behavior Support), a retryable status names a
    /// CRDT (NVMe Base 2.0, 4.6.1.1 and 5.27.1.18); otherwise 0.
    pub fn crd(&self, status: Status) -> u8 {
        if !status.is_retryable() || !self.state.lock().expect("controller state").acre {
            return 0;
        }
        if status == Status::NAMESPACE_NOT_READY {
            2
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests;
