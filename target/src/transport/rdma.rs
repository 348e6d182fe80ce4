//! NVMe/RDMA. A listener thread takes RDMA CM connect requests and hands
//! them to pollers; each poller keeps, per device, one protection domain,
//! one CQ on a completion channel that its io_uring polls, and one SRQ
//! whose receives hold a 64-byte command capsule and an arena buffer for
//! in-capsule data. Reads go disk → arena (READ_FIXED) → RDMA WRITE chained
//! to the response SEND; writes go RDMA READ → arena → WRITE_FIXED → SEND.
//! The arena is registered once with io_uring and once per device: no copy
//! between disk and NIC. Commands go through the shared state machine
//! (`queue.rs`), to which [`RdmaWire`] brings RDMA READs and responses.

use crate::admission::Permit;
use crate::binding::Binding;
use crate::command::Command;
use crate::config;
use crate::error::{starting, DaemonError};
use crate::fabric::{TransportCaps, ADMIN_QUEUE_SIZE};
use crate::poller::{Endpoint, Io, Token};
use crate::queue::{self, InCapsule, Intake, Queue, Response, SendWatch, Wire};
use crate::transport::{base_caps_with, Listen, ListenerHandle, Profile, Transport};
use rdmablk_common::fabrics::discovery::{rdma_tsas, trtype};
use rdmablk_common::mem::ArenaBuf;
use rdmablk_common::nvme::identify::sgls;
use rdmablk_common::nvme::{Sgl, Sqe, SQE_LEN};
use rdmablk_common::rdma::private_data::{
    encode_reject, ConnectReply, ConnectRequest, RejectStatus,
};
use rdmablk_common::rdma::{
    access, CmChannel, CmEventKind, CmId, CompChannel, Completion, ConnParam, Cq, Device, Mr,
    NewId, Pd, QpConfig, SendOp, SendWr, Sge, Srq,
};
use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
/// Pending connect requests the listener queues.
const LISTEN_BACKLOG: i32 = 128;

/// The NVMe/RDMA transport.
pub struct NvmeRdma;

/// NVMe/RDMA as controllers and discovery see it.
const PROFILE: Profile = Profile {
    kind: config::Transport::Rdma,
    caps: base_caps_with(sgls::KEYED, "rdma"),
    // Completion and CM channels are polled, a common operation.
    ring_ops: &[],
    trtype: trtype::RDMA,
    tsas: rdma_tsas::RDMA_CM,
};

/// In-capsule data the target accepts (beyond the 64-byte command).
const IN_CAPSULE_DATA: usize = PROFILE.caps.in_capsule_data as usize;

impl Transport for NvmeRdma {
    fn profile(&self) -> &'static Profile {
        &PROFILE
    }

    fn listen(&self, l: Listen) -> Result<ListenerHandle, DaemonError> {
        let handle = ListenerHandle::new(l.stop.clone(), None);
        listen(l).map(|()| handle)
    }

    fn endpoint(&self, ep: u8, poller: usize) -> Box<dyn Endpoint> {
        Box::new(RdmaEndpoint::new(ep, poller))
    }
}

/// A connect request on its way from the listener to a poller.
struct Incoming {
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
        PROFILE.caps.max_queue_entries
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
fn listen(l: Listen) -> Result<(), DaemonError> {
    let Listen {
        addr,
        ep,
        pollers,
        registry,
        stop,
    } = l;
    let url = format!("rdma://{addr}");
    let failed = |hint| {
        let url = url.clone();
        move |source| DaemonError::Listen { url, source, hint }
    };
    rdmablk_common::rdma::require_device().map_err(failed(""))?;
    let chan = CmChannel::new().map_err(failed(""))?;
    let mut id = CmId::new(&chan).map_err(failed(""))?;
    id.listen(addr, LISTEN_BACKLOG).map_err(failed(
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
                if stop.load(Ordering::Acquire) {
                    tracing::info!("stopped listening on rdma://{addr}");
                    return;
                }
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
                        let inc = Incoming {
                            id: new_id,
                            req,
                            host_responder_resources: ev.responder_resources,
                            pending,
                        };
                        pollers[next % pollers.len()].adopt(ep, Box::new(inc));
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

/// Marks SRQ receives in the wr_id: a completion's opcode is not valid
/// when its status is an error, its wr_id always is.
const RECV_BIT: u64 = 1 << 63;

/// Send work request kinds, in the wr_id.
const WR_RESPONSE: u64 = 1;
const WR_RESPONSE_NO_SLOT: u64 = 2;
const WR_READ: u64 = 3;
const WR_WRITE: u64 = 4;

fn wr_id(conn: u32, kind: u64, slot: u16) -> u64 {
    (conn as u64) << 24 | kind << 16 | slot as u64
}

/// Where a queue's work requests go: its queue pair, or a recorder in
/// unit tests.
pub trait QueuePair {
    /// Posts a chain of send work requests with one doorbell.
    ///
    /// # Safety
    /// As `verbs::post_send`: local memory in the requests is registered
    /// and left to the device until the requests complete (inline data
    /// excepted: it is copied during the call).
    unsafe fn post(&mut self, wrs: &[SendWr]) -> io::Result<()>;

    /// Moves the queue pair to the error state: what is posted completes
    /// as flushed.
    fn disconnect(&mut self);
}

impl QueuePair for CmId {
    unsafe fn post(&mut self, wrs: &[SendWr]) -> io::Result<()> {
        // SAFETY: the QP lives as long as this CM id; the caller vouches
        // for the memory.
        unsafe { rdmablk_common::rdma::verbs::post_send(self.qp(), wrs) }
    }

    fn disconnect(&mut self) {
        CmId::disconnect(self);
    }
}

/// An RDMA READ waiting for one of the queue's READ credits.
struct PendingRead {
    slot: u16,
    /// The command's arena buffer, and how many bytes to read into it.
    local: *mut u8,
    len: u32,
    remote_addr: u64,
    rkey: u32,
}

/// One NVMe/RDMA queue pair: one queue of a controller.
struct RdmaQueue<P> {
    q: Queue,
    w: RdmaWire<P>,
    dev: usize,
    qp_num: u32,
    /// Send queue size (its share of the device's CQ).
    send_wr: u32,
}

/// A queue pair, as the state machine uses it.
struct RdmaWire<P> {
    qp: P,
    /// The address the host reached.
    local: Option<IpAddr>,
    /// Local key of the poller's arena on the queue's device.
    lkey: u32,
    idx: u32,
    /// Entries of the queue (HSQSIZE + 1), which sized the send queue.
    entries: u16,
    phase: Phase,
    since: Instant,
    /// RDMA READs we may have outstanding, and how many are.
    read_credits: u8,
    reads: u8,
    awaiting_read: VecDeque<PendingRead>,
    /// Signaled work requests posted and not completed.
    signaled: usize,
    /// Whether the host takes what is sent (limits.send_timeout).
    sends: SendWatch,
}

impl<P: QueuePair> Wire for RdmaWire<P> {
    const DATA_OVERDUE: &'static str =
        "an RDMA READ of the host's data did not complete within limits.data_timeout";

    fn caps(&self) -> TransportCaps {
        PROFILE.caps
    }

    fn local_addr(&self) -> Option<IpAddr> {
        self.local
    }

    fn queue_entries(&self) -> Option<u16> {
        Some(self.entries)
    }

    /// One RDMA READ of all the data, when a credit is free.
    fn fetch(&mut self, slot: u16, cmd: &mut Command, io: &mut Io) {
        let (Sgl::Keyed { addr, key, .. }, Some(buf)) = (cmd.sqe.sgl(), cmd.buf.as_ref()) else {
            unreachable!("only keyed data is fetched, into a buffer")
        };
        self.awaiting_read.push_back(PendingRead {
            slot,
            local: io.arena.addr(buf, 0),
            len: cmd.len as u32,
            remote_addr: addr,
            rkey: key,
        });
        cmd.requested = cmd.len;
        self.start_reads();
    }

    /// The data (an RDMA WRITE, unsignaled) chained to the response SEND.
    fn respond(&mut self, r: Response<'_>, io: &mut Io) {
        let (slot, kind) = match r.slot {
            Some(s) => (s, WR_RESPONSE),
            None => (0, WR_RESPONSE_NO_SLOT),
        };
        let sgl = r.sqe.sgl();
        let invalidate = match sgl {
            Sgl::Keyed {
                key,
                invalidate: true,
                ..
            } => Some(key),
            _ => None,
        };
        let write_sge = match (r.data, sgl) {
            (Some((buf, len)), Sgl::Keyed { addr, key, .. }) => Some((
                [Sge {
                    addr: io.arena.addr(buf, 0),
                    len: len as u32,
                    lkey: self.lkey,
                }],
                addr,
                key,
            )),
            _ => None,
        };
        let cqe = r.cqe.to_bytes();
        let send_sge = [Sge {
            addr: cqe.as_ptr(),
            len: cqe.len() as u32,
            lkey: 0,
        }];
        let mut wrs: smallvec::SmallVec<[SendWr; 2]> = smallvec::SmallVec::new();
        if let Some((sge, remote_addr, rkey)) = &write_sge {
            wrs.push(SendWr {
                wr_id: wr_id(self.idx, WR_WRITE, slot),
                op: SendOp::RdmaWrite {
                    remote_addr: *remote_addr,
                    rkey: *rkey,
                },
                sges: sge,
                signaled: false,
                inline: false,
            });
        }
        wrs.push(SendWr {
            wr_id: wr_id(self.idx, kind, slot),
            op: SendOp::Send { invalidate },
            sges: &send_sge,
            signaled: true,
            inline: true,
        });
        // SAFETY: the WRITE's source is the command's arena buffer,
        // registered on this device (`lkey`), which the command keeps until
        // the SEND chained after it completes (`Queue::sent`), and the queue
        // is freed only once every signaled request has completed or the QP
        // is destroyed; the response is inline (copied during the call).
        match unsafe { self.qp.post(&wrs) } {
            Ok(()) => {
                self.signaled += 1;
                self.sends.posted();
            }
            // Nothing was posted: the slot is freed at teardown.
            Err(e) => self.fail(&format!("posting a response: {e}")),
        }
    }

    fn closing(&self) -> bool {
        self.phase == Phase::Closing
    }

    /// The queue pair goes to the error state: what is posted completes as
    /// flushed, and the endpoint frees the queue once all has.
    fn shut(&mut self) {
        self.phase = Phase::Closing;
        self.since = Instant::now();
        self.qp.disconnect();
    }
}

impl<P: QueuePair> RdmaWire<P> {
    /// The wire of queue `idx` on `qp` (reached at `local`), whose arena key
    /// is `lkey` and which may have `read_credits` RDMA READs outstanding.
    fn new(
        qp: P,
        local: Option<IpAddr>,
        lkey: u32,
        idx: u32,
        entries: u16,
        read_credits: u8,
    ) -> RdmaWire<P> {
        RdmaWire {
            qp,
            local,
            lkey,
            idx,
            entries,
            phase: Phase::Accepting,
            since: Instant::now(),
            read_credits,
            reads: 0,
            awaiting_read: VecDeque::new(),
            signaled: 0,
            sends: SendWatch::default(),
        }
    }

    /// Posts RDMA READs for waiting commands, as far as the credits allow.
    fn start_reads(&mut self) {
        while self.reads < self.read_credits && self.phase != Phase::Closing {
            let Some(r) = self.awaiting_read.pop_front() else {
                return;
            };
            let sge = [Sge {
                addr: r.local,
                len: r.len,
                lkey: self.lkey,
            }];
            let wr = SendWr {
                wr_id: wr_id(self.idx, WR_READ, r.slot),
                op: SendOp::RdmaRead {
                    remote_addr: r.remote_addr,
                    rkey: r.rkey,
                },
                sges: &sge,
                signaled: true,
                inline: false,
            };
            // SAFETY: the READ lands in the command's registered arena
            // buffer, which the command keeps until its data has arrived (it
            // cannot run before), and the queue is freed only once every
            // signaled request has completed or the QP is destroyed.
            match unsafe { self.qp.post(&[wr]) } {
                Ok(()) => {
                    self.reads += 1;
                    self.signaled += 1;
                    self.sends.posted();
                }
                Err(e) => return self.fail(&format!("posting an RDMA READ: {e}")),
            }
        }
    }

    /// The queue pair failed under us: close it.
    fn fail(&mut self, why: &str) {
        if self.phase != Phase::Closing {
            tracing::warn!(queue = self.idx, "NVMe/RDMA queue closed: {why}");
            self.shut();
        }
    }
}

impl<P: QueuePair> RdmaQueue<P> {
    fn close(&mut self, why: &str) {
        self.q.close(&mut self.w, why);
    }

    /// Periodic checks of every deadline: Connect, keep-alive and enable,
    /// RDMA READs (through the queue), and the progress of the work
    /// requests posted.
    fn on_tick(&mut self, io: &Io) {
        if self.w.phase == Phase::Closing {
            return;
        }
        let limits = &io.registry.admission.limits;
        if let Some(why) = self.q.overdue::<RdmaWire<P>>(limits) {
            self.close(why);
        } else if self.w.sends.stalled(limits.send_timeout) {
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
        io: &mut Io,
    ) {
        tracing::trace!(peer = %self.q.peer, cid = sqe.cid(), opcode = sqe.opcode(), sgl = ?sqe.sgl(), data_len, "capsule");
        let data = InCapsule::Buffer {
            buf: recv_data,
            len: data_len,
        };
        match self.q.receive(sqe, data, io, &mut self.w) {
            Intake::Taken => {}
            // A receive is consumed whatever we do: no stream to leave it in.
            Intake::Stall | Intake::Overrun => {
                self.close("the host sent more commands than its queue holds")
            }
        }
    }

    /// A send work request of this queue completed.
    fn on_send_done(&mut self, kind: u64, slot: u16, wc: &Completion, io: &mut Io) {
        if kind == WR_WRITE {
            // Unsignaled: only a failure (or flush) completes alone.
            if !wc.is_flush() {
                self.close(&format!("RDMA WRITE failed: {}", wc.status_str()));
            }
            return;
        }
        self.w.signaled -= 1;
        self.w.sends.progressed(self.w.signaled > 0);
        if kind == WR_READ {
            self.w.reads -= 1;
        }
        if !wc.ok() && !wc.is_flush() {
            let what = if kind == WR_READ {
                "RDMA READ"
            } else {
                "response SEND"
            };
            self.close(&format!("{what} failed: {}", wc.status_str()));
        }
        match kind {
            WR_RESPONSE => self.q.sent(Some(slot), io),
            WR_RESPONSE_NO_SLOT => self.q.sent(None, io),
            WR_READ if wc.ok() => {
                let len = self.q.command(slot).map_or(0, |c| c.len);
                self.q.data_arrived(slot, len, true, io, &mut self.w);
                self.w.start_reads();
            }
            _ => {}
        }
    }

    /// Lets the queue move on (arena space freed, a drain).
    fn pump(&mut self, io: &mut Io) {
        if self.w.phase == Phase::Closing {
            return;
        }
        self.q.grant_buffers(io, &mut self.w);
        self.q.deliver_events(io, &mut self.w);
        if io.stopping && self.q.busy() == 0 {
            self.close("target shutting down");
        }
        if self.q.bind.must_close() && self.w.signaled == 0 {
            self.close("disconnected, and no place for a connection waiting for its Connect");
        }
    }
}

/// What an endpoint's own tokens stand for: its CM channel, a device's CQ.
const CM: u16 = 0;
const CQ: u16 = 1;

/// The RDMA side of one poller.
struct RdmaEndpoint {
    ep: u8,
    poller: usize,
    cm: Option<Arc<CmChannel>>,
    cm_armed: bool,
    devices: Vec<DeviceRes>,
    conns: Vec<Option<Box<RdmaQueue<CmId>>>>,
    /// Queue of each (device, QP number): QP numbers are per device.
    by_qp: HashMap<(usize, u32), usize>,
    completions: Vec<Completion>,
}

impl Endpoint for RdmaEndpoint {
    fn adopt(&mut self, conn: Box<dyn Any + Send>, io: &mut Io) -> bool {
        let Ok(inc) = conn.downcast::<Incoming>() else {
            return false;
        };
        if io.stopping {
            let _ = inc.id.reject(&encode_reject(RejectStatus::NoResources));
            return false;
        }
        match self.try_adopt(*inc, io) {
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

    fn on_completion(&mut self, queue: u32, what: u16, _res: i32, io: &mut Io) {
        match what {
            CM => self.on_cm(),
            _ => self.on_cq(queue as usize, io),
        }
    }

    fn on_backend(&mut self, queue: u32, slot: u16, res: i32, io: &mut Io) {
        let conn = self.conns.get_mut(queue as usize).and_then(Option::as_mut);
        if let Some(c) = conn {
            c.q.on_backend(slot, res, io, &mut c.w);
        }
    }

    fn on_tick(&mut self, io: &mut Io) {
        for c in self.conns.iter_mut().flatten() {
            c.on_tick(io);
        }
    }

    fn pump(&mut self, io: &mut Io) -> usize {
        let freed = self.pump_queues(io);
        self.arm(io);
        freed
    }

    fn poll(&mut self, io: &mut Io) {
        for dev in 0..self.devices.len() {
            self.drain_cq(dev, io);
        }
    }

    fn queues(&self) -> usize {
        self.conns.iter().flatten().count()
    }

    fn standing_buffers(&self) -> usize {
        self.devices.iter().map(DeviceRes::recv_buffers).sum()
    }

    fn close_all(&mut self, why: &str) {
        for c in self.conns.iter_mut().flatten() {
            c.close(why);
        }
    }
}

impl RdmaEndpoint {
    fn new(ep: u8, poller: usize) -> RdmaEndpoint {
        RdmaEndpoint {
            ep,
            poller,
            cm: None,
            cm_armed: false,
            devices: Vec::new(),
            conns: Vec::new(),
            by_qp: HashMap::new(),
            completions: Vec::new(),
        }
    }

    fn device_index(&mut self, device: Device, io: &mut Io) -> io::Result<usize> {
        if let Some(i) = self.devices.iter().position(|d| d.device == device) {
            return Ok(i);
        }
        self.devices.push(DeviceRes::new(device, io)?);
        Ok(self.devices.len() - 1)
    }

    fn token(&self, queue: u32, what: u16) -> Token {
        Token::Endpoint {
            ep: self.ep,
            queue,
            what,
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
        let lkey = d.arena_mr.lkey();
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
        let q = Queue::new(
            Binding::new(inc.pending),
            peer,
            self.ep,
            idx as u32,
            inc.req.qid,
        );
        let local = id.local().map(|a| a.ip());
        let wire = RdmaWire::new(id, local, lkey, idx as u32, depth, read_credits);
        self.conns[idx] = Some(Box::new(RdmaQueue {
            q,
            w: wire,
            dev,
            qp_num,
            send_wr,
        }));
        Ok(())
    }

    /// Polls to put in the ring: the CM channel and each device's CQ channel.
    fn arm(&mut self, io: &mut Io) {
        use io_uring::{opcode, types};
        if let (Some(cm), false) = (&self.cm, self.cm_armed) {
            let poll = opcode::PollAdd::new(types::Fd(cm.fd()), libc::POLLIN as u32)
                .build()
                .user_data(self.token(0, CM).encode());
            // SAFETY: a poll points at no memory (the ring holds the file).
            unsafe { io.sq.push(poll) };
            self.cm_armed = true;
        }
        let ep = self.ep;
        let token = |queue, what| Token::Endpoint { ep, queue, what };
        for (i, d) in self.devices.iter_mut().enumerate() {
            if !d.armed {
                let poll = opcode::PollAdd::new(types::Fd(d.cq.fd()), libc::POLLIN as u32)
                    .build()
                    .user_data(token(i as u32, CQ).encode());
                // SAFETY: as above.
                unsafe { io.sq.push(poll) };
                d.armed = true;
            }
        }
    }

    /// The CM channel is readable: connection state changes.
    fn on_cm(&mut self) {
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
                    if conn.w.phase == Phase::Accepting {
                        conn.w.phase = Phase::Live;
                    }
                    tracing::debug!(peer = %conn.q.peer, qid = conn.q.qid, "NVMe/RDMA queue established");
                }
                CmEventKind::Disconnected => conn.close("host disconnected"),
                CmEventKind::DeviceRemoval => conn.close("RDMA device removed"),
                CmEventKind::Error => conn.close(&format!("{} (status {})", ev.name, ev.status)),
                _ => tracing::debug!(peer = %conn.q.peer, event = %ev.name, "RDMA CM event"),
            }
        }
    }

    /// A device's completion channel is readable.
    fn on_cq(&mut self, dev: usize, io: &mut Io) {
        let Some(d) = self.devices.get_mut(dev) else {
            return;
        };
        d.armed = false;
        if let Err(e) = d.cq.take_events() {
            tracing::error!(poller = self.poller, "re-arming the RDMA CQ: {e}");
        }
        self.drain_cq(dev, io);
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
        if conn.w.phase == Phase::Closing {
            return;
        }
        let len = wc.byte_len as usize;
        if len < SQE_LEN {
            conn.close(&format!("received a {len}-byte capsule"));
            return;
        }
        let sqe = Sqe::from_bytes(&d.capsules.mem[slot as usize]);
        let data = &mut d.recvs[slot as usize].data;
        conn.on_capsule(&sqe, len - SQE_LEN, data, io);
    }

    fn on_send_done(&mut self, wc: &Completion, io: &mut Io) {
        let idx = (wc.wr_id >> 24) as usize;
        let kind = (wc.wr_id >> 16) & 0xff;
        let slot = wc.wr_id as u16;
        let Some(conn) = self.conns.get_mut(idx).and_then(Option::as_mut) else {
            return;
        };
        if conn.qp_num == wc.qp_num {
            conn.on_send_done(kind, slot, wc, io);
        }
    }

    /// Lets queues move on (arena space freed, a drain) and frees closed
    /// ones; returns how many.
    fn pump_queues(&mut self, io: &mut Io) -> usize {
        let mut done = Vec::new();
        let mut freed = 0;
        for (i, slot) in self.conns.iter_mut().enumerate() {
            let Some(conn) = slot else { continue };
            conn.pump(io);
            if conn.w.phase == Phase::Closing && conn.q.idle_backend() {
                if conn.w.signaled == 0 {
                    done.push((i, false));
                } else if conn.w.since.elapsed() > FLUSH_TIMEOUT {
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
            if !conn.q.idle_backend() || conn.w.signaled > 0 && !forced {
                self.conns[i] = Some(conn); // the drain started more work
                continue;
            }
            if conn.w.signaled > 0 {
                // A device that never flushes (removed, or broken): destroying
                // the QP ends its access to the buffers before they are reused.
                tracing::warn!(peer = %conn.q.peer, pending = conn.w.signaled, "freeing an RDMA queue whose work requests never flushed");
            }
            self.by_qp.remove(&(dev, conn.qp_num));
            self.devices[dev].cq_committed -= conn.send_wr;
            conn.q.teardown(io);
            drop(conn);
            freed += 1;
        }
        for d in &mut self.devices {
            if !d.unposted.is_empty() {
                if let Err(e) = d.post_recvs(io) {
                    tracing::error!(poller = self.poller, "posting SRQ receives: {e}");
                }
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests;
