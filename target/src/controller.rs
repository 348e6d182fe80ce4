//! The NVMe controller as NVMe over Fabrics sees it: Connect (association of
//! queues with a controller), properties, keep-alive, and the admin command
//! set. Transport independent: a transport hands in a command and its data
//! and gets back a status, dword 0 and the data to return.

use crate::admission::{Gauge, Permit};
use crate::auth::{self, QueueAuth};
use crate::config::Limits;
use crate::offload::Job;
use crate::subsystem::{Namespace, NamespaceView, Registry, Subsystem};
use rdmablk_common::auth::message;
use rdmablk_common::fabrics::{
    cattr, fctype, invalid_param_dw0, ConnectCmd, ConnectData, PropertyCmd, CONNECT_DATA_LEN,
};
use rdmablk_common::nvme::identify::{
    cns, cntrltype, encode_ns_descriptors, encode_ns_list, oncs, ControllerId, NamespaceId,
    IDENTIFY_LEN,
};
use rdmablk_common::nvme::log::{lid, LogRequest};
use rdmablk_common::nvme::{admin, feature, nvm, property, Sqe, Status, FABRICS_OPCODE, SQE_LEN};
use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Admin queue entries (ASQSZ): the most an admin queue may have.
pub const ADMIN_QUEUE_SIZE: u16 = 32;
/// I/O queues a controller grants at most.
pub const MAX_IO_QUEUES: u16 = 64;
/// Outstanding Asynchronous Event Requests at most (AERL + 1).
pub const MAX_AERS: usize = 4;
/// Keep-alive granularity in 100 ms units (KAS).
const KAS: u16 = 10;
/// Namespace ids from here up (FFFFFFFEh, and FFFFFFFFh: all namespaces)
/// cannot start an Active Namespace ID list (NVMe Base 2.1, 5.1.13.2.2).
const NSID_RESERVED: u32 = 0xffff_fffe;
/// NVMe version 1.3.0.
const VERSION: u32 = 0x0001_0300;
/// Command Retry Delay Times 1 to 3 (Identify Controller CRDT1..3), in
/// 100 ms units: 100 ms, 1 s, 10 s.
pub const CRDT: [u16; 3] = [1, 10, 100];
/// Size of the Host Behavior Support feature's data (NVMe Base 2.0, 5.27.1.18).
pub const HOST_BEHAVIOR_LEN: usize = 512;
/// Size of the Host Identifier feature's data (the extended, 128-bit one).
const HOST_ID_LEN: usize = 16;

/// The data a command's fields call for: what its SGL must describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferLen {
    /// Exactly this many bytes (nvmet_check_transfer_len).
    Exact(usize),
    /// This many bytes; the SGL may describe more (nvmet_check_data_len_lte).
    AtLeast(usize),
}

/// The data length an admin command's fields call for; `None` for opcodes
/// that are answered Invalid Opcode anyway.
pub fn admin_transfer_len(sqe: &Sqe) -> Option<TransferLen> {
    let fid = sqe.cdw(10) as u8;
    Some(match sqe.opcode() {
        admin::IDENTIFY => TransferLen::Exact(IDENTIFY_LEN),
        admin::GET_LOG_PAGE => TransferLen::Exact(LogRequest::from_sqe(sqe).len),
        admin::SET_FEATURES if fid == feature::HOST_BEHAVIOR => {
            TransferLen::AtLeast(HOST_BEHAVIOR_LEN)
        }
        admin::SET_FEATURES => TransferLen::AtLeast(0),
        admin::GET_FEATURES if fid == feature::HOST_BEHAVIOR => {
            TransferLen::Exact(HOST_BEHAVIOR_LEN)
        }
        admin::GET_FEATURES if fid == feature::HOST_ID => TransferLen::Exact(HOST_ID_LEN),
        admin::GET_FEATURES => TransferLen::Exact(0),
        admin::KEEP_ALIVE | admin::ASYNC_EVENT | admin::ABORT => TransferLen::Exact(0),
        _ => return None,
    })
}

/// The data length a Fabrics command calls for; `None` for command types
/// that are answered Invalid Opcode anyway.
pub fn fabrics_transfer_len(sqe: &Sqe) -> Option<TransferLen> {
    match sqe.fctype() {
        fctype::CONNECT => Some(TransferLen::Exact(CONNECT_DATA_LEN)),
        // TL and AL: the message's length, either way.
        fctype::AUTH_SEND | fctype::AUTH_RECV => Some(TransferLen::Exact(sqe.cdw(11) as usize)),
        fctype::PROPERTY_GET | fctype::PROPERTY_SET | fctype::DISCONNECT => {
            Some(TransferLen::Exact(0))
        }
        _ => None,
    }
}

/// What a queue's transport tells its controller: the limits it serves
/// and the SGL descriptors it takes (Identify Controller, CAP, Connect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransportCaps {
    /// Maximum data transfer size, a power of two of 4 KiB (MDTS).
    pub mdts: u8,
    /// I/O queue entries at most (CAP.MQES + 1, MAXCMD).
    pub max_queue_entries: u16,
    /// In-capsule data accepted beyond the 64-byte command (IOCCSZ).
    pub in_capsule_data: u32,
    /// SGL support bits (Identify Controller SGLS).
    pub sgls: u32,
    /// The transport's name, as metrics label it ("tcp", "rdma").
    pub transport: &'static str,
}

impl TransportCaps {
    /// Maximum data transfer size in bytes.
    pub fn max_transfer(&self) -> usize {
        4096 << self.mdts
    }

    /// I/O command capsule size in 16-byte units (IOCCSZ).
    pub fn ioccsz(&self) -> u32 {
        (SQE_LEN as u32 + self.in_capsule_data) / 16
    }

    /// Whether SGL descriptors of support bit `bit` are taken.
    pub fn takes(&self, bit: u32) -> bool {
        self.sgls & bit != 0
    }
}

/// A controller: one association of a host with a subsystem.
pub struct Controller {
    pub cntlid: u16,
    pub subsys: Arc<Subsystem>,
    pub hostnqn: String,
    pub hostid: [u8; 16],
    registry: Arc<Registry>,
    caps: TransportCaps,
    /// Where the admin queue reached this target (for discovery entries of
    /// wildcard listeners), when the transport knows.
    local: Option<IpAddr>,
    /// Keep-alive timeout in ms; 0 disables it.
    kato_ms: AtomicU32,
    /// Arena bytes all queues of the association hold (its budget's gauge).
    pub buffers: Arc<Gauge>,
    /// This association's place among its host's (limits.associations_per_host).
    _host: Permit,
    /// Milliseconds since `epoch` at the last Keep Alive.
    last_keep_alive: AtomicU64,
    epoch: Instant,
    dead: AtomicBool,
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
}

/// Asynchronous events (NVMe Base 2.1, 5.2.2): those waiting for an
/// Asynchronous Event Request, the kinds reported and not yet acknowledged
/// by a read of their log page (masked until then), and the namespaces
/// changed since the host last read the Changed Namespace List.
#[derive(Default)]
struct Events {
    /// Completion dword 0 of each event to report, oldest first.
    pending: VecDeque<u32>,
    /// [`aen`] kinds reported and not acknowledged.
    masked: u32,
    changed_ns: BTreeSet<u32>,
}

/// The asynchronous events a controller reports: their Async Event
/// Configuration bit (also their OAES bit, and their mask bit here) and
/// completion dword 0 (type Notice, information, log page).
pub mod aen {
    /// Namespace Attribute Notices (NVMe Base 2.1, Figure 201, bit 8).
    pub const NS_ATTR: u32 = 1 << 8;
    /// Discovery Log Page Change Notices (bit 31; discovery controllers).
    pub const DISCOVERY: u32 = 1 << 31;
    /// Asynchronous Event Type Notice (NVMe Base 2.1, Figure 150).
    const NOTICE: u32 = 2;
    /// Notice: Namespace Attribute Changed (information 00h), Changed
    /// Namespace List (04h).
    pub const NS_ATTR_DW0: u32 = NOTICE | 0x04 << 16;
    /// Notice: Discovery Log Page Change, Discovery log (70h).
    pub const DISCOVERY_DW0: u32 = NOTICE | 0xf0 << 8 | 0x70 << 16;
}

/// Namespaces the Changed Namespace List holds; beyond, it says "more than
/// that" with FFFFFFFFh as its only entry (NVMe Base 2.1, 5.16.1.5).
const CHANGED_NS_MAX: usize = 1024;

/// A queue's binding after a successful Connect.
pub struct Association {
    pub ctrl: Arc<Controller>,
    pub qid: u16,
    /// Queue entries (SQSIZE + 1).
    pub depth: u16,
    /// The host disabled SQ flow control (Connect CATTR bit 2).
    pub sq_flow_disabled: bool,
    /// The controller's generation when the queue connected.
    generation: u32,
    /// This queue's copy of the subsystem's namespaces.
    namespaces: RefCell<NamespaceView>,
    /// The host has a secret: the queue authenticates before other commands.
    pub auth_required: bool,
    auth: RefCell<QueueAuth>,
    /// This queue's place among the daemon's connected queues (limits.connections).
    _queue: Permit,
}

impl Association {
    /// Whether the queue must still authenticate before other commands.
    pub fn auth_pending(&self) -> bool {
        self.auth_required && !self.auth.borrow().authenticated()
    }

    /// Whether an authentication transaction has run longer than `limit`.
    pub fn auth_overdue(&self, limit: Duration) -> bool {
        self.auth.borrow().overdue(limit)
    }

    /// AUTH_Send (with `data`) or AUTH_Receive on this queue (NVMe Base
    /// 2.1, 6.2 and 6.3): SECP E9h, SPSP 01h 01h, a non-zero length.
    pub fn authenticate(&self, sqe: &Sqe, data: &[u8]) -> Reply {
        let cdw10 = sqe.cdw(10);
        let (secp, spsp1, spsp0) = ((cdw10 >> 24) as u8, (cdw10 >> 16) as u8, (cdw10 >> 8) as u8);
        if secp != message::SECP
            || spsp0 != message::SPSP
            || spsp1 != message::SPSP
            || sqe.cdw(11) == 0
        {
            return Reply::status(Status::INVALID_FIELD);
        }
        let ctrl = &self.ctrl;
        let host = ctrl.subsys.auth_of(&ctrl.hostnqn);
        let peers = auth::Peers {
            host_nqn: &ctrl.hostnqn,
            subsys_nqn: &ctrl.subsys.nqn,
            host: host.as_deref(),
        };
        let mut auth = self.auth.borrow_mut();
        let (reply, outcome) = if sqe.fctype() == fctype::AUTH_SEND {
            (Reply::ok(0), auth.on_send(sqe.cid(), data, &peers))
        } else {
            let (msg, outcome) = auth.on_receive(sqe.cid(), &peers);
            (Reply::data(msg), outcome)
        };
        match outcome {
            auth::Outcome::Fatal(why) => {
                ctrl.kill(&why);
                reply
            }
            auth::Outcome::After(job) => Reply::After(job),
            auth::Outcome::Continue | auth::Outcome::Authenticated => reply,
        }
    }

    /// Namespace `nsid` of the subsystem, as of now (no lock unless a
    /// reload changed the namespaces since the queue last looked).
    pub fn namespace(&self, nsid: u32) -> Option<Arc<Namespace>> {
        self.namespaces.borrow_mut().find(&self.ctrl.subsys, nsid)
    }

    /// Whether a controller reset deleted this (I/O) queue.
    pub fn is_deleted(&self) -> bool {
        self.qid != 0 && self.ctrl.generation() != self.generation
    }
}

/// A refused Connect: status, CQE dword 0 and why, for the log.
#[derive(Debug)]
pub struct Refusal {
    pub status: Status,
    pub dw0: u32,
    pub reason: String,
}

fn busy(reason: String) -> Refusal {
    refuse(Status::CONTROLLER_BUSY, 0, reason)
}

fn refuse(status: Status, dw0: u32, reason: String) -> Refusal {
    Refusal {
        status,
        dw0,
        reason,
    }
}

/// The outcome of a command the controller executed.
#[derive(Debug)]
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

/// Handles a Fabrics Connect: creates a controller (admin queue) or binds an
/// I/O queue to an existing one.
pub fn connect(
    registry: &Arc<Registry>,
    sqe: &Sqe,
    data: &[u8],
    caps: TransportCaps,
    local: Option<IpAddr>,
) -> Result<Association, Refusal> {
    let cmd = ConnectCmd::from_sqe(sqe);
    if data.len() < CONNECT_DATA_LEN {
        return Err(refuse(
            Status::SGL_DATA_LENGTH_INVALID,
            0,
            format!("Connect data is {} bytes, not 1024", data.len()),
        ));
    }
    let d = ConnectData::parse(data);
    if cmd.recfmt != 0 {
        return Err(refuse(
            Status::CONNECT_INCOMPATIBLE_FORMAT,
            0,
            format!("record format {} is not 0", cmd.recfmt),
        ));
    }
    let Some(subsys) = registry.find(&d.subnqn) else {
        return Err(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            invalid_param_dw0(true, ConnectData::SUBNQN_OFFSET),
            format!("no subsystem {:?} here", d.subnqn),
        ));
    };
    if !subsys.admits(&d.hostnqn) {
        return Err(refuse(
            Status::CONNECT_INVALID_HOST,
            0,
            format!("host {:?} is not allowed on {}", d.hostnqn, subsys.nqn),
        ));
    }
    let depth = cmd.sqsize as u32 + 1;
    if cmd.qid == 0 {
        if cmd.sqsize == 0 || depth > ADMIN_QUEUE_SIZE as u32 {
            return Err(refuse(
                Status::CONNECT_INVALID_PARAMETERS,
                invalid_param_dw0(false, 44),
                format!("admin queue size {depth} is outside 2..={ADMIN_QUEUE_SIZE}"),
            ));
        }
        if d.cntlid != 0xffff {
            return Err(refuse(
                Status::CONNECT_INVALID_PARAMETERS,
                invalid_param_dw0(true, ConnectData::CNTLID_OFFSET),
                format!("admin Connect asks for cntlid {:#x}; this target uses the dynamic model (0xFFFF)", d.cntlid),
            ));
        }
        let adm = &registry.admission;
        let Some(host) = adm.association(&d.hostnqn) else {
            return Err(busy(format!(
                "host {:?} has {} associations already (limits.associations_per_host)",
                d.hostnqn, adm.limits.associations_per_host
            )));
        };
        let queue = admit_queue(&adm.limits, adm.queue())?;
        // A discovery controller is never left without a keep-alive
        // deadline (NVMe over Fabrics 1.1, 5.3: nvmet uses 120 s as well).
        let kato = match cmd.kato {
            0 if subsys.is_discovery() => adm.limits.discovery_keep_alive.as_millis() as u32,
            k => k,
        };
        let now = Instant::now();
        let make = |cntlid| Controller {
            cntlid,
            subsys: subsys.clone(),
            hostnqn: d.hostnqn,
            hostid: d.hostid,
            registry: registry.clone(),
            caps,
            local,
            kato_ms: AtomicU32::new(kato),
            buffers: Arc::default(),
            _host: host,
            last_keep_alive: AtomicU64::new(0),
            epoch: now,
            dead: AtomicBool::new(false),
            generation: AtomicU32::new(0),
            state: Mutex::new(State {
                cc: 0,
                csts: 0,
                disabled_since: Some(now),
                io_queues: 0,
                connected: Vec::new(),
                acre: false,
                features: HashMap::new(),
                events: Events::default(),
            }),
        };
        let Some(ctrl) = subsys.add_controller(make) else {
            return Err(busy("no free controller id".into()));
        };
        tracing::info!(
            cntlid = ctrl.cntlid,
            subsystem = %subsys.nqn,
            host = %ctrl.hostnqn,
            kato_ms = kato,
            sq_flow_control = cmd.cattr & cattr::DISABLE_SQ_FLOW == 0,
            "controller created"
        );
        return Ok(Association {
            namespaces: RefCell::new(ctrl.subsys.view()),
            auth_required: ctrl.subsys.auth_of(&ctrl.hostnqn).is_some(),
            auth: RefCell::default(),
            ctrl,
            qid: 0,
            depth: depth as u16,
            sq_flow_disabled: cmd.cattr & cattr::DISABLE_SQ_FLOW != 0,
            generation: 0,
            _queue: queue,
        });
    }

    if subsys.is_discovery() {
        return Err(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            invalid_param_dw0(false, 42),
            "the discovery subsystem has no I/O queues".into(),
        ));
    }
    let Some(ctrl) = subsys.controller(d.cntlid).filter(|c| c.is_live()) else {
        return Err(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            invalid_param_dw0(true, ConnectData::CNTLID_OFFSET),
            format!("no live controller {} on {}", d.cntlid, subsys.nqn),
        ));
    };
    if ctrl.hostnqn != d.hostnqn || ctrl.hostid != d.hostid {
        return Err(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            invalid_param_dw0(true, ConnectData::HOSTNQN_OFFSET),
            format!("controller {} belongs to another host", d.cntlid),
        ));
    }
    let max = caps.max_queue_entries;
    if cmd.sqsize == 0 || depth > max as u32 {
        return Err(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            invalid_param_dw0(false, 44),
            format!("I/O queue size {depth} is outside 2..={max}"),
        ));
    }
    let generation = {
        let mut st = ctrl.state.lock().expect("controller state");
        if st.csts & property::CSTS_RDY == 0 {
            return Err(refuse(
                Status::COMMAND_SEQUENCE_ERROR,
                0,
                format!("controller {} is not enabled yet", ctrl.cntlid),
            ));
        }
        let qid = cmd.qid as usize;
        if cmd.qid > st.io_queues.max(1) || qid > MAX_IO_QUEUES as usize {
            return Err(refuse(
                Status::CONNECT_INVALID_PARAMETERS,
                invalid_param_dw0(false, 42),
                format!(
                    "queue id {qid} is beyond the {} I/O queues granted",
                    st.io_queues.max(1)
                ),
            ));
        }
        if st.connected.len() <= qid {
            st.connected.resize(qid + 1, false);
        }
        if st.connected[qid] {
            return Err(refuse(
                Status::COMMAND_SEQUENCE_ERROR,
                0,
                format!(
                    "queue {qid} of controller {} is already connected",
                    ctrl.cntlid
                ),
            ));
        }
        st.connected[qid] = true;
        ctrl.generation()
    };
    let queue = match admit_queue(&registry.admission.limits, registry.admission.queue()) {
        Ok(q) => q,
        Err(r) => {
            ctrl.release_queue(cmd.qid, generation);
            return Err(r);
        }
    };
    Ok(Association {
        namespaces: RefCell::new(ctrl.subsys.view()),
        auth_required: ctrl.subsys.auth_of(&ctrl.hostnqn).is_some(),
        auth: RefCell::default(),
        ctrl,
        qid: cmd.qid,
        depth: depth as u16,
        sq_flow_disabled: cmd.cattr & cattr::DISABLE_SQ_FLOW != 0,
        generation,
        _queue: queue,
    })
}

/// A connected queue's permit, or Controller Busy: the host retries later.
fn admit_queue(limits: &Limits, permit: Option<Permit>) -> Result<Permit, Refusal> {
    permit.ok_or_else(|| {
        busy(format!(
            "{} queues are connected (limits.connections)",
            limits.connections
        ))
    })
}

impl Controller {
    /// What the transport of the admin queue serves.
    pub fn caps(&self) -> TransportCaps {
        self.caps
    }

    /// Reports an event of kind `kind` ([`aen`]) with completion dword 0
    /// `dw0`, unless the host did not enable it (Asynchronous Event
    /// Configuration) or has not acknowledged the last one of its kind.
    fn raise(&self, st: &mut State, kind: u32, dw0: u32) {
        let enabled = st.features.get(&feature::ASYNC_EVENT).copied().unwrap_or(0);
        if enabled & kind != 0 && st.events.masked & kind == 0 {
            st.events.masked |= kind;
            st.events.pending.push_back(dw0);
        }
    }

    /// Namespaces `nsids` were added, removed or changed (a reload):
    /// Namespace Attribute Changed.
    pub fn namespaces_changed(&self, nsids: &[u32]) {
        let mut st = self.state.lock().expect("controller state");
        st.events.changed_ns.extend(nsids);
        self.raise(&mut st, aen::NS_ATTR, aen::NS_ATTR_DW0);
    }

    /// The discovery log changed (a reload): Discovery Log Page Change.
    pub fn discovery_changed(&self) {
        let mut st = self.state.lock().expect("controller state");
        self.raise(&mut st, aen::DISCOVERY, aen::DISCOVERY_DW0);
    }

    /// Completion dword 0 of the oldest event waiting for an AER.
    pub fn take_event(&self) -> Option<u32> {
        self.state
            .lock()
            .expect("controller state")
            .events
            .pending
            .pop_front()
    }

    /// Queues connected to the controller: its admin queue and I/O queues.
    pub fn queues_connected(&self) -> usize {
        let st = self.state.lock().expect("controller state");
        1 + st.connected.iter().filter(|&&c| c).count()
    }

    /// Whether the association is still alive (no keep-alive expiry, no
    /// admin queue loss).
    pub fn is_live(&self) -> bool {
        !self.dead.load(Ordering::Acquire)
    }

    /// Ends the association: every queue of it closes.
    pub fn kill(&self, why: &str) {
        if !self.dead.swap(true, Ordering::AcqRel) {
            tracing::info!(cntlid = self.cntlid, subsystem = %self.subsys.nqn, host = %self.hostnqn, "controller ends: {why}");
        }
    }

    /// Marks an I/O queue of `generation` disconnected so the host may
    /// connect it again (a reset already did for older generations).
    pub fn release_queue(&self, qid: u16, generation: u32) {
        let mut st = self.state.lock().expect("controller state");
        if self.generation() != generation {
            return;
        }
        if let Some(c) = st.connected.get_mut(qid as usize) {
            *c = false;
        }
    }

    /// Ends an association's hold on its queue: an I/O queue is free to
    /// connect again.
    pub fn release(&self, a: &Association) {
        self.release_queue(a.qid, a.generation);
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

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Restarts the keep-alive timer.
    pub fn keep_alive(&self) {
        self.last_keep_alive.store(self.now_ms(), Ordering::Release);
    }

    /// True once the host has been silent for longer than KATO.
    pub fn keep_alive_expired(&self) -> bool {
        let kato = self.kato_ms.load(Ordering::Acquire) as u64;
        kato != 0
            && self
                .now_ms()
                .saturating_sub(self.last_keep_alive.load(Ordering::Acquire))
                > kato
    }

    /// A Fabrics command other than Connect on an established queue.
    pub fn fabrics(&self, sqe: &Sqe, qid: u16) -> Reply {
        match sqe.fctype() {
            fctype::PROPERTY_GET if qid == 0 => self.property_get(&PropertyCmd::from_sqe(sqe)),
            fctype::PROPERTY_SET if qid == 0 => self.property_set(&PropertyCmd::from_sqe(sqe)),
            // NVMe Base 2.1, Figure 541 note 3: a Fabrics command an I/O
            // queue does not support is an Invalid Field there.
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => Reply::status(Status::INVALID_FIELD),
            fctype::CONNECT => Reply::status(Status::COMMAND_SEQUENCE_ERROR),
            // NVMe Base 2.1, 6.4: Disconnect deletes an I/O queue; on the
            // admin queue it is an Invalid Queue Type.
            fctype::DISCONNECT if qid == 0 => Reply::status(Status::INVALID_QUEUE_TYPE),
            fctype::DISCONNECT => Reply::ok(0),
            _ => Reply::status(Status::INVALID_OPCODE),
        }
    }

    fn cap(&self) -> u64 {
        let mqes = if self.subsys.is_discovery() {
            ADMIN_QUEUE_SIZE - 1
        } else {
            self.caps.max_queue_entries - 1
        } as u64;
        // MQES, CQR (contiguous queues required), TO = 7.5 s, CSS = NVM command set.
        mqes | 1 << 16 | 15 << 24 | 1 << 37
    }

    fn property_get(&self, p: &PropertyCmd) -> Reply {
        let st = self.state.lock().expect("controller state");
        let value = match (p.offset, p.wide) {
            (property::CAP, _) => self.cap(),
            (property::VS, false) => VERSION as u64,
            (property::CC, false) => st.cc as u64,
            (property::CSTS, false) => st.csts as u64,
            _ => return Reply::status(Status::INVALID_FIELD),
        };
        Reply::Done {
            status: Status::SUCCESS,
            dw0: value as u32,
            dw1: (value >> 32) as u32,
            data: Vec::new(),
        }
    }

    fn property_set(&self, p: &PropertyCmd) -> Reply {
        if p.offset != property::CC || p.wide {
            return Reply::status(Status::INVALID_FIELD);
        }
        let cc = p.value as u32;
        let mut st = self.state.lock().expect("controller state");
        let was = st.cc;
        st.cc = cc;
        let enable = cc & property::CC_EN != 0 && was & property::CC_EN == 0;
        let disable = cc & property::CC_EN == 0 && was & property::CC_EN != 0;
        let shutdown = cc & property::CC_SHN_MASK != 0 && was & property::CC_SHN_MASK == 0;
        if enable {
            // Enable: I/O controllers need 64-byte SQEs and 16-byte CQEs.
            let (iosqes, iocqes) = ((cc >> 16) & 0xf, (cc >> 20) & 0xf);
            if !self.subsys.is_discovery() && (iosqes != 6 || iocqes != 4) {
                tracing::warn!(
                    cntlid = self.cntlid,
                    cc,
                    "CC.EN with IOSQES {iosqes} / IOCQES {iocqes}: fatal status"
                );
                st.csts = property::CSTS_CFS;
            } else {
                st.csts = property::CSTS_RDY;
                st.disabled_since = None;
                drop(st);
                self.keep_alive();
                tracing::debug!(cntlid = self.cntlid, "controller enabled");
                return Reply::ok(0);
            }
        }
        if disable || shutdown {
            // A controller reset (CC.EN 1 -> 0) or a shutdown: the I/O queues
            // are deleted and their commands aborted (NVMe Base 2.0, 3.7.2;
            // NVMe over Fabrics 1.1, 3.5); the admin queue stays, and the
            // host has `enable_timeout` to enable the controller again.
            self.generation.fetch_add(1, Ordering::AcqRel);
            // Held AERs are aborted by their queue, which sees the new
            // generation; events not yet reported go with them.
            st.events = Events::default();
            st.connected.iter_mut().for_each(|c| *c = false);
            st.csts &= !property::CSTS_RDY;
            st.disabled_since = Some(Instant::now());
            st.acre = false;
            if disable {
                st.csts &= !(property::CSTS_CFS | 3 << property::CSTS_SHST_SHIFT);
                tracing::info!(cntlid = self.cntlid, host = %self.hostnqn, "controller reset by the host (CC.EN 1 -> 0): I/O queues deleted");
            }
        }
        if shutdown {
            st.csts = (st.csts & !(3 << property::CSTS_SHST_SHIFT)) | property::CSTS_SHST_COMPLETE;
            tracing::info!(cntlid = self.cntlid, host = %self.hostnqn, "host shut the controller down");
        }
        Reply::ok(0)
    }

    /// An admin command with the data the host sent for it.
    pub fn admin(&self, sqe: &Sqe, data: &[u8]) -> Reply {
        let enabled = self.state.lock().expect("controller state").csts & property::CSTS_RDY != 0;
        if !enabled {
            return Reply::status(Status::COMMAND_SEQUENCE_ERROR);
        }
        match sqe.opcode() {
            admin::IDENTIFY => self.identify(sqe),
            admin::GET_LOG_PAGE => self.get_log_page(sqe),
            admin::SET_FEATURES => self.set_features(sqe, data),
            admin::GET_FEATURES => self.get_features(sqe),
            admin::KEEP_ALIVE => {
                self.keep_alive();
                Reply::ok(0)
            }
            admin::ASYNC_EVENT => Reply::Held,
            // Not aborted (bit 0 set): commands here complete quickly anyway.
            admin::ABORT => Reply::ok(1),
            _ => Reply::status(Status::INVALID_OPCODE),
        }
    }

    fn identify(&self, sqe: &Sqe) -> Reply {
        let cns = sqe.cdw(10) as u8;
        let nsid = sqe.nsid();
        if self.subsys.is_discovery() && cns != cns::CONTROLLER {
            return Reply::status(Status::INVALID_FIELD);
        }
        match cns {
            cns::CONTROLLER => Reply::data(self.identify_controller().encode()),
            cns::NAMESPACE => match self.subsys.active_namespace(nsid) {
                Some(ns) => Reply::data(
                    NamespaceId {
                        nsze: ns.blocks(),
                        ncap: ns.blocks(),
                        nuse: ns.blocks(),
                        nsfeat: 0,
                        nmic: 1,
                        dlfeat: 1 | 1 << 3,
                        nsattr: ns.read_only() as u8,
                        nguid: ns.ids().nguid,
                        eui64: [0; 8],
                        lba_shift: ns.lba_shift() as u8,
                    }
                    .encode(),
                ),
                None if nsid != 0 && nsid <= self.subsys.max_nsid() => {
                    Reply::data(vec![0; IDENTIFY_LEN])
                }
                None => Reply::status(Status::INVALID_NAMESPACE),
            },
            cns::ACTIVE_NS_LIST if nsid < NSID_RESERVED => Reply::data(encode_ns_list(
                self.subsys
                    .namespaces()
                    .iter()
                    .filter(|n| n.is_active())
                    .map(|n| n.nsid),
                nsid,
            )),
            cns::NS_DESCRIPTORS => match self.subsys.active_namespace(nsid) {
                Some(ns) => {
                    let ids = ns.ids();
                    Reply::data(encode_ns_descriptors(&ids.nguid, &ids.uuid))
                }
                None => Reply::status(Status::INVALID_NAMESPACE),
            },
            _ => Reply::status(Status::INVALID_FIELD),
        }
    }

    fn identify_controller(&self) -> ControllerId {
        let disc = self.subsys.is_discovery();
        ControllerId {
            vid: 0,
            ssvid: 0,
            serial: self.subsys.serial.clone(),
            model: "rdmablk".into(),
            firmware: env!("CARGO_PKG_VERSION").into(),
            // Multiple controllers per subsystem.
            cmic: if disc { 0 } else { 1 << 1 },
            mdts: self.caps.mdts,
            cntlid: self.cntlid,
            ver: VERSION,
            // Exactly the notices implemented (NVMe Base 2.1, Figure 312).
            oaes: if disc { aen::DISCOVERY } else { aen::NS_ATTR },
            cntrltype: if disc {
                cntrltype::DISCOVERY
            } else {
                cntrltype::IO
            },
            // Reserved for discovery controllers (NVMe Base 2.1, Figure 312).
            crdt: if disc { [0; 3] } else { CRDT },
            acl: 3,
            aerl: (MAX_AERS - 1) as u8,
            // Extended data for Get Log Page (64-bit offsets).
            lpa: 1 << 2,
            elpe: 0,
            kas: KAS,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: if disc {
                ADMIN_QUEUE_SIZE
            } else {
                self.caps.max_queue_entries
            },
            nn: self.subsys.max_nsid(),
            oncs: if disc {
                0
            } else {
                oncs::DSM | oncs::WRITE_ZEROES
            },
            vwc: self.subsys.volatile_cache() as u8,
            sgls: self.caps.sgls,
            mnan: 0,
            subnqn: self.subsys.nqn.clone(),
            ioccsz: self.caps.ioccsz(),
            iorcsz: 1,
            icdoff: 0,
            fcatt: 0,
            msdbd: 1,
        }
    }

    fn get_log_page(&self, sqe: &Sqe) -> Reply {
        let req = LogRequest::from_sqe(sqe);
        if !req.offset.is_multiple_of(4) {
            return Reply::status(Status::INVALID_FIELD);
        }
        let page = match req.lid {
            lid::DISCOVERY if self.subsys.is_discovery() => {
                if !req.rae {
                    self.acknowledge(aen::DISCOVERY);
                }
                self.registry.discovery_log(&self.hostnqn, self.local)
            }
            _ if self.subsys.is_discovery() => return Reply::status(Status::INVALID_LOG_PAGE),
            lid::ERROR => vec![0; 64],
            lid::SMART => smart_log(),
            lid::FW_SLOT => {
                let mut b = vec![0u8; 512];
                b[0] = 1; // active slot 1
                rdmablk_common::bytes::put_str(&mut b, 8, 8, env!("CARGO_PKG_VERSION"), b' ');
                b
            }
            lid::CHANGED_NS => self.changed_ns_log(req.rae),
            lid::CMD_EFFECTS => effects_log(),
            _ => return Reply::status(Status::INVALID_LOG_PAGE),
        };
        // NVMe Base 2.0, 5.16: an offset past the end of the log is an
        // Invalid Field; a length past it reads zeroes (transport padding).
        if req.offset > page.len() as u64 {
            return Reply::status(Status::INVALID_FIELD);
        }
        Reply::data(req.window(&page))
    }

    /// The host read the log page of event kind `kind` with RAE clear: it
    /// may be reported again.
    fn acknowledge(&self, kind: u32) {
        self.state.lock().expect("controller state").events.masked &= !kind;
    }

    /// The Changed Namespace List (NVMe Base 2.1, 5.16.1.5): namespaces
    /// changed since the last read with RAE clear, which empties it and
    /// acknowledges Namespace Attribute Changed.
    fn changed_ns_log(&self, rae: bool) -> Vec<u8> {
        let mut st = self.state.lock().expect("controller state");
        let mut b = vec![0u8; 4096];
        let ev = &mut st.events;
        if ev.changed_ns.len() > CHANGED_NS_MAX {
            rdmablk_common::bytes::put_u32(&mut b, 0, u32::MAX);
        } else {
            for (i, nsid) in ev.changed_ns.iter().enumerate() {
                rdmablk_common::bytes::put_u32(&mut b, i * 4, *nsid);
            }
        }
        if !rae {
            ev.changed_ns.clear();
            ev.masked &= !aen::NS_ATTR;
        }
        b
    }

    fn set_features(&self, sqe: &Sqe, data: &[u8]) -> Reply {
        let cdw10 = sqe.cdw(10);
        let fid = cdw10 as u8;
        let value = sqe.cdw(11);
        if cdw10 & (1 << 31) != 0 {
            return Reply::status(Status::FEATURE_NOT_SAVEABLE);
        }
        let mut st = self.state.lock().expect("controller state");
        match fid {
            feature::NUM_QUEUES => {
                let (nsqr, ncqr) = (value & 0xffff, value >> 16);
                if nsqr == 0xffff || ncqr == 0xffff {
                    return Reply::status(Status::INVALID_FIELD);
                }
                // NVMe Base 2.0, 5.27.1.5: only before I/O queues exist.
                if st.connected.iter().any(|&c| c) {
                    return Reply::status(Status::COMMAND_SEQUENCE_ERROR);
                }
                let granted = (nsqr.min(ncqr) + 1).min(MAX_IO_QUEUES as u32) as u16;
                st.io_queues = granted;
                let g = (granted - 1) as u32;
                Reply::ok(g << 16 | g)
            }
            feature::KEEP_ALIVE => {
                // A discovery controller keeps a deadline (as at Connect).
                let value = match value {
                    0 if self.subsys.is_discovery() => self
                        .registry
                        .admission
                        .limits
                        .discovery_keep_alive
                        .as_millis() as u32,
                    v => v,
                };
                self.kato_ms.store(value, Ordering::Release);
                drop(st);
                self.keep_alive();
                Reply::ok(0)
            }
            feature::HOST_BEHAVIOR => match data.first() {
                // ACRE: 0 or 1; the other fields stay 0 (not supported).
                Some(&acre @ (0 | 1)) if data.len() >= HOST_BEHAVIOR_LEN => {
                    st.acre = acre == 1;
                    Reply::ok(0)
                }
                _ => Reply::status(Status::INVALID_FIELD),
            },
            feature::ASYNC_EVENT
            | feature::ARBITRATION
            | feature::POWER_MGMT
            | feature::TEMP_THRESHOLD
            | feature::ERROR_RECOVERY
            | feature::VOLATILE_WC
            | feature::IRQ_COALESCE
            | feature::WRITE_ATOMIC => {
                st.features.insert(fid, value);
                Reply::ok(0)
            }
            _ => Reply::status(Status::INVALID_FIELD),
        }
    }

    fn get_features(&self, sqe: &Sqe) -> Reply {
        let fid = sqe.cdw(10) as u8;
        let st = self.state.lock().expect("controller state");
        match fid {
            feature::NUM_QUEUES => {
                let g = st.io_queues.max(1) as u32 - 1;
                Reply::ok(g << 16 | g)
            }
            feature::KEEP_ALIVE => Reply::ok(self.kato_ms.load(Ordering::Acquire)),
            feature::VOLATILE_WC => Reply::ok(
                st.features
                    .get(&fid)
                    .copied()
                    .unwrap_or(self.subsys.volatile_cache() as u32),
            ),
            feature::HOST_ID => Reply::data(self.hostid.to_vec()),
            feature::HOST_BEHAVIOR => {
                let mut b = vec![0u8; HOST_BEHAVIOR_LEN];
                b[0] = st.acre as u8;
                Reply::data(b)
            }
            feature::ASYNC_EVENT
            | feature::ARBITRATION
            | feature::POWER_MGMT
            | feature::TEMP_THRESHOLD
            | feature::ERROR_RECOVERY
            | feature::IRQ_COALESCE
            | feature::WRITE_ATOMIC => Reply::ok(st.features.get(&fid).copied().unwrap_or(0)),
            _ => Reply::status(Status::INVALID_FIELD),
        }
    }
}

/// SMART / Health Information: nothing to warn about.
fn smart_log() -> Vec<u8> {
    let mut b = vec![0u8; 512];
    rdmablk_common::bytes::put_u16(&mut b, 1, 300); // composite temperature, kelvin
    b[3] = 100; // available spare %
    b[4] = 10; // spare threshold %
    b
}

/// Commands Supported and Effects: which opcodes exist and which change data.
fn effects_log() -> Vec<u8> {
    const CSUPP: u32 = 1;
    const LBCC: u32 = 1 << 1;
    let mut b = vec![0u8; 4096];
    let put = |b: &mut [u8], base: usize, opc: u8, v: u32| {
        rdmablk_common::bytes::put_u32(b, base + opc as usize * 4, v)
    };
    for opc in [
        admin::GET_LOG_PAGE,
        admin::IDENTIFY,
        admin::ABORT,
        admin::SET_FEATURES,
        admin::GET_FEATURES,
        admin::ASYNC_EVENT,
        admin::KEEP_ALIVE,
        FABRICS_OPCODE,
    ] {
        put(&mut b, 0, opc, CSUPP);
    }
    put(&mut b, 1024, nvm::FLUSH, CSUPP);
    put(&mut b, 1024, nvm::READ, CSUPP);
    for opc in [nvm::WRITE, nvm::WRITE_ZEROES, nvm::DSM] {
        put(&mut b, 1024, opc, CSUPP | LBCC);
    }
    b
}

#[cfg(test)]
mod tests;
