//! [`Controller`]: an enabled association (admin queue and I/O queues),
//! opened as [`Opts`] say, and discovery.

use super::{other, Queue, DEFAULT_IN_CAPSULE};
use rdmablk_common::fabrics::discovery::{parse_log_entries, parse_log_header};
use rdmablk_common::fabrics::{
    DiscoveryEntry, DISCOVERY_ENTRY_LEN, DISCOVERY_LOG_HEADER_LEN, DISCOVERY_NQN,
};
use rdmablk_common::nvme::identify::{cns, ControllerId};
use rdmablk_common::nvme::log::lid::DISCOVERY as DISCOVERY_LOG;
use rdmablk_common::nvme::{feature, property};
use rdmablk_common::tcp::Digests;
use std::io;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How [`Controller::open`] sets up the association.
#[derive(Clone, Debug)]
pub struct Opts {
    pub io_queues: u16,
    /// I/O submission queue size, 0's based.
    pub sqsize: u16,
    pub kato_ms: u32,
    /// Send Keep Alive every KATO/2 from a background thread, as the Linux
    /// host does. Off for tests that want a silent host.
    pub auto_keep_alive: bool,
    pub digests: Digests,
    pub hostid: [u8; 16],
    /// Connect Attributes of every queue's Connect (bit 2 disables SQ
    /// flow control, as `nvme connect --disable-sqflow` does).
    pub cattr: u8,
    /// DH-HMAC-CHAP secrets, for queues whose Connect response asks.
    pub dhchap: Option<crate::dhchap::Secrets>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            io_queues: 1,
            sqsize: 127,
            kato_ms: 5000,
            auto_keep_alive: true,
            digests: Digests::default(),
            hostid: *b"rdmablk-test-hid",
            cattr: 0,
            dhchap: None,
        }
    }
}

/// Options for a silent host: KATO 0 and no Keep Alive, so that nothing
/// but what the test sends goes to the target.
pub fn quiet() -> Opts {
    Opts {
        kato_ms: 0,
        auto_keep_alive: false,
        ..Opts::default()
    }
}

/// Authenticates a queue whose Connect completion `dw0` has ATR set.
fn authenticate_if_asked(
    q: &mut Queue,
    dw0: u32,
    qid: u16,
    opts: &Opts,
    hostnqn: &str,
    subnqn: &str,
) -> io::Result<()> {
    if dw0 & 1 << 17 == 0 {
        return Ok(());
    }
    let Some(s) = &opts.dhchap else {
        return Err(other(format!(
            "queue {qid}: the controller requires authentication and no secret was given"
        )));
    };
    crate::dhchap::authenticate(q, qid, s, hostnqn, subnqn)?
        .map_err(|e| other(format!("queue {qid}: authentication failed: {e:?}")))
}

/// An enabled controller: its admin queue and I/O queues.
///
/// The admin queue sits behind a mutex because the keep-alive thread uses
/// it too; [`Controller::admin`] locks it.
pub struct Controller {
    pub id: ControllerId,
    pub cntlid: u16,
    /// The CAP property.
    pub cap: u64,
    pub io: Vec<Queue>,
    admin: Arc<Mutex<Queue>>,
    keep_alive: Option<(mpsc::Sender<()>, JoinHandle<()>)>,
}

const CC_IOSQES: u32 = 6 << 16;
const CC_IOCQES: u32 = 4 << 20;
const READY_TIMEOUT: Duration = Duration::from_secs(5);

/// Polls `f` every few milliseconds until it returns true or `timeout` passes.
fn poll(timeout: Duration, mut f: impl FnMut() -> io::Result<bool>) -> io::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        if f()? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends Keep Alive every `period` until told to stop or it fails (the
/// test then sees the broken admin queue itself).
fn keep_alive_thread(
    admin: Arc<Mutex<Queue>>,
    period: Duration,
) -> (mpsc::Sender<()>, JoinHandle<()>) {
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
            let mut q = admin.lock().unwrap_or_else(PoisonError::into_inner);
            if q.keep_alive().is_err() {
                return;
            }
        }
    });
    (stop, thread)
}

impl Controller {
    /// What the Linux host does: admin queue, Connect, CAP, CC.EN, CSTS.RDY,
    /// Identify Controller, Number of Queues, then the I/O queues.
    pub fn open(
        addr: SocketAddr,
        subnqn: &str,
        hostnqn: &str,
        opts: &Opts,
    ) -> io::Result<Controller> {
        let mut admin = Queue::connect(addr, opts.digests)?;
        let cqe = admin
            .fabrics_connect_full(
                0,
                31,
                opts.kato_ms,
                opts.cattr,
                subnqn,
                hostnqn,
                opts.hostid,
                0xffff,
            )?
            .cqe;
        if !cqe.status().is_success() {
            return Err(other(format!(
                "admin Connect to {subnqn} as {hostnqn} failed: {} (dw0 {:#x})",
                cqe.status(),
                cqe.dw0
            )));
        }
        let cntlid = cqe.dw0 as u16;
        authenticate_if_asked(&mut admin, cqe.dw0, 0, opts, hostnqn, subnqn)?;
        let cap = admin.prop_get(property::CAP, true)?;
        admin.prop_set(property::CC, property::CC_EN | CC_IOSQES | CC_IOCQES)?;
        let mut csts = 0;
        let ready = poll(READY_TIMEOUT, || {
            csts = admin.prop_get(property::CSTS, false)? as u32;
            Ok(csts & property::CSTS_RDY != 0)
        })?;
        if !ready {
            return Err(other(format!(
                "CSTS.RDY not set {READY_TIMEOUT:?} after CC.EN (CSTS {csts:#x})"
            )));
        }
        let id = ControllerId::parse(&admin.identify(cns::CONTROLLER, 0)?);
        if opts.io_queues > 0 {
            let n = opts.io_queues as u32 - 1;
            admin.set_features(feature::NUM_QUEUES, n | n << 16)?;
        }
        let admin = Arc::new(Mutex::new(admin));
        let keep_alive = (opts.auto_keep_alive && opts.kato_ms > 0).then(|| {
            keep_alive_thread(
                admin.clone(),
                Duration::from_millis(opts.kato_ms as u64 / 2),
            )
        });
        let mut ctrl = Controller {
            id,
            cntlid,
            cap,
            io: Vec::new(),
            admin,
            keep_alive,
        };
        // IOCCSZ counts 16-byte units of the whole capsule, SQE included.
        let in_capsule = (ctrl.id.ioccsz * 16)
            .saturating_sub(64)
            .min(DEFAULT_IN_CAPSULE);
        for qid in 1..=opts.io_queues {
            let mut q = Queue::connect(addr, opts.digests)?;
            let cqe = q
                .fabrics_connect_full(
                    qid,
                    opts.sqsize,
                    0,
                    opts.cattr,
                    subnqn,
                    hostnqn,
                    opts.hostid,
                    cntlid,
                )?
                .cqe;
            if !cqe.status().is_success() {
                return Err(other(format!(
                    "I/O queue {qid} Connect (cntlid {cntlid}) failed: {} (dw0 {:#x})",
                    cqe.status(),
                    cqe.dw0
                )));
            }
            authenticate_if_asked(&mut q, cqe.dw0, qid, opts, hostnqn, subnqn)?;
            q.set_in_capsule_limit(in_capsule);
            ctrl.io.push(q);
        }
        Ok(ctrl)
    }

    /// The admin queue (locked against the keep-alive thread).
    pub fn admin(&self) -> MutexGuard<'_, Queue> {
        self.admin.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Normal shutdown: CC.SHN = 01b, then wait for CSTS.SHST = 10b.
    pub fn shutdown(&mut self) -> io::Result<()> {
        let mut admin = self.admin();
        let cc = admin.prop_get(property::CC, false)? as u32;
        let cc = (cc & !property::CC_SHN_MASK) | 1 << property::CC_SHN_SHIFT;
        admin.prop_set(property::CC, cc)?;
        let mut csts = 0;
        let done = poll(READY_TIMEOUT, || {
            csts = admin.prop_get(property::CSTS, false)? as u32;
            Ok(csts & (3 << property::CSTS_SHST_SHIFT) == property::CSTS_SHST_COMPLETE)
        })?;
        if !done {
            return Err(other(format!(
                "shutdown not complete after {READY_TIMEOUT:?} (CSTS {csts:#x})"
            )));
        }
        Ok(())
    }

    /// The discovery log as `hostnqn` sees it. Like the Linux host, a
    /// non-persistent discovery association uses KATO 0.
    pub fn discover(addr: SocketAddr, hostnqn: &str) -> io::Result<Vec<DiscoveryEntry>> {
        let opts = Opts {
            io_queues: 0,
            kato_ms: 0,
            ..Opts::default()
        };
        let mut c = Controller::open(addr, DISCOVERY_NQN, hostnqn, &opts)?;
        let header_len = DISCOVERY_LOG_HEADER_LEN as u32;
        let page = {
            let mut admin = c.admin();
            let (genctr, numrec) =
                parse_log_header(&admin.get_log(DISCOVERY_LOG, header_len, 0)?);
            if numrec > 1024 {
                return Err(other(format!("discovery log claims {numrec} records")));
            }
            let len = header_len + numrec as u32 * DISCOVERY_ENTRY_LEN as u32;
            let page = admin.get_log(DISCOVERY_LOG, len, 0)?;
            let (genctr2, numrec2) = parse_log_header(&page);
            if (genctr2, numrec2) != (genctr, numrec) {
                return Err(other(format!(
                    "discovery log changed between reads: genctr/numrec {genctr}/{numrec}, then {genctr2}/{numrec2}"
                )));
            }
            page
        };
        c.shutdown()?;
        Ok(parse_log_entries(&page))
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Some((stop, thread)) = self.keep_alive.take() {
            drop(stop);
            let _ = thread.join();
        }
    }
}
