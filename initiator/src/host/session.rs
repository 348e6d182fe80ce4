//! A controller association: admin queue bring-up (Connect, CC.EN, Identify,
//! number of queues), keep-alive at KATO/2, I/O queue connects, and a clean
//! shutdown (CC.SHN) at the end.

use super::{HostError, IoQueue, Params, SyncQueue};
use rdmablk_common::fabrics::discovery::{self, DiscoveryEntry};
use rdmablk_common::fabrics::{
    cattr, ConnectCmd, ConnectData, PropertyCmd, CONNECT_ATR, DISCOVERY_NQN, SQHD_FLOW_DISABLED,
};
use rdmablk_common::nvme::ana::{self, AnaLog, AnaState};
use rdmablk_common::nvme::identify::{
    cns, parse_ns_list, ControllerId, NamespaceId, NamespaceIdentifiers, IDENTIFY_LEN,
};
use rdmablk_common::nvme::log::{lid, LogRequest};
use rdmablk_common::nvme::{admin, feature, property, Sqe, Status, HOST_BEHAVIOR_LEN};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Admin queue entries requested.
const ADMIN_SQSIZE: u16 = 32;
/// Asynchronous Event Configuration bit of ANA Change Notices (NVMe Base
/// 2.1, Figure 201), also their OAES bit.
const ANA_CHANGE_NOTICES: u32 = 1 << 11;
/// Asynchronous event type Notice, and its information Asymmetric Namespace
/// Access Change (NVMe Base 2.1, Figures 150 and 151).
const AEN_NOTICE: u32 = 2;
const AEN_ANA_CHANGE: u8 = 0x03;
/// How long the controller may take to become ready or to shut down.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the host needs to know about a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub nsid: u32,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Size in logical blocks.
    pub blocks: u64,
    pub read_only: bool,
    /// Whether deallocated blocks read back as zeroes (DLFEAT).
    pub deallocate_zeroes: bool,
}

impl NamespaceInfo {
    pub fn size_bytes(&self) -> u64 {
        self.blocks * self.block_size as u64
    }
}

/// A live association with one controller.
pub struct Session {
    params: Params,
    admin: Arc<Mutex<SyncQueue>>,
    /// Identify Controller.
    pub ctrl: ControllerId,
    pub cntlid: u16,
    /// I/O queues granted.
    pub io_queues: u16,
    /// I/O queue entries to use.
    pub queue_size: u16,
    /// The TLS cipher suite of the admin queue's connection (the I/O
    /// queues' are the same), when the association is encrypted.
    pub tls_cipher: Option<String>,
    keep_alive: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
    /// Set when a Keep Alive failed: the association is gone.
    lost: Arc<AtomicBool>,
}

fn property_get(q: &mut SyncQueue, offset: u32, wide: bool) -> Result<u64, HostError> {
    let sqe = PropertyCmd {
        wide,
        offset,
        value: 0,
    }
    .to_sqe(0, false);
    let (cqe, _) = q.exec_ok("Property Get", sqe, &[], 0)?;
    Ok(cqe.dw0 as u64 | (cqe.dw1 as u64) << 32)
}

fn property_set(q: &mut SyncQueue, offset: u32, value: u32) -> Result<(), HostError> {
    let sqe = PropertyCmd {
        wide: false,
        offset,
        value: value as u64,
    }
    .to_sqe(0, true);
    q.exec_ok("Property Set", sqe, &[], 0).map(|_| ())
}

fn identify(q: &mut SyncQueue, cns: u8, nsid: u32) -> Result<Vec<u8>, HostError> {
    let mut sqe = Sqe::new(admin::IDENTIFY, 0);
    sqe.set_nsid(nsid);
    sqe.set_cdw(10, cns as u32);
    Ok(q.exec_ok("Identify", sqe, &[], IDENTIFY_LEN)?.1)
}

/// Connects queue `qid` of a controller (`cntlid` 0xFFFF for a new one).
fn fabrics_connect(
    q: &mut SyncQueue,
    p: &Params,
    subnqn: &str,
    qid: u16,
    sqsize: u16,
    kato_ms: u32,
    cntlid: u16,
) -> Result<u16, HostError> {
    let mut cmd = ConnectCmd {
        recfmt: 0,
        qid,
        sqsize: sqsize - 1,
        cattr: if p.disable_sqflow {
            cattr::DISABLE_SQ_FLOW
        } else {
            0
        },
        kato: kato_ms,
    };
    let data = ConnectData {
        hostid: p.hostid,
        cntlid,
        subnqn: subnqn.into(),
        hostnqn: p.hostnqn.clone(),
    };
    let mut cqe = q.connect(cmd, &data)?;
    if cmd.cattr != 0 && cqe.status() == Status::INVALID_FIELD {
        // A target that cannot disable SQ flow control refuses the
        // attribute (NVMe over Fabrics 1.1, 3.3.1.1): connect without it.
        tracing::info!(qid, "the target keeps SQ flow control; connecting with it");
        cmd.cattr = 0;
        cqe = q.connect(cmd, &data)?;
    }
    let st = cqe.status();
    if st.is_success() {
        // Disabled only if the target says so with SQHD FFFFh.
        let disabled = cqe.sqhd == SQHD_FLOW_DISABLED;
        tracing::debug!(qid, sq_flow_control = !disabled, "queue connected");
        if cqe.dw0 & CONNECT_ATR != 0 {
            super::auth::authenticate(q, qid, p, subnqn)?;
        }
        return Ok(cqe.dw0 as u16);
    }
    Err(match (st.sct, st.sc, cqe.dw0 >> 16) {
        (1, 0x82, 256) => HostError::UnknownNqn {
            addr: q.addr(),
            nqn: subnqn.into(),
        },
        (1, 0x84, _) => HostError::HostNotAllowed {
            nqn: subnqn.into(),
            hostnqn: p.hostnqn.clone(),
        },
        _ => HostError::Status {
            what: format!("Connect of queue {qid}"),
            status: st,
        },
    })
}

/// Admin queue bring-up: Connect, enable, wait for ready, Identify.
fn bring_up(
    p: &Params,
    subnqn: &str,
    kato_ms: u32,
) -> Result<(SyncQueue, ControllerId), HostError> {
    let mut q = SyncQueue::open(p, subnqn, 0, ADMIN_SQSIZE)?;
    let cntlid = fabrics_connect(&mut q, p, subnqn, 0, ADMIN_SQSIZE, kato_ms, 0xffff)?;
    let cap = property_get(&mut q, property::CAP, true)?;
    let timeout = Duration::from_millis(((cap >> 24) & 0xff).max(1) * 500).max(READY_TIMEOUT);
    // 64-byte SQEs, 16-byte CQEs, 4 KiB pages, NVM command set, enable.
    property_set(&mut q, property::CC, 6 << 16 | 4 << 20 | property::CC_EN)?;
    let start = Instant::now();
    loop {
        let csts = property_get(&mut q, property::CSTS, false)? as u32;
        if csts & property::CSTS_CFS != 0 {
            return Err(HostError::Protocol(
                "controller fatal status while enabling".into(),
            ));
        }
        if csts & property::CSTS_RDY != 0 {
            break;
        }
        if start.elapsed() > timeout {
            return Err(HostError::Protocol(format!(
                "controller not ready after {timeout:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let ctrl = ControllerId::parse(&identify(&mut q, cns::CONTROLLER, 0)?);
    if ctrl.cntlid != cntlid {
        tracing::warn!(
            connect = cntlid,
            identify = ctrl.cntlid,
            "controller ids differ between Connect and Identify"
        );
    }
    q.set_in_capsule((ctrl.ioccsz as usize * 16).saturating_sub(64));
    Ok((q, ctrl))
}

fn shut_down(q: &mut SyncQueue) -> Result<(), HostError> {
    property_set(
        q,
        property::CC,
        6 << 16 | 4 << 20 | property::CC_EN | 1 << property::CC_SHN_SHIFT,
    )?;
    let start = Instant::now();
    while start.elapsed() < READY_TIMEOUT {
        let csts = property_get(q, property::CSTS, false)? as u32;
        if csts & (3 << property::CSTS_SHST_SHIFT) == property::CSTS_SHST_COMPLETE {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Err(HostError::Protocol(
        "controller did not finish shutdown".into(),
    ))
}

impl Session {
    /// Associates with the subsystem `p.subnqn` and negotiates I/O queues.
    pub fn connect(p: &Params) -> Result<Session, HostError> {
        let kato_ms = p.kato.as_millis() as u32;
        let (mut q, ctrl) = bring_up(p, &p.subnqn, kato_ms)?;
        if ctrl.crdt[0] != 0 {
            // As the Linux host: a controller with Command Retry Delay Times
            // uses them once the host enables ACRE (Host Behavior Support,
            // NVMe Base 2.1, 5.27.1.18); retries wait what it asks.
            let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
            sqe.set_cdw(10, feature::HOST_BEHAVIOR as u32);
            let mut behavior = [0u8; HOST_BEHAVIOR_LEN];
            behavior[0] = 1;
            if let Err(e) = q.exec_ok("Set Features (Host Behavior Support)", sqe, &behavior, 0) {
                tracing::info!("the controller did not enable Command Retry Delay: {e}");
            }
        }
        let want = p.io_queues.max(1) as u32 - 1;
        let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
        sqe.set_cdw(10, feature::NUM_QUEUES as u32);
        sqe.set_cdw(11, want << 16 | want);
        let (cqe, _) = q.exec_ok("Set Features (Number of Queues)", sqe, &[], 0)?;
        let io_queues =
            ((cqe.dw0 & 0xffff).min(cqe.dw0 >> 16) + 1).min(p.io_queues.max(1) as u32) as u16;
        let cap = property_get(&mut q, property::CAP, true)?;
        let mqes = ((cap & 0xffff) as u16).saturating_add(1);
        if ctrl.cmic & 1 << 3 != 0 && ctrl.oaes & ANA_CHANGE_NOTICES != 0 {
            // ANA Change notices, through an Asynchronous Event Request kept
            // outstanding (the ANA log is also read every second).
            let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
            sqe.set_cdw(10, feature::ASYNC_EVENT as u32);
            sqe.set_cdw(11, ANA_CHANGE_NOTICES);
            let armed = q
                .exec_ok(
                    "Set Features (Asynchronous Event Configuration)",
                    sqe,
                    &[],
                    0,
                )
                .and_then(|_| q.request_event());
            if let Err(e) = armed {
                tracing::info!("no ANA Change notices from the controller: {e}");
            }
        }
        let queue_size = p.queue_size.min(mqes).min(ctrl.maxcmd.max(2)).max(2);
        let cntlid = ctrl.cntlid;
        let tls_cipher = q.tls_cipher().map(str::to_string);
        let admin = Arc::new(Mutex::new(q));
        let lost = Arc::new(AtomicBool::new(false));
        let keep_alive =
            (kato_ms > 0).then(|| spawn_keep_alive(admin.clone(), p.kato, lost.clone()));
        tracing::info!(
            subsystem = %p.subnqn,
            cntlid,
            io_queues,
            queue_size,
            mdts = ctrl.mdts,
            tls = tls_cipher.as_deref().unwrap_or("off"),
            "connected to {}",
            p.addr
        );
        Ok(Session {
            params: p.clone(),
            admin,
            ctrl,
            cntlid,
            io_queues,
            queue_size,
            tls_cipher,
            keep_alive,
            lost,
        })
    }

    /// What the session was opened with.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Whether keep-alive found the association gone.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// The admin queue, unless keep-alive found the association gone
    /// (maybe while the caller waited for the queue): a command there would
    /// only wait for its deadline and hold the path's commands back.
    fn live_admin(&self) -> Result<MutexGuard<'_, SyncQueue>, HostError> {
        let q = self.admin.lock().expect("admin queue");
        if self.is_lost() {
            return Err(HostError::Protocol(format!(
                "{}: keep-alive found the association lost",
                self.params.addr
            )));
        }
        Ok(q)
    }

    /// Reads the discovery log of the target at `p.addr`.
    pub fn discover(p: &Params) -> Result<Vec<DiscoveryEntry>, HostError> {
        let (mut q, _) = bring_up(p, DISCOVERY_NQN, 0)?;
        let header = get_log(
            &mut q,
            lid::DISCOVERY,
            discovery::DISCOVERY_LOG_HEADER_LEN,
            0,
        )?;
        let (_, numrec) = discovery::parse_log_header(&header);
        let len = discovery::DISCOVERY_LOG_HEADER_LEN
            + numrec.min(1024) as usize * discovery::DISCOVERY_ENTRY_LEN;
        let page = get_log(&mut q, lid::DISCOVERY, len, 0)?;
        let _ = shut_down(&mut q);
        Ok(discovery::parse_log_entries(&page))
    }

    /// The largest transfer one command may move.
    pub fn max_transfer(&self) -> usize {
        self.ctrl
            .max_transfer()
            .map_or(1 << 20, |m| m.min(4 << 20) as usize)
    }

    /// Active namespace ids.
    pub fn namespaces(&self) -> Result<Vec<u32>, HostError> {
        let mut q = self.live_admin()?;
        Ok(parse_ns_list(&identify(&mut q, cns::ACTIVE_NS_LIST, 0)?))
    }

    /// Identify Namespace.
    pub fn namespace(&self, nsid: u32) -> Result<NamespaceInfo, HostError> {
        let mut q = self.live_admin()?;
        let id = NamespaceId::parse(&identify(&mut q, cns::NAMESPACE, nsid)?);
        if id.nsze == 0 {
            return Err(HostError::Status {
                what: format!("namespace {nsid}"),
                status: Status::INVALID_NAMESPACE,
            });
        }
        Ok(NamespaceInfo {
            nsid,
            block_size: id.block_size(),
            blocks: id.nsze,
            read_only: id.nsattr & 1 != 0,
            deallocate_zeroes: id.dlfeat & 7 == 1,
        })
    }

    /// The identifiers the controller reports for namespace `nsid` (the
    /// descriptor list, completed by Identify Namespace).
    pub fn namespace_ids(&self, nsid: u32) -> Result<NamespaceIdentifiers, HostError> {
        let mut q = self.live_admin()?;
        let id = NamespaceId::parse(&identify(&mut q, cns::NAMESPACE, nsid)?);
        let list = identify(&mut q, cns::NS_DESCRIPTORS, nsid)
            .map(|b| NamespaceIdentifiers::parse(&b))
            .unwrap_or_default();
        Ok(list.with(&id))
    }

    /// How long the controller may take to answer Keep Alive or a read of
    /// its ANA log before the association counts as lost: KATO (or the
    /// usual command timeout without keep-alive).
    fn deadline(&self) -> Duration {
        if self.params.kato.is_zero() {
            super::COMMAND_TIMEOUT
        } else {
            self.params.kato
        }
    }

    /// Whether the controller reports Asymmetric Namespace Access (CMIC
    /// bit 3).
    pub fn reports_ana(&self) -> bool {
        self.ctrl.cmic & 1 << 3 != 0
    }

    /// The ANA state of namespace `nsid` through this controller: that of
    /// its group (Identify Namespace ANAGRPID) in the ANA log page, read
    /// with Return Groups Only; optimized when the controller reports no
    /// ANA.
    pub fn ana_state(&self, nsid: u32) -> Result<AnaState, HostError> {
        if !self.reports_ana() {
            return Ok(AnaState::Optimized);
        }
        let mut q = self.live_admin()?;
        let mut id = Sqe::new(admin::IDENTIFY, 0);
        id.set_nsid(nsid);
        id.set_cdw(10, cns::NAMESPACE as u32);
        let (_, ns) = q.exec_ok_within(self.deadline(), "Identify", id, &[], IDENTIFY_LEN)?;
        let group = NamespaceId::parse(&ns).anagrpid;
        let groups = self.ctrl.nanagrpid.clamp(1, 1024) as usize;
        let len = (ana::HEADER_LEN + groups * ana::DESCRIPTOR_LEN).min(self.max_transfer());
        let mut sqe = Sqe::new(admin::GET_LOG_PAGE, 0);
        sqe.set_nsid(0xffff_ffff);
        LogRequest {
            lid: lid::ANA,
            lsp: ana::LSP_RGO,
            rae: false,
            len,
            offset: 0,
        }
        .to_sqe(&mut sqe);
        let page = q
            .exec_ok_within(self.deadline(), "Get Log Page (ANA)", sqe, &[], len)?
            .1;
        let Some(log) = AnaLog::parse(&page) else {
            tracing::warn!(
                "the ANA log page of {} does not parse: the path is not used",
                self.params.addr
            );
            return Ok(AnaState::Inaccessible);
        };
        Ok(log
            .groups
            .iter()
            .find(|g| g.grpid == group)
            .map_or(AnaState::Inaccessible, |g| g.state))
    }

    /// Whether an ANA Change notice arrived since the last call (the
    /// Asynchronous Event Request is sent again after each event).
    pub fn take_ana_notice(&self) -> bool {
        let mut q = self.admin.lock().expect("admin queue");
        let events = match q.take_events() {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!("asynchronous events: {e}");
                return false;
            }
        };
        let mut ana = false;
        for cqe in &events {
            if !cqe.status().is_success() {
                // Aborted (a reset) or refused: no more requests.
                continue;
            }
            ana |= cqe.dw0 & 0x7 == AEN_NOTICE && (cqe.dw0 >> 8) as u8 == AEN_ANA_CHANGE;
            if let Err(e) = q.request_event() {
                tracing::debug!("asynchronous event request: {e}");
            }
        }
        ana
    }

    /// Connects I/O queue `qid`, ready for an engine.
    pub fn open_io_queue(&self, qid: u16) -> Result<IoQueue, HostError> {
        let mut q = SyncQueue::open(&self.params, &self.params.subnqn, qid, self.queue_size)?;
        fabrics_connect(
            &mut q,
            &self.params,
            &self.params.subnqn,
            qid,
            self.queue_size,
            0,
            self.cntlid,
        )?;
        let limits = QueueLimits {
            digests: self.params.digests,
            max_h2c: 0,
            in_capsule: (self.ctrl.ioccsz as usize * 16).saturating_sub(64),
            depth: self.queue_size,
            crdt: self.ctrl.crdt,
        };
        q.into_io_queue(limits)
    }

    /// Shuts the controller down (CC.SHN) and ends keep-alive.
    pub fn shutdown(mut self) -> Result<(), HostError> {
        self.stop_keep_alive();
        let mut q = self.admin.lock().expect("admin queue");
        shut_down(&mut q)
    }

    fn stop_keep_alive(&mut self) {
        if let Some((stop, t)) = self.keep_alive.take() {
            stop.store(true, Ordering::Release);
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop_keep_alive();
    }
}

/// What an I/O queue negotiated.
#[derive(Clone, Copy, Debug)]
pub struct QueueLimits {
    /// NVMe/TCP digests and MAXH2CDATA.
    pub digests: rdmablk_common::tcp::Digests,
    pub max_h2c: usize,
    /// In-capsule data the target accepts.
    pub in_capsule: usize,
    /// Queue entries.
    pub depth: u16,
    /// The controller's Command Retry Delay Times (CRDT1..3), 100 ms units.
    pub crdt: [u16; 3],
}

fn get_log(q: &mut SyncQueue, lid: u8, len: usize, offset: u64) -> Result<Vec<u8>, HostError> {
    let mut sqe = Sqe::new(admin::GET_LOG_PAGE, 0);
    LogRequest {
        lid,
        lsp: 0,
        rae: false,
        len,
        offset,
    }
    .to_sqe(&mut sqe);
    Ok(q.exec_ok("Get Log Page", sqe, &[], len)?.1)
}

/// Sends Keep Alive every half `kato`; sets `lost` when one fails or is not
/// answered within `kato` (the host's side of the keep-alive timeout, NVMe
/// Base 2.1, 3.9.5).
fn spawn_keep_alive(
    admin: Arc<Mutex<SyncQueue>>,
    kato: Duration,
    lost: Arc<AtomicBool>,
) -> (Arc<AtomicBool>, JoinHandle<()>) {
    let period = kato / 2;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let t = std::thread::Builder::new()
        .name("keep-alive".into())
        .spawn(move || {
            while !flag.load(Ordering::Acquire) {
                std::thread::park_timeout(period);
                if flag.load(Ordering::Acquire) {
                    break;
                }
                let mut q = admin.lock().expect("admin queue");
                let ka = Sqe::new(admin::KEEP_ALIVE, 0);
                if let Err(e) = q.exec_ok_within(kato, "Keep Alive", ka, &[], 0) {
                    tracing::error!("keep-alive failed: {e}");
                    lost.store(true, Ordering::Release);
                    break;
                }
            }
        })
        .expect("spawning the keep-alive thread");
    (stop, t)
}
