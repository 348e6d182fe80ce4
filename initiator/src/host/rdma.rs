//! An NVMe/RDMA queue of the host: RDMA CM connect with the NVMe/RDMA
//! private data, command capsules sent from a registered capsule area (small
//! writes with their data in the capsule), keyed SGLs that let the target
//! RDMA READ/WRITE the caller's registered buffers, responses received into
//! registered slots. Driven by the caller's io_uring (polls on the
//! completion and CM channels) or, for the admin queue, by blocking waits.

use super::Done;
use super::{HostError, QueueLimits};
use io_uring::{opcode, squeue, types};
use rdmablk_common::nvme::{Cqe, Sgl, Sqe, Status, CQE_LEN, SQE_LEN};
use rdmablk_common::rdma::private_data::{decode_reject, ConnectReply, ConnectRequest};
use rdmablk_common::rdma::{
    access, CmChannel, CmEventKind, CmId, CompChannel, Completion, ConnParam, Cq, Mr, Pd, QpConfig,
    SendOp, SendWr, Sge,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long address and route resolution and the connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Send completions carry this bit in their wr_id; receives do not.
const SEND_BIT: u64 = 1 << 32;

/// Registered memory the queue owns: capsules out, responses in.
struct Area<const N: usize> {
    /// Declared first: deregistered before `mem` is freed.
    mr: Mr,
    mem: Vec<[u8; N]>,
}

impl<const N: usize> Area<N> {
    fn new(pd: &Arc<Pd>, count: usize) -> Result<Area<N>, HostError> {
        let mut mem = vec![[0u8; N]; count];
        // SAFETY: `mem` is never reallocated and outlives its registration
        // (field order of `Area`).
        let mr =
            unsafe { Mr::register(pd, mem.as_mut_ptr().cast(), count * N, access::LOCAL_WRITE) }?;
        Ok(Area { mr, mem })
    }

    fn sge(&self, i: usize) -> Sge {
        Sge {
            addr: self.mem[i].as_ptr(),
            len: N as u32,
            lkey: self.mr.lkey(),
        }
    }
}

struct Inflight {
    tag: u64,
    /// The capsule's SEND completed (its buffers are free again).
    sent: bool,
    /// The response arrived.
    cqe: Option<Cqe>,
}

/// One NVMe/RDMA queue (admin or I/O).
pub struct RdmaQueue {
    /// Declared first: the queue pair goes before the memory it may touch.
    id: CmId,
    cm: Arc<CmChannel>,
    cq: Cq,
    pd: Arc<Pd>,
    addr: SocketAddr,
    capsules: Area<SQE_LEN>,
    responses: Area<CQE_LEN>,
    /// Caller memory registered for data (remote read and write).
    regions: Vec<Mr>,
    limits: QueueLimits,
    cmds: Vec<Option<Inflight>>,
    free: Vec<u16>,
    done: Vec<Done>,
    failed: Option<String>,
    cq_armed: bool,
    cm_armed: bool,
    wcs: Vec<Completion>,
}

// SAFETY: the queue is used by one thread at a time; verbs objects may move
// between threads.
unsafe impl Send for RdmaQueue {}

fn rdma_err(addr: SocketAddr, e: impl std::fmt::Display) -> HostError {
    HostError::Protocol(format!("NVMe/RDMA connection to {addr}: {e}"))
}

/// Waits for the event that ends a CM step; any other outcome is an error.
fn wait_cm(
    cm: &CmChannel,
    want: CmEventKind,
    addr: SocketAddr,
    what: &str,
) -> Result<Vec<u8>, HostError> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(rdma_err(
                addr,
                format!("{what} timed out after {CONNECT_TIMEOUT:?}"),
            ));
        }
        let Some(ev) = cm.wait_event(left).map_err(|e| rdma_err(addr, e))? else {
            continue;
        };
        if ev.kind == want {
            return Ok(ev.private_data);
        }
        return Err(match ev.kind {
            CmEventKind::Rejected => match decode_reject(&ev.private_data) {
                Ok(st) => HostError::Protocol(format!(
                    "the target at {addr} refused the queue: {}",
                    st.describe()
                )),
                // A reject without NVMe/RDMA private data: nobody listens.
                Err(None) => HostError::NoListener(addr),
                Err(Some(code)) => HostError::Protocol(format!(
                    "the target at {addr} refused the queue (status {code})"
                )),
            },
            _ => rdma_err(
                addr,
                format!("{what} failed: {} (status {})", ev.name, ev.status),
            ),
        });
    }
}

impl RdmaQueue {
    /// Connects queue `qid` with `depth` entries to the target at `addr`.
    pub fn connect(addr: SocketAddr, qid: u16, depth: u16) -> Result<RdmaQueue, HostError> {
        rdmablk_common::rdma::require_device()
            .map_err(|e| HostError::Unsupported(e.to_string()))?;
        let cm = CmChannel::new().map_err(|e| rdma_err(addr, e))?;
        let mut id = CmId::new(&cm).map_err(|e| rdma_err(addr, e))?;
        id.resolve_addr(addr, CONNECT_TIMEOUT)
            .map_err(|e| rdma_err(addr, e))?;
        wait_cm(
            &cm,
            CmEventKind::AddrResolved,
            addr,
            "address resolution (is the address on an RDMA device's network?)",
        )?;
        id.resolve_route(CONNECT_TIMEOUT)
            .map_err(|e| rdma_err(addr, e))?;
        wait_cm(&cm, CmEventKind::RouteResolved, addr, "route resolution")?;
        let device = id
            .device()
            .ok_or_else(|| rdma_err(addr, "no RDMA device for this address"))?;
        if device.is_iwarp() {
            return Err(HostError::Unsupported(format!(
                "NVMe/RDMA connection to {addr}: {} is an iWARP device; iWARP is not supported (use RoCE or InfiniBand)",
                device.name()
            )));
        }
        let attrs = device.attrs().map_err(|e| rdma_err(addr, e))?;
        let pd = Pd::new(device).map_err(|e| rdma_err(addr, e))?;
        let channel = CompChannel::new(device).map_err(|e| rdma_err(addr, e))?;
        let depth_n = depth as u32;
        let cq = Cq::new(device, 2 * depth_n + 8, &channel).map_err(|e| rdma_err(addr, e))?;
        id.create_qp(&QpConfig {
            pd: &pd,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            max_send_wr: depth_n + 1,
            max_recv_wr: depth_n + 1,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .map_err(|e| rdma_err(addr, e))?;
        let capsules = Area::new(&pd, depth as usize)?;
        let responses = Area::new(&pd, depth as usize + 1)?;
        let mut q = RdmaQueue {
            id,
            cm: cm.clone(),
            cq,
            pd,
            addr,
            capsules,
            responses,
            regions: Vec::new(),
            limits: QueueLimits {
                digests: Default::default(),
                max_h2c: 0,
                in_capsule: 0,
                depth,
                crdt: [0; 3],
            },
            cmds: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            done: Vec::new(),
            failed: None,
            cq_armed: false,
            cm_armed: false,
            wcs: Vec::new(),
        };
        for i in 0..=depth as usize {
            q.post_recv(i).map_err(|e| rdma_err(addr, e))?;
        }
        let req = ConnectRequest {
            recfmt: 0,
            qid,
            hrqsize: depth,
            hsqsize: depth - 1,
            cntlid: 0,
        }
        .encode();
        q.id.connect(&ConnParam {
            private_data: &req,
            responder_resources: attrs.max_qp_rd_atom,
            initiator_depth: 0,
            retry_count: 7,
            rnr_retry_count: 7,
        })
        .map_err(|e| rdma_err(addr, e))?;
        let reply = wait_cm(&cm, CmEventKind::Established, addr, "connect")?;
        if let Some(r) = ConnectReply::decode(&reply) {
            if r.crqsize < depth {
                // Never more commands in flight than the target can receive.
                let n = r.crqsize.max(1);
                q.free.retain(|&c| c < n);
                q.cmds.truncate(n as usize);
                q.limits.depth = n;
            }
        }
        tracing::debug!(%addr, qid, depth = q.limits.depth, device = %device.name(), "NVMe/RDMA queue connected");
        Ok(q)
    }

    fn post_recv(&mut self, i: usize) -> std::io::Result<()> {
        let sge = [self.responses.sge(i)];
        // SAFETY: the response slot is registered and belongs to this receive
        // until it completes.
        unsafe { rdmablk_common::rdma::verbs::post_recv(self.id.qp(), i as u64, &sge) }
    }

    /// Registers caller memory for data (LOCAL_WRITE | REMOTE_READ | REMOTE_WRITE).
    ///
    /// # Safety
    /// The memory must stay mapped while the queue lives.
    pub unsafe fn register(&mut self, base: *mut u8, len: usize) -> Result<(), HostError> {
        if self.regions.iter().any(|r| r.contains(base, len)) {
            return Ok(());
        }
        let rights = access::LOCAL_WRITE | access::REMOTE_READ | access::REMOTE_WRITE;
        // SAFETY: the caller keeps the memory mapped while the queue (which
        // owns the region) lives.
        let mr = unsafe { Mr::register(&self.pd, base, len, rights) }?;
        self.regions.push(mr);
        Ok(())
    }

    /// Deregisters the caller memory; only while no command is in flight.
    pub fn forget_regions(&mut self) {
        debug_assert!(self.idle(), "deregistering memory of commands in flight");
        self.regions.clear();
    }

    /// Sets the in-capsule data size the target accepts (from IOCCSZ).
    pub fn set_in_capsule(&mut self, n: usize) {
        self.limits.in_capsule = n;
    }

    pub fn limits(&self) -> QueueLimits {
        self.limits
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn free_slots(&self) -> usize {
        if self.failed.is_some() {
            0
        } else {
            self.free.len()
        }
    }

    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    pub fn idle(&self) -> bool {
        self.free.len() == self.cmds.len() || self.failed.is_some()
    }

    /// Submits a command; see `IoQueue::submit`. Returns its command id, or
    /// `None` when no slot is free (or the queue failed).
    ///
    /// # Safety
    /// `buf` must lie in memory given to [`RdmaQueue::register`] and stay
    /// valid (unchanged for writes) until the command's completion is taken.
    pub unsafe fn submit(
        &mut self,
        mut sqe: Sqe,
        buf: *mut u8,
        len: usize,
        to_host: bool,
        tag: u64,
    ) -> Option<u16> {
        if self.failed.is_some() {
            return None;
        }
        let cid = self.free.pop()?;
        sqe.set_cid(cid);
        let region = if len > 0 {
            match self.regions.iter().find(|r| r.contains(buf, len)) {
                Some(r) => Some((r.lkey(), r.rkey())),
                None => {
                    self.free.push(cid);
                    self.fail("an I/O buffer lies outside the registered memory".into());
                    return None;
                }
            }
        } else {
            None
        };
        let inline = !to_host && len > 0 && len <= self.limits.in_capsule;
        let sgl = match region {
            // NVMe/RDMA says "no data" with a zero-length keyed descriptor.
            None => Sgl::Keyed {
                addr: 0,
                len: 0,
                key: 0,
                invalidate: false,
            },
            Some(_) if inline => Sgl::InCapsule {
                offset: 0,
                len: len as u32,
            },
            Some((_, rkey)) => Sgl::Keyed {
                addr: buf as u64,
                len: len as u32,
                key: rkey,
                invalidate: false,
            },
        };
        sqe.set_sgl(&sgl);
        self.capsules.mem[cid as usize].copy_from_slice(&sqe.0);
        let mut sges: smallvec::SmallVec<[Sge; 2]> =
            smallvec::smallvec![self.capsules.sge(cid as usize)];
        if let (true, Some((lkey, _))) = (inline, region) {
            sges.push(Sge {
                addr: buf,
                len: len as u32,
                lkey,
            });
        }
        let wr = SendWr {
            wr_id: SEND_BIT | cid as u64,
            op: SendOp::Send { invalidate: None },
            sges: &sges,
            signaled: true,
            inline: false,
        };
        // SAFETY: the QP is alive; the capsule slot and the caller's buffer
        // (registered, guaranteed valid by the caller) stay untouched until
        // the SEND completes, which the command waits for.
        if let Err(e) = unsafe { rdmablk_common::rdma::verbs::post_send(self.id.qp(), &[wr]) } {
            self.free.push(cid);
            self.fail(format!("posting a command: {e}"));
            return None;
        }
        self.cmds[cid as usize] = Some(Inflight {
            tag,
            sent: false,
            cqe: None,
        });
        Some(cid)
    }

    /// Whether completions wait to be taken.
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }

    pub fn take_done(&mut self, out: &mut Vec<Done>) {
        out.append(&mut self.done);
    }

    /// Keeps polls on the completion channel (`cq_ud`) and the CM channel
    /// (`cm_ud`) in the caller's ring.
    pub fn pump(&mut self, sq: &mut Vec<squeue::Entry>, cq_ud: u64, cm_ud: u64) {
        if self.failed.is_some() {
            return;
        }
        if !self.cq_armed {
            sq.push(
                opcode::PollAdd::new(types::Fd(self.cq.fd()), libc::POLLIN as u32)
                    .build()
                    .user_data(cq_ud),
            );
            self.cq_armed = true;
        }
        if !self.cm_armed {
            sq.push(
                opcode::PollAdd::new(types::Fd(self.cm.fd()), libc::POLLIN as u32)
                    .build()
                    .user_data(cm_ud),
            );
            self.cm_armed = true;
        }
    }

    /// The completion channel was readable: take completions.
    pub fn on_cq_ready(&mut self) {
        self.cq_armed = false;
        if self.failed.is_some() {
            return;
        }
        if let Err(e) = self.cq.take_events() {
            return self.fail(format!("re-arming the CQ: {e}"));
        }
        let mut wcs = std::mem::take(&mut self.wcs);
        loop {
            wcs.clear();
            match self.cq.poll(&mut wcs) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    self.fail(format!("polling the CQ: {e}"));
                    break;
                }
            }
            for wc in &wcs {
                self.on_completion(wc);
            }
        }
        self.wcs = wcs;
    }

    /// The CM channel was readable: a disconnect ends the queue.
    pub fn on_cm_ready(&mut self) {
        self.cm_armed = false;
        loop {
            match self.cm.next_event() {
                Ok(Some(ev)) => match ev.kind {
                    CmEventKind::Disconnected | CmEventKind::DeviceRemoval | CmEventKind::Error => {
                        self.fail(format!("the target disconnected ({})", ev.name))
                    }
                    _ => tracing::debug!(event = %ev.name, "RDMA CM event"),
                },
                Ok(None) => return,
                Err(e) => return self.fail(format!("RDMA CM: {e}")),
            }
        }
    }

    fn on_completion(&mut self, wc: &Completion) {
        if self.failed.is_some() {
            return;
        }
        if !wc.ok() {
            let what = if wc.wr_id & SEND_BIT != 0 {
                "command SEND"
            } else {
                "response receive"
            };
            return self.fail(format!("{what} failed: {}", wc.status_str()));
        }
        if wc.wr_id & SEND_BIT != 0 {
            let cid = wc.wr_id as u16;
            if let Some(c) = self.cmds.get_mut(cid as usize).and_then(Option::as_mut) {
                c.sent = true;
            }
            return self.finish(cid);
        }
        let slot = wc.wr_id as usize;
        if (wc.byte_len as usize) < CQE_LEN {
            return self.fail(format!("a {}-byte response", wc.byte_len));
        }
        let cqe = Cqe::from_bytes(&self.responses.mem[slot]);
        if let Err(e) = self.post_recv(slot) {
            return self.fail(format!("posting a receive: {e}"));
        }
        if let Some(inv) = wc.invalidated_rkey {
            tracing::warn!(
                rkey = inv,
                "the target invalidated a key it was not asked to"
            );
        }
        match self.cmds.get_mut(cqe.cid as usize).and_then(Option::as_mut) {
            Some(c) if c.cqe.is_none() => {
                c.cqe = Some(cqe);
                self.finish(cqe.cid);
            }
            _ => self.fail(format!("a response for unknown command id {}", cqe.cid)),
        }
    }

    /// Completes a command once both its SEND and its response are done.
    fn finish(&mut self, cid: u16) {
        let ready =
            matches!(self.cmds.get(cid as usize), Some(Some(c)) if c.sent && c.cqe.is_some());
        if ready {
            let c = self.cmds[cid as usize].take().expect("checked above");
            self.done.push(Done {
                tag: c.tag,
                cqe: c.cqe.expect("checked above"),
            });
            self.free.push(cid);
        }
    }

    /// Ends the queue: the QP goes to the error state (the target can no
    /// longer reach our memory) and every command completes with an error.
    pub fn fail(&mut self, why: String) {
        if self.failed.is_some() {
            return;
        }
        tracing::error!("I/O queue failed: {why}");
        self.id.disconnect();
        self.failed = Some(why);
        for (cid, c) in self.cmds.iter_mut().enumerate() {
            if let Some(c) = c.take() {
                let cqe = Cqe {
                    cid: cid as u16,
                    status: Status::TRANSIENT_TRANSPORT_ERROR.to_field(0),
                    ..Default::default()
                };
                self.done.push(Done { tag: c.tag, cqe });
                self.free.push(cid as u16);
            }
        }
    }

    /// Runs one command to completion, blocking (admin queue, Connect).
    ///
    /// # Safety
    /// As [`RdmaQueue::submit`]; the buffer is free again when this returns
    /// (the command completed, or the queue failed and its QP is in error).
    pub unsafe fn exec_blocking(
        &mut self,
        sqe: Sqe,
        buf: *mut u8,
        len: usize,
        to_host: bool,
        timeout: Duration,
    ) -> Result<Cqe, HostError> {
        // SAFETY: the caller's guarantees.
        if unsafe { self.submit(sqe, buf, len, to_host, 0) }.is_none() {
            return Err(HostError::Protocol(
                self.failed
                    .clone()
                    .unwrap_or_else(|| "no free command slot".into()),
            ));
        }
        let deadline = Instant::now() + timeout;
        loop {
            self.on_cq_ready();
            self.on_cm_ready();
            if let Some(d) = self.done.pop() {
                if let Some(why) = &self.failed {
                    return Err(HostError::Protocol(why.clone()));
                }
                return Ok(d.cqe);
            }
            if let Some(why) = &self.failed {
                return Err(HostError::Protocol(why.clone()));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.fail(format!("no answer from {} within {timeout:?}", self.addr));
                continue;
            }
            let mut fds = [
                libc::pollfd {
                    fd: self.cq.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.cm.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, left.as_millis().clamp(1, 1000) as i32) };
        }
    }
}
