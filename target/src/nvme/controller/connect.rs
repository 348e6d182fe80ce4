//! Connect (NVMe over Fabrics 1.1, 3.3): a queue's admission, which creates
//! a controller (admin queue) or binds an I/O queue to an existing one, and
//! the resulting [`Association`], which authenticates the queue (AUTH_Send,
//! AUTH_Receive) and holds its place until it ends.

use super::aen::Events;
use super::{Controller, Refusal, Reply, State, MAX_IO_QUEUES};
use crate::base::admission::Permit;
use crate::config::Limits;
use crate::nvme::fabric::{TransportCaps, ADMIN_QUEUE_SIZE};
use crate::nvme::namespace::Namespace;
use crate::nvme::port::Arrival;
use crate::nvme::subsystem::{NamespaceView, Registry, Subsystem};
use crate::service::auth::{self, QueueAuth};
use crate::service::qos::Throttle;
use rdmablk_common::auth::message;
use rdmablk_common::fabrics::{
    cattr, fctype, invalid_param_dw0, ConnectCmd, ConnectData, CONNECT_DATA_LEN,
};
use rdmablk_common::nvme::{property, Sqe, Status};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// Queue `cmd.qid` of `ctrl`, connected under `generation`.
    fn new(ctrl: Arc<Controller>, cmd: &ConnectCmd, generation: u32, queue: Permit) -> Self {
        Association {
            namespaces: RefCell::new(ctrl.subsys.view(&ctrl.hostnqn)),
            auth_required: ctrl.subsys.auth_of(&ctrl.hostnqn).is_some(),
            auth: RefCell::default(),
            ctrl,
            qid: cmd.qid,
            depth: queue_depth(cmd) as u16,
            sq_flow_disabled: cmd.cattr & cattr::DISABLE_SQ_FLOW != 0,
            generation,
            _queue: queue,
        }
    }

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

    /// Namespace `nsid` of the subsystem as the host sees it now, and the
    /// limits of its commands (no lock unless a reload changed the
    /// namespaces since the queue last looked).
    pub fn namespace(&self, nsid: u32) -> Option<(Arc<Namespace>, Option<Throttle>)> {
        self.namespaces
            .borrow_mut()
            .find(&self.ctrl.subsys, &self.ctrl.hostnqn, nsid)
    }

    /// Whether a controller reset deleted this (I/O) queue.
    pub fn is_deleted(&self) -> bool {
        self.qid != 0 && self.ctrl.generation() != self.generation
    }
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

/// Handles a Fabrics Connect: creates a controller (admin queue) or binds an
/// I/O queue to an existing one.
pub fn connect(
    registry: &Arc<Registry>,
    sqe: &Sqe,
    data: &[u8],
    caps: TransportCaps,
    arrival: &Arrival,
) -> Result<Association, Refusal> {
    let cmd = ConnectCmd::from_sqe(sqe);
    let (d, subsys) = admit_host(registry, &cmd, data, arrival)?;
    if cmd.qid == 0 {
        connect_admin(registry, &cmd, d, subsys, caps, arrival)
    } else {
        connect_io(registry, &cmd, &d, &subsys, caps, arrival)
    }
}

/// Queue entries the Connect asks for (SQSIZE + 1).
fn queue_depth(cmd: &ConnectCmd) -> u32 {
    cmd.sqsize as u32 + 1
}

/// The Connect data, and the subsystem it names if that subsystem admits
/// the host it names on this connection: one admitted only for its TLS key
/// must come over TLS, under its own identity.
fn admit_host(
    registry: &Registry,
    cmd: &ConnectCmd,
    data: &[u8],
    arrival: &Arrival,
) -> Result<(ConnectData, Arc<Subsystem>), Refusal> {
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
    check_tls_identity(&d, arrival)?;
    if arrival.tls.is_none() && !subsys.admits_without_tls(&d.hostnqn) {
        return Err(refuse(
            Status::CONNECT_INVALID_HOST,
            0,
            format!(
                "host {:?} is allowed on {} only over TLS (it has a tls_key there)",
                d.hostnqn, subsys.nqn
            ),
        ));
    }
    Ok((d, subsys))
}

/// On a TLS connection, the Connect's host and subsystem must be those its
/// PSK identity names: the key proved that host, for that subsystem
/// (NVMe/TCP 1.1, 3.6.1.3); another host NQN is Connect Invalid Host, another
/// subsystem NQN Connect Invalid Parameters (NVMe over Fabrics 1.1, 3.3).
fn check_tls_identity(d: &ConnectData, arrival: &Arrival) -> Result<(), Refusal> {
    let Some(tls) = &arrival.tls else {
        return Ok(());
    };
    if tls.hostnqn != d.hostnqn {
        return Err(refuse(
            Status::CONNECT_INVALID_HOST,
            0,
            format!(
                "host {:?} connects on a TLS session whose PSK identity is host {:?}",
                d.hostnqn, tls.hostnqn
            ),
        ));
    }
    if tls.subnqn != d.subnqn {
        return Err(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            invalid_param_dw0(true, ConnectData::SUBNQN_OFFSET),
            format!(
                "Connect to {:?} on a TLS session whose PSK identity is for {:?}",
                d.subnqn, tls.subnqn
            ),
        ));
    }
    Ok(())
}

/// Refuses a `kind` queue of other than 2 to `max` entries.
fn check_queue_size(cmd: &ConnectCmd, kind: &str, max: u16) -> Result<(), Refusal> {
    let depth = queue_depth(cmd);
    if cmd.sqsize == 0 || depth > max as u32 {
        return Err(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            invalid_param_dw0(false, 44),
            format!("{kind} queue size {depth} is outside 2..={max}"),
        ));
    }
    Ok(())
}

/// An admin queue's Connect: a new controller for the host, within its
/// associations and the daemon's connected queues.
fn connect_admin(
    registry: &Arc<Registry>,
    cmd: &ConnectCmd,
    d: ConnectData,
    subsys: Arc<Subsystem>,
    caps: TransportCaps,
    arrival: &Arrival,
) -> Result<Association, Refusal> {
    check_queue_size(cmd, "admin", ADMIN_QUEUE_SIZE)?;
    if d.cntlid != 0xffff {
        return Err(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            invalid_param_dw0(true, ConnectData::CNTLID_OFFSET),
            format!(
                "admin Connect asks for cntlid {:#x}; this target uses the dynamic model (0xFFFF)",
                d.cntlid
            ),
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
        arrival: arrival.clone(),
        kato_ms: AtomicU32::new(kato),
        buffers: Arc::default(),
        _host: host,
        last_keep_alive: AtomicU64::new(0),
        epoch: now,
        ended_ms: AtomicU64::new(0),
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
            notices: Default::default(),
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
    Ok(Association::new(ctrl, cmd, 0, queue))
}

/// An I/O queue's Connect: the host's live controller takes the queue,
/// within the daemon's connected queues.
fn connect_io(
    registry: &Registry,
    cmd: &ConnectCmd,
    d: &ConnectData,
    subsys: &Subsystem,
    caps: TransportCaps,
    arrival: &Arrival,
) -> Result<Association, Refusal> {
    if subsys.is_discovery() {
        return Err(refuse(
            Status::CONNECT_INVALID_PARAMETERS,
            invalid_param_dw0(false, 42),
            "the discovery subsystem has no I/O queues".into(),
        ));
    }
    let ctrl = host_controller(subsys, d)?;
    if ctrl.tls().is_some() && arrival.tls.is_none() {
        return Err(refuse(
            Status::CONNECT_INVALID_HOST,
            0,
            format!(
                "an I/O queue of controller {} comes without TLS, its admin queue came with it",
                ctrl.cntlid
            ),
        ));
    }
    check_queue_size(cmd, "I/O", caps.max_queue_entries)?;
    let generation = ctrl.claim_queue(cmd.qid)?;
    let queue = match admit_queue(&registry.admission.limits, registry.admission.queue()) {
        Ok(q) => q,
        Err(r) => {
            ctrl.release_queue(cmd.qid, generation);
            return Err(r);
        }
    };
    Ok(Association::new(ctrl, cmd, generation, queue))
}

/// The live controller the Connect data names, if it is its host's.
fn host_controller(subsys: &Subsystem, d: &ConnectData) -> Result<Arc<Controller>, Refusal> {
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
    Ok(ctrl)
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
    /// Marks I/O queue `qid` connected, if the controller is enabled, granted
    /// that many queues and has not connected it yet: the generation it
    /// connects under.
    fn claim_queue(&self, qid: u16) -> Result<u32, Refusal> {
        let mut st = self.state.lock().expect("controller state");
        if st.csts & property::CSTS_RDY == 0 {
            return Err(refuse(
                Status::COMMAND_SEQUENCE_ERROR,
                0,
                format!("controller {} is not enabled yet", self.cntlid),
            ));
        }
        let granted = st.io_queues.max(1);
        let qid = qid as usize;
        if qid > granted as usize || qid > MAX_IO_QUEUES as usize {
            return Err(refuse(
                Status::CONNECT_INVALID_PARAMETERS,
                invalid_param_dw0(false, 42),
                format!("queue id {qid} is beyond the {granted} I/O queues granted"),
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
                    self.cntlid
                ),
            ));
        }
        st.connected[qid] = true;
        Ok(self.generation())
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
}
