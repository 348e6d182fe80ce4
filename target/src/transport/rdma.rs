//! NVMe/RDMA queues. A listener thread takes RDMA CM connect requests and
//! hands them to pollers; each poller keeps, per device, one protection
//! domain, one CQ on a completion channel that its io_uring polls, and one
//! SRQ whose receives hold a 64-byte command capsule and an arena buffer for
//! in-capsule data. Reads go disk → arena (READ_FIXED) → RDMA WRITE chained
//! to the response SEND; writes go RDMA READ → arena → WRITE_FIXED → SEND.
//! The arena is registered once with io_uring and once per device: no copy
//! between disk and NIC.

use crate::admission::Permit;
use crate::command::{self, Command};
use crate::config::Limits;
use crate::controller::{TransportCaps, ADMIN_QUEUE_SIZE, MAX_IO_QUEUE_SIZE};
use crate::error::{starting, DaemonError};
use crate::poller::{Io, PollerLink, Submissions, Token};
use crate::queue::{self, BackendStep, Binding, Ran, SendWatch};
use crate::subsystem::Registry;
use rdmablk_common::mem::ArenaBuf;
use rdmablk_common::nvme::identify::sgls;
use rdmablk_common::nvme::{Sgl, Sqe, Status, SQE_LEN};
use rdmablk_common::rdma::private_data::{
    encode_reject, ConnectReply, ConnectRequest, RejectStatus,
};
use rdmablk_common::rdma::{
    access, CmChannel, CmEventKind, CmId, CompChannel, Completion, ConnParam, Cq, Device, Mr,
    NewId, Pd, QpConfig, SendOp, SendWr, Sge, Srq,
};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// In-capsule data the target accepts (beyond the 64-byte command).
pub const IN_CAPSULE_DATA: usize = 8192;
/// Receives posted on each SRQ (shared by all queues of a poller on a device;
/// RNR retry covers bursts beyond it).
const SRQ_DEPTH: u32 = 256;
/// Completion queue entries per poller and device: the SRQ's receives plus
/// the send queues of every queue pair on it (a queue that would not fit is
/// refused rather than risking an overrun).
const CQ_ENTRIES: u32 = 65536;
/// How long a closed queue waits for its work requests to flush before it
/// is freed anyway (a removed device may never deliver them): destroying
/// the QP ends the device's access to its buffers.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// What NVMe/RDMA contributes to Identify Controller.
pub fn caps() -> TransportCaps {
    TransportCaps {
        ioccsz: ((SQE_LEN + IN_CAPSULE_DATA) / 16) as u32,
        sgls: sgls::SUPPORTED | sgls::KEYED | sgls::OFFSET,
    }
}

/// A connect request on its way from the listener to a poller.
pub struct Incoming {
    id: NewId,
    req: ConnectRequest,
    /// RDMA READs the host lets us have outstanding (its responder resources).
    host_responder_resources: u8,
    /// Its place among connections waiting for their Connect.
    pending: Permit,
}

/// Checks a connect request's queue sizes against what we serve.
fn check_request(private_data: &[u8]) -> Result<ConnectRequest, RejectStatus> {
    let req = ConnectRequest::decode(private_data)?;
    let max = if req.qid == 0 {
        ADMIN_QUEUE_SIZE
    } else {
        MAX_IO_QUEUE_SIZE
    };
    // HSQSIZE is 0's based; HRQSIZE is not.
    if req.hsqsize == 0 || req.hsqsize >= max {
        return Err(RejectStatus::InvalidHsqsize);
    }
    if req.hrqsize == 0 || req.hrqsize > max {
        return Err(RejectStatus::InvalidHrqsize);
    }
    Ok(req)
}

/// Binds an RDMA CM listener on `addr` and starts the thread that hands its
/// connect requests to the pollers, round robin.
pub fn listen(
    addr: SocketAddr,
    pollers: Arc<Vec<PollerLink>>,
    registry: Arc<Registry>,
) -> Result<(), DaemonError> {
    let url = format!("rdma://{addr}");
    let failed = |hint| {
        let url = url.clone();
        move |source| DaemonError::Listen { url, source, hint }
    };
    rdmablk_common::rdma::require_device().map_err(failed(""))?;
    let chan = CmChannel::new().map_err(failed(""))?;
    let mut id = CmId::new(&chan).map_err(failed(""))?;
    id.listen(addr, 128).map_err(failed(
        " (is an RDMA device bound to that address? `rdma link` shows them)",
    ))?;
    if let Some(d) = id.device() {
        if d.is_iwarp() {
            return Err(DaemonError::Iwarp {
                url,
                device: d.name().to_string(),
            });
        }
    }
    std::thread::Builder::new()
        .name(format!("rdma-cm-{addr}"))
        .spawn(move || {
            let _listener = id;
            let mut next = 0;
            loop {
                let ev = match chan.wait_event(Duration::from_secs(1)) {
                    Ok(Some(ev)) => ev,
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::error!("RDMA CM listener on {addr} failed: {e}");
                        return;
                    }
                };
                let Some(new_id) = ev.new_id else {
                    tracing::debug!(event = %ev.name, "listener event");
                    continue;
                };
                if new_id.device().is_iwarp() {
                    tracing::warn!(
                        "refusing a connection on iWARP device {}: iWARP is not supported",
                        new_id.device().name()
                    );
                    let _ = new_id.reject(&encode_reject(RejectStatus::NoResources));
                    continue;
                }
                match check_request(&ev.private_data) {
                    Ok(req) => {
                        let peer = new_id.peer();
                        let Some(pending) = registry.admission.pending_connection(&peer) else {
                            let _ = new_id.reject(&encode_reject(RejectStatus::NoResources));
                            continue;
                        };
                        pollers[next % pollers.len()].adopt_rdma(Incoming {
                            id: new_id,
                            req,
                            host_responder_resources: ev.responder_resources,
                            pending,
                        });
                        next += 1;
                    }
                    Err(st) => {
                        tracing::warn!("refusing an NVMe/RDMA connect request: {}", st.describe());
                        let _ = new_id.reject(&encode_reject(st));
                    }
                }
            }
        })
        .map_err(starting("the RDMA CM listener"))?;
    Ok(())
}

/// The 64-byte command capsule area of the SRQ receives.
struct CapsuleArea {
    /// Declared first: deregistered before `mem` is freed.
    mr: Mr,
    mem: Vec<[u8; SQE_LEN]>,
}

/// One posted (or waiting to be posted) SRQ receive.
struct RecvSlot {
    /// Arena buffer for in-capsule data; `None` while waiting for space.
    data: Option<ArenaBuf>,
}

/// What a poller keeps per RDMA device.
struct DeviceRes {
    device: Device,
    max_rd_atom: u8,
    max_qp_wr: u32,
    pd: Arc<Pd>,
    arena_mr: Mr,
    capsules: CapsuleArea,
    cq: Cq,
    /// Entries of the CQ, and how many its SRQ and queue pairs may fill.
    cq_size: u32,
    cq_committed: u32,
    srq: Arc<Srq>,
    recvs: Vec<RecvSlot>,
    /// Receive slots waiting for an arena buffer before being posted again.
    unposted: Vec<u32>,
    /// A poll on the completion channel is in the ring.
    armed: bool,
}

impl DeviceRes {
    fn new(device: Device, io: &mut Io) -> io::Result<DeviceRes> {
        let attrs = device.attrs()?;
        let pd = Pd::new(device)?;
        // SAFETY: the arena mapping lives as long as the poller, which drops
        // its endpoint (and so this region) before the arena.
        let arena_mr =
            unsafe { Mr::register(&pd, io.arena.base(), io.arena.len(), access::LOCAL_WRITE) }?;
        let depth = SRQ_DEPTH
            .min(attrs.max_srq_wr.max(1))
            .min((io.arena.len() / 4 / IN_CAPSULE_DATA) as u32)
            .max(8);
        let mut mem = vec![[0u8; SQE_LEN]; depth as usize];
        // SAFETY: `mem` is never reallocated and outlives its registration
        // (field order of `CapsuleArea`).
        let mr = unsafe {
            Mr::register(
                &pd,
                mem.as_mut_ptr().cast(),
                mem.len() * SQE_LEN,
                access::LOCAL_WRITE,
            )
        }?;
        let channel = CompChannel::new(device)?;
        let cq_size = CQ_ENTRIES.min(attrs.max_cqe);
        let cq = Cq::new(device, cq_size, &channel)?;
        let srq = Arc::new(Srq::new(&pd, depth, 2)?);
        let mut d = DeviceRes {
            device,
            max_rd_atom: attrs.max_qp_init_rd_atom.max(1),
            max_qp_wr: attrs.max_qp_wr,
            pd,
            arena_mr,
            capsules: CapsuleArea { mr, mem },
            cq,
            cq_size,
            cq_committed: depth,
            srq,
            recvs: (0..depth).map(|_| RecvSlot { data: None }).collect(),
            unposted: (0..depth).rev().collect(),
            armed: false,
        };
        d.post_recvs(io)?;
        tracing::info!(device = %device.name(), srq_depth = depth, "RDMA device ready");
        Ok(d)
    }

    /// Posts every receive that has (or can get) its in-capsule buffer.
    fn post_recvs(&mut self, io: &mut Io) -> io::Result<()> {
        while let Some(&i) = self.unposted.last() {
            let slot = &mut self.recvs[i as usize];
            if slot.data.is_none() {
                match io.arena.alloc(IN_CAPSULE_DATA) {
                    Some(b) => slot.data = Some(b),
                    None => return Ok(()),
                }
            }
            let buf = slot.data.as_ref().expect("allocated above");
            let sges = [
                Sge {
                    addr: self.capsules.mem[i as usize].as_ptr(),
                    len: SQE_LEN as u32,
                    lkey: self.capsules.mr.lkey(),
                },
                Sge {
                    addr: io.arena.addr(buf, 0),
                    len: IN_CAPSULE_DATA as u32,
                    lkey: self.arena_mr.lkey(),
                },
            ];
            // SAFETY: both buffers are registered and belong to this slot
            // until its receive completes.
            unsafe { self.srq.post_recv(RECV_BIT | i as u64, &sges) }?;
            self.unposted.pop();
        }
        Ok(())
    }

    /// Arena buffers held by posted receives.
    fn recv_buffers(&self) -> usize {
        self.recvs.iter().filter(|r| r.data.is_some()).count()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Accepted, waiting for the CM's Established event.
    Accepting,
    Live,
    /// Disconnected; freed once no work request or backend operation is left.
    Closing,
}

/// Where a command's data lives on the host.
#[derive(Clone, Copy)]
struct Remote {
    addr: u64,
    key: u32,
    invalidate: bool,
}

/// A command and its transport state.
struct Slot {
    cmd: Command,
    remote: Option<Remote>,
}

/// Marks SRQ receives in the wr_id: a completion's opcode is not valid
/// when its status is an error, its wr_id always is.
const RECV_BIT: u64 = 1 << 63;

/// Send work request kinds, in the wr_id.
const WR_RESPONSE: u64 = 1;
const WR_RESPONSE_NO_SLOT: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;

fn wr_id(conn: usize, kind: u64, slot: u16) -> u64 {
    (conn as u64) << 24 | kind << 16 | slot as u64
}

/// One NVMe/RDMA queue pair: one queue of a controller.
struct RdmaConn {
    id: CmId,
    dev: usize,
    qp_num: u32,
    idx: usize,
    peer: String,
    phase: Phase,
    since: Instant,
    qid: u16,
    /// Entries of the queue (HSQSIZE + 1).
    depth: u16,
    /// RDMA READs we may have outstanding, and how many are.
    read_credits: u8,
    reads: u8,
    bind: Binding,
    /// Whether the host takes what is sent (limits.send_timeout).
    sends: SendWatch,
    cmds: Vec<Option<Slot>>,
    held_aers: Vec<u16>,
    sq_head: u16,
    awaiting_buffer: VecDeque<u16>,
    awaiting_read: VecDeque<u16>,
    /// Signaled work requests posted and not completed.
    signaled: usize,
    /// Send queue size (its share of the device's CQ).
    send_wr: u32,
    backend_ops: usize,
}

/// The RDMA side of one poller.
pub struct Endpoint {
    poller: usize,
    cm: Option<Arc<CmChannel>>,
    cm_armed: bool,
    devices: Vec<DeviceRes>,
    conns: Vec<Option<Box<RdmaConn>>>,
    /// Queue of each (device, QP number): QP numbers are per device.
    by_qp: HashMap<(usize, u32), usize>,
    completions: Vec<Completion>,
}

impl Endpoint {
    pub fn new(poller: usize) -> Endpoint {
        Endpoint {
            poller,
            cm: None,
            cm_armed: false,
            devices: Vec::new(),
            conns: Vec::new(),
            by_qp: HashMap::new(),
            completions: Vec::new(),
        }
    }

    /// Queues alive on this poller.
    pub fn connections(&self) -> usize {
        self.conns.iter().flatten().count()
    }

    /// Arena buffers the SRQs hold for in-capsule data (not commands').
    pub fn recv_buffers(&self) -> usize {
        self.devices.iter().map(DeviceRes::recv_buffers).sum()
    }

    fn device_index(&mut self, device: Device, io: &mut Io) -> io::Result<usize> {
        if let Some(i) = self.devices.iter().position(|d| d.device == device) {
            return Ok(i);
        }
        self.devices.push(DeviceRes::new(device, io)?);
        Ok(self.devices.len() - 1)
    }

    /// Takes a connect request: queue pair on the poller's SRQ and CQ, accept.
    /// Returns whether a connection was added.
    pub fn adopt(&mut self, inc: Incoming, io: &mut Io) -> bool {
        if io.stopping {
            let _ = inc.id.reject(&encode_reject(RejectStatus::NoResources));
            return false;
        }
        match self.try_adopt(inc, io) {
            Ok(()) => true,
            Err(e) => {
                tracing::error!(
                    poller = self.poller,
                    "cannot accept an NVMe/RDMA queue: {e}"
                );
                false
            }
        }
    }

    fn try_adopt(&mut self, inc: Incoming, io: &mut Io) -> io::Result<()> {
        let cm = match &self.cm {
            Some(c) => c.clone(),
            None => {
                let c = CmChannel::new()?;
                self.cm = Some(c.clone());
                c
            }
        };
        let dev = match self.device_index(inc.id.device(), io) {
            Ok(d) => d,
            Err(e) => {
                let _ = inc.id.reject(&encode_reject(RejectStatus::NoResources));
                return Err(e);
            }
        };
        let mut id = CmId::adopt(inc.id, &cm)?;
        let peer = id.peer();
        let depth = inc.req.hsqsize + 1;
        let d = &self.devices[dev];
        // Twice the queue's depth in command slots: a response's SEND may
        // not have completed here when the host already reuses its command
        // id. Per slot: a READ, or a WRITE and the response SEND.
        let send_wr = 4 * depth as u32 + 8;
        if send_wr > d.max_qp_wr || d.cq_committed + send_wr > d.cq_size {
            let _ = id.reject(&encode_reject(RejectStatus::NoResources));
            return Err(io::Error::other(format!(
                "{peer}: no room for a {depth}-entry queue on this poller's RDMA device \
                 ({} of {} completion entries committed; max {} work requests per QP)",
                d.cq_committed, d.cq_size, d.max_qp_wr
            )));
        }
        let cfg = QpConfig {
            pd: &d.pd,
            send_cq: &d.cq,
            recv_cq: &d.cq,
            srq: Some(&d.srq),
            max_send_wr: send_wr,
            max_recv_wr: 0,
            max_send_sge: 1,
            max_recv_sge: 0,
            max_inline_data: 64,
        };
        let reject = |id: &mut CmId| {
            let _ = id.reject(&encode_reject(RejectStatus::NoResources));
        };
        if let Err(e) = id.create_qp(&cfg) {
            reject(&mut id);
            return Err(e);
        }
        let idx = queue::vacant(&mut self.conns);
        id.set_context(idx as u64);
        let read_credits = d.max_rd_atom.min(inc.host_responder_resources).max(1);
        let reply = ConnectReply {
            recfmt: 0,
            crqsize: depth,
        }
        .encode();
        let param = ConnParam {
            private_data: &reply,
            responder_resources: 0,
            initiator_depth: read_credits,
            retry_count: 7,
            rnr_retry_count: 7,
        };
        if let Err(e) = id.accept(&param) {
            reject(&mut id);
            return Err(e);
        }
        let qp_num = id.qp_num();
        tracing::debug!(poller = self.poller, %peer, qid = inc.req.qid, depth, read_credits, qp_num, "NVMe/RDMA queue accepted");
        self.by_qp.insert((dev, qp_num), idx);
        self.devices[dev].cq_committed += send_wr;
        self.conns[idx] = Some(Box::new(RdmaConn {
            send_wr,
            id,
            dev,
            qp_num,
            idx,
            peer,
            phase: Phase::Accepting,
            since: Instant::now(),
            qid: inc.req.qid,
            depth,
            read_credits,
            reads: 0,
            bind: Binding::new(inc.pending),
            sends: SendWatch::default(),
            cmds: (0..2 * depth).map(|_| None).collect(),
            held_aers: Vec::new(),
            sq_head: 0,
            awaiting_buffer: VecDeque::new(),
            awaiting_read: VecDeque::new(),
            signaled: 0,
            backend_ops: 0,
        }));
        Ok(())
    }

    /// Polls to put in the ring: the CM channel and each device's CQ channel.
    pub fn arm(&mut self, sq: &mut Submissions) {
        use io_uring::{opcode, types};
        if let (Some(cm), false) = (&self.cm, self.cm_armed) {
            let poll = opcode::PollAdd::new(types::Fd(cm.fd()), libc::POLLIN as u32)
                .build()
                .user_data(Token::RdmaCm.encode());
            // SAFETY: a poll points at no memory (the ring holds the file).
            unsafe { sq.push(poll) };
            self.cm_armed = true;
        }
        for (i, d) in self.devices.iter_mut().enumerate() {
            if !d.armed {
                let poll = opcode::PollAdd::new(types::Fd(d.cq.fd()), libc::POLLIN as u32)
                    .build()
                    .user_data(Token::RdmaCq(i).encode());
                // SAFETY: as above.
                unsafe { sq.push(poll) };
                d.armed = true;
            }
        }
    }

    /// The CM channel is readable: connection state changes.
    pub fn on_cm(&mut self) {
        self.cm_armed = false;
        let Some(cm) = self.cm.clone() else { return };
        loop {
            let ev = match cm.next_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(poller = self.poller, "RDMA CM: {e}");
                    break;
                }
            };
            let Some(conn) = self
                .conns
                .get_mut(ev.context as usize)
                .and_then(Option::as_mut)
            else {
                continue;
            };
            match ev.kind {
                CmEventKind::Established => {
                    if conn.phase == Phase::Accepting {
                        conn.phase = Phase::Live;
                    }
                    tracing::debug!(peer = %conn.peer, qid = conn.qid, "NVMe/RDMA queue established");
                }
                CmEventKind::Disconnected => conn.close("host disconnected"),
                CmEventKind::DeviceRemoval => conn.close("RDMA device removed"),
                CmEventKind::Error => conn.close(&format!("{} (status {})", ev.name, ev.status)),
                _ => tracing::debug!(peer = %conn.peer, event = %ev.name, "RDMA CM event"),
            }
        }
    }

    /// A device's completion channel is readable.
    pub fn on_cq(&mut self, dev: usize, io: &mut Io) {
        let Some(d) = self.devices.get_mut(dev) else {
            return;
        };
        d.armed = false;
        if let Err(e) = d.cq.take_events() {
            tracing::error!(poller = self.poller, "re-arming the RDMA CQ: {e}");
        }
        self.drain_cq(dev, io);
    }

    /// Busy polling: takes whatever completions every device has.
    pub fn poll_all(&mut self, io: &mut Io) {
        for dev in 0..self.devices.len() {
            self.drain_cq(dev, io);
        }
    }

    /// Handles every completion the device's CQ holds, then reposts receives.
    fn drain_cq(&mut self, dev: usize, io: &mut Io) {
        let mut wcs = std::mem::take(&mut self.completions);
        loop {
            wcs.clear();
            match self.devices[dev].cq.poll(&mut wcs) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(poller = self.poller, "polling the RDMA CQ: {e}");
                    break;
                }
            }
            for wc in &wcs {
                if wc.wr_id & RECV_BIT != 0 {
                    self.on_recv(dev, wc, io);
                } else {
                    self.on_send_done(wc, io);
                }
            }
        }
        self.completions = wcs;
        let d = &mut self.devices[dev];
        if let Err(e) = d.post_recvs(io) {
            tracing::error!(poller = self.poller, "posting SRQ receives: {e}");
        }
    }

    fn on_recv(&mut self, dev: usize, wc: &Completion, io: &mut Io) {
        let slot = wc.wr_id as u32;
        let d = &mut self.devices[dev];
        d.unposted.push(slot);
        if !wc.ok() {
            if !wc.is_flush() {
                tracing::warn!(
                    poller = self.poller,
                    "SRQ receive failed: {}",
                    wc.status_str()
                );
            }
            return;
        }
        let conn = self
            .by_qp
            .get(&(dev, wc.qp_num))
            .and_then(|&i| self.conns[i].as_mut());
        let Some(conn) = conn else { return };
        if conn.phase == Phase::Closing {
            return;
        }
        let len = wc.byte_len as usize;
        if len < SQE_LEN {
            conn.close(&format!("received a {len}-byte capsule"));
            return;
        }
        let sqe = Sqe::from_bytes(&d.capsules.mem[slot as usize]);
        let data = &mut d.recvs[slot as usize].data;
        conn.on_capsule(&sqe, len - SQE_LEN, data, &d.arena_mr, io);
    }

    fn on_send_done(&mut self, wc: &Completion, io: &mut Io) {
        let idx = (wc.wr_id >> 24) as usize;
        let kind = (wc.wr_id >> 16) & 0xff;
        let slot = wc.wr_id as u16;
        let Some(conn) = self.conns.get_mut(idx).and_then(Option::as_mut) else {
            return;
        };
        if conn.qp_num != wc.qp_num {
            return;
        }
        if kind == WR_WRITE {
            // Unsignaled: only a failure (or flush) completes alone.
            if !wc.is_flush() {
                conn.close(&format!("RDMA WRITE failed: {}", wc.status_str()));
            }
            return;
        }
        conn.signaled -= 1;
        conn.sends.progressed(conn.signaled > 0);
        if !wc.ok() {
            if !wc.is_flush() {
                let what = if kind == WR_READ {
                    "RDMA READ"
                } else {
                    "response SEND"
                };
                conn.close(&format!("{what} failed: {}", wc.status_str()));
            }
            if kind == WR_READ {
                conn.reads -= 1;
            }
            if kind == WR_RESPONSE {
                conn.free_slot(slot, io);
            }
            return;
        }
        let d = &self.devices[conn.dev];
        match kind {
            WR_RESPONSE => conn.free_slot(slot, io),
            WR_READ => {
                conn.reads -= 1;
                if let Some(s) = conn.cmds.get_mut(slot as usize).and_then(Option::as_mut) {
                    s.cmd.received = s.cmd.len;
                    conn.run(slot, &d.arena_mr, io);
                }
                conn.start_reads(&d.arena_mr, io);
            }
            _ => {}
        }
    }

    pub fn on_backend(&mut self, c: usize, slot: u16, res: i32, io: &mut Io) {
        let Some(conn) = self.conns.get_mut(c).and_then(Option::as_mut) else {
            return;
        };
        conn.backend_ops -= 1;
        let Some(s) = conn.cmds.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        match queue::on_backend(&mut s.cmd, res, io) {
            BackendStep::Submit(e) => {
                let e = e.user_data(Token::RdmaBackend(c, slot).encode());
                // SAFETY: as `queue::submit_backend`: the rest of a short
                // transfer, in the command's arena buffer.
                unsafe { io.sq.push(e) };
                conn.backend_ops += 1;
            }
            BackendStep::Complete => {
                let mr = &self.devices[conn.dev].arena_mr;
                conn.complete(slot, mr, io);
            }
            BackendStep::Pending => {}
        }
    }

    pub fn on_tick(&mut self, io: &mut Io) {
        for c in self.conns.iter_mut().flatten() {
            c.on_tick(&io.registry.admission.limits);
        }
    }

    /// Lets queues move on (arena space freed, a drain) and frees closed ones.
    pub fn pump(&mut self, io: &mut Io) {
        let mut done = Vec::new();
        for (i, slot) in self.conns.iter_mut().enumerate() {
            let Some(conn) = slot else { continue };
            if conn.phase != Phase::Closing {
                let mr = &self.devices[conn.dev].arena_mr;
                conn.grant_buffers(mr, io);
                if io.stopping && conn.busy() == 0 {
                    conn.close("target shutting down");
                }
                if conn.bind.must_close() && conn.signaled == 0 {
                    conn.close(
                        "disconnected, and no place for a connection waiting for its Connect",
                    );
                }
            }
            if conn.phase == Phase::Closing && conn.backend_ops == 0 {
                if conn.signaled == 0 {
                    done.push((i, false));
                } else if conn.since.elapsed() > FLUSH_TIMEOUT {
                    done.push((i, true));
                }
            }
        }
        for (i, forced) in done {
            let dev = self.conns[i].as_ref().expect("listed above").dev;
            // Receives this queue pair consumed must come back to the SRQ's
            // books before it goes (its completions would vanish with it).
            self.drain_cq(dev, io);
            let Some(mut conn) = self.conns[i].take() else {
                continue;
            };
            if conn.backend_ops > 0 || conn.signaled > 0 && !forced {
                self.conns[i] = Some(conn); // the drain started more work
                continue;
            }
            if conn.signaled > 0 {
                // A device that never flushes (removed, or broken): destroying
                // the QP ends its access to the buffers before they are reused.
                tracing::warn!(peer = %conn.peer, pending = conn.signaled, "freeing an RDMA queue whose work requests never flushed");
            }
            self.by_qp.remove(&(dev, conn.qp_num));
            self.devices[dev].cq_committed -= conn.send_wr;
            conn.teardown(io);
            drop(conn);
        }
        for d in &mut self.devices {
            if !d.unposted.is_empty() {
                if let Err(e) = d.post_recvs(io) {
                    tracing::error!(poller = self.poller, "posting SRQ receives: {e}");
                }
            }
        }
    }

    /// Closes every queue (drain timeout at shutdown).
    pub fn close_all(&mut self, why: &str) {
        for c in self.conns.iter_mut().flatten() {
            c.close(why);
        }
    }
}

impl RdmaConn {
    fn close(&mut self, why: &str) {
        if self.phase == Phase::Closing {
            return;
        }
        match &self.bind.assoc {
            Some(a) => {
                tracing::info!(peer = %self.peer, cntlid = a.ctrl.cntlid, qid = a.qid, "NVMe/RDMA queue closed: {why}")
            }
            None => {
                tracing::debug!(peer = %self.peer, qid = self.qid, "NVMe/RDMA connection closed: {why}")
            }
        }
        self.phase = Phase::Closing;
        self.since = Instant::now();
        // The queue pair goes to the error state: what is posted completes
        // as flushed, and the pump frees the queue once all has.
        self.id.disconnect();
    }

    fn busy(&self) -> usize {
        self.cmds.iter().flatten().count()
    }

    fn teardown(&mut self, io: &mut Io) {
        for mut s in self.cmds.iter_mut().filter_map(Option::take) {
            self.bind.release(&mut s.cmd, io);
        }
        queue::end_association(self.bind.assoc.take(), io.stopping);
    }

    /// Periodic checks of every deadline: establishment and Connect,
    /// keep-alive and enable (through the association), RDMA READs, and
    /// the progress of the work requests posted.
    fn on_tick(&mut self, limits: &Limits) {
        if self.phase == Phase::Closing {
            return;
        }
        if self.bind.assoc.is_none() && queue::handshake_overdue(self.since, limits) {
            self.close("no Connect within limits.handshake_timeout of the connection");
            return;
        }
        if let Some(why) = queue::check_association(self.bind.assoc.as_ref(), limits) {
            self.close(why);
            return;
        }
        let stuck = self.cmds.iter().flatten().any(|s| {
            s.cmd.received < s.cmd.requested && s.cmd.since.elapsed() > limits.data_timeout
        });
        if stuck {
            self.close(
                "an RDMA READ of the host's data did not complete within limits.data_timeout",
            );
        } else if self.sends.stalled(limits.send_timeout) {
            self.close("the host did not take what was sent to it (no send completed) within limits.send_timeout");
        }
    }

    /// A command capsule arrived with `data_len` bytes of in-capsule data in
    /// the receive's buffer `recv_data` (which the command may take).
    fn on_capsule(
        &mut self,
        sqe: &Sqe,
        data_len: usize,
        recv_data: &mut Option<ArenaBuf>,
        mr: &Mr,
        io: &mut Io,
    ) {
        let cid = sqe.cid();
        let sgl = sqe.sgl();
        tracing::trace!(peer = %self.peer, cid, opcode = sqe.opcode(), ?sgl, data_len, "capsule");
        let mut remote = None;
        let in_capsule = match sgl {
            Sgl::InCapsule { offset, len } => {
                if offset != 0 {
                    return self.respond_now(cid, Status::SGL_OFFSET_INVALID, None);
                }
                if len as usize > data_len {
                    return self.respond_now(cid, Status::SGL_DATA_LENGTH_INVALID, None);
                }
                true
            }
            Sgl::Keyed {
                addr,
                key,
                invalidate,
                ..
            } => {
                remote = Some(Remote {
                    addr,
                    key,
                    invalidate,
                });
                false
            }
            Sgl::Null => false,
            Sgl::Transport { .. } | Sgl::Unsupported(_) => {
                return self.respond_now(cid, Status::SGL_DESCRIPTOR_TYPE_INVALID, None);
            }
        };
        let mut cmd = match command::plan(self.bind.assoc.as_ref(), sqe, sgl.len()) {
            Ok(c) => c,
            Err(st) => return self.respond_now(cid, st, remote),
        };
        // In-capsule data must cover what the command moves (the Linux host
        // sends a whole page of Dataset Management ranges).
        if in_capsule && (cmd.to_host || (sgl.len() as usize) < cmd.len) {
            return self.respond_now(cid, Status::SGL_DATA_LENGTH_INVALID, remote);
        }
        if remote.is_some() && (sgl.len() as usize) < cmd.len {
            return self.respond_now(cid, Status::SGL_DATA_LENGTH_INVALID, remote);
        }
        let Some(slot) = self.cmds.iter().position(Option::is_none) else {
            self.close("the host sent more commands than its queue holds");
            return;
        };
        self.sq_head = (self.sq_head + 1) % self.depth;
        if in_capsule && cmd.len > 0 {
            // The data is used in place: the receive gets a new buffer.
            cmd.buf = recv_data.take();
            if let Some(b) = &cmd.buf {
                self.bind.adopt(b, io);
            }
            cmd.received = cmd.len;
        }
        self.cmds[slot] = Some(Slot { cmd, remote });
        self.advance(slot as u16, mr, io);
    }

    /// Moves a command on: it waits for an arena buffer, reads its data from
    /// the host, or runs.
    fn advance(&mut self, slot: u16, mr: &Mr, io: &mut Io) {
        let s = self.cmds[slot as usize]
            .as_mut()
            .expect("advancing a live slot");
        if s.cmd.len > 0 && s.cmd.buf.is_none() {
            match self.bind.alloc(s.cmd.len, io) {
                Some(b) => s.cmd.buf = Some(b),
                None => {
                    if !self.awaiting_buffer.contains(&slot) {
                        self.awaiting_buffer.push_back(slot);
                    }
                    return;
                }
            }
        }
        if !s.cmd.to_host && s.cmd.received < s.cmd.len {
            self.awaiting_read.push_back(slot);
            self.start_reads(mr, io);
            return;
        }
        self.run(slot, mr, io);
    }

    /// Posts RDMA READs for waiting commands, as far as the credits allow.
    fn start_reads(&mut self, mr: &Mr, io: &mut Io) {
        while self.reads < self.read_credits && self.phase != Phase::Closing {
            let Some(slot) = self.awaiting_read.pop_front() else {
                return;
            };
            let Some(s) = self.cmds.get_mut(slot as usize).and_then(Option::as_mut) else {
                continue;
            };
            let (Some(remote), Some(buf)) = (s.remote, s.cmd.buf.as_ref()) else {
                continue;
            };
            let sge = [Sge {
                addr: io.arena.addr(buf, 0),
                len: s.cmd.len as u32,
                lkey: mr.lkey(),
            }];
            let wr = SendWr {
                wr_id: wr_id(self.idx, WR_READ, slot),
                op: SendOp::RdmaRead {
                    remote_addr: remote.addr,
                    rkey: remote.key,
                },
                sges: &sge,
                signaled: true,
                inline: false,
            };
            s.cmd.requested = s.cmd.len;
            s.cmd.since = Instant::now();
            // SAFETY: the QP is alive; the command's arena buffer is registered
            // and stays with the command until the READ completes.
            match unsafe { rdmablk_common::rdma::verbs::post_send(self.id.qp(), &[wr]) } {
                Ok(()) => {
                    self.reads += 1;
                    self.signaled += 1;
                    self.sends.posted();
                }
                Err(e) => {
                    self.close(&format!("posting an RDMA READ: {e}"));
                    return;
                }
            }
        }
    }

    fn grant_buffers(&mut self, mr: &Mr, io: &mut Io) {
        while let Some(&slot) = self.awaiting_buffer.front() {
            let Some(s) = self.cmds.get_mut(slot as usize).and_then(Option::as_mut) else {
                self.awaiting_buffer.pop_front();
                continue;
            };
            match self.bind.alloc(s.cmd.len, io) {
                Some(b) => {
                    s.cmd.buf = Some(b);
                    self.awaiting_buffer.pop_front();
                    self.advance(slot, mr, io);
                }
                None => return,
            }
        }
    }

    fn run(&mut self, slot: u16, mr: &Mr, io: &mut Io) {
        let s = self.cmds[slot as usize]
            .as_mut()
            .expect("running a live slot");
        match queue::run(
            &mut s.cmd,
            &mut self.bind,
            io,
            caps(),
            &self.peer,
            self.held_aers.len(),
        ) {
            Ran::Complete => self.complete(slot, mr, io),
            Ran::Disconnected => {
                // The queue pair stays (NVMe Base 2.1, 6.4) but has no
                // queue: it gets the Connect deadline again.
                self.complete(slot, mr, io);
                self.since = Instant::now();
            }
            Ran::Held => {
                self.held_aers.push(s.cmd.sqe.cid());
                self.free_slot(slot, io);
            }
            Ran::Waiting(entries) => {
                self.backend_ops +=
                    queue::submit_backend(entries, Token::RdmaBackend(self.idx, slot), io);
            }
        }
    }

    /// Sends the data (reads) and the response of a finished command.
    fn complete(&mut self, slot: u16, mr: &Mr, io: &mut Io) {
        let s = self.cmds[slot as usize]
            .as_ref()
            .expect("completing a live slot");
        let c = &s.cmd;
        let mut write_sge = None;
        if c.to_host && c.status.is_success() && c.len > 0 {
            if let (Some(buf), Some(r)) = (c.buf.as_ref(), s.remote) {
                write_sge = Some((
                    [Sge {
                        addr: io.arena.addr(buf, 0),
                        len: c.len as u32,
                        lkey: mr.lkey(),
                    }],
                    r,
                ));
            }
        }
        let sqid = match &c.work {
            command::Work::Connect => rdmablk_common::fabrics::ConnectCmd::from_sqe(&c.sqe).qid,
            _ => self.qid,
        };
        let cqe = self.cqe(c.sqe.cid(), c.status, (c.dw0, c.dw1), sqid);
        let invalidate = s.remote.filter(|r| r.invalidate).map(|r| r.key);
        let write = write_sge.as_ref().map(|(sge, r)| SendWr {
            wr_id: wr_id(self.idx, WR_WRITE, slot),
            op: SendOp::RdmaWrite {
                remote_addr: r.addr,
                rkey: r.key,
            },
            sges: sge,
            signaled: false,
            inline: false,
        });
        self.post_response(write, &cqe, wr_id(self.idx, WR_RESPONSE, slot), invalidate);
    }

    fn cqe(&self, cid: u16, status: Status, dws: (u32, u32), sqid: u16) -> [u8; 16] {
        if !status.is_success() {
            tracing::debug!(peer = %self.peer, cid, %status, "command failed");
        }
        queue::response(&self.bind, (cid, status), dws, self.sq_head, sqid).to_bytes()
    }

    /// Posts `wrs` followed by the signaled SEND of `cqe` (inline).
    fn post_response(
        &mut self,
        before: Option<SendWr>,
        cqe: &[u8; 16],
        id: u64,
        invalidate: Option<u32>,
    ) {
        let sge = [Sge {
            addr: cqe.as_ptr(),
            len: cqe.len() as u32,
            lkey: 0,
        }];
        let mut wrs: smallvec::SmallVec<[SendWr; 2]> = before.into_iter().collect();
        wrs.push(SendWr {
            wr_id: id,
            op: SendOp::Send { invalidate },
            sges: &sge,
            signaled: true,
            inline: true,
        });
        // SAFETY: the QP is alive; the WRITE's source is the command's
        // registered arena buffer, held until the SEND completes; the
        // response is inline (copied during the call).
        match unsafe { rdmablk_common::rdma::verbs::post_send(self.id.qp(), &wrs) } {
            Ok(()) => {
                self.signaled += 1;
                self.sends.posted();
            }
            Err(e) => {
                self.close(&format!("posting a response: {e}"));
                // Nothing was posted: the slot is freed at teardown.
            }
        }
    }

    /// Answers a command that never got a slot.
    fn respond_now(&mut self, cid: u16, status: Status, remote: Option<Remote>) {
        tracing::debug!(peer = %self.peer, cid, %status, "command refused before it ran");
        self.sq_head = (self.sq_head + 1) % self.depth;
        let cqe = self.cqe(cid, status, (0, 0), self.qid);
        let invalidate = remote.filter(|r| r.invalidate).map(|r| r.key);
        self.post_response(
            None,
            &cqe,
            wr_id(self.idx, WR_RESPONSE_NO_SLOT, 0),
            invalidate,
        );
    }

    fn free_slot(&mut self, slot: u16, io: &mut Io) {
        if let Some(mut s) = self.cmds.get_mut(slot as usize).and_then(Option::take) {
            self.bind.release(&mut s.cmd, io);
        }
    }
}
