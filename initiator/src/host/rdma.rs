//! An NVMe/RDMA queue of the host: RDMA CM connect with the NVMe/RDMA
//! private data, command capsules sent from a registered capsule area (small
//! writes with their data in the capsule), keyed SGLs that let the target
//! RDMA READ/WRITE the buffer of one command in flight, responses received
//! into registered slots. Driven by the caller's io_uring (polls on the
//! completion and CM channels) or, for the admin queue, by blocking waits.
//!
//! The caller's memory is registered for local access only. A command's
//! key reaches just its buffer, in the one direction its transfer needs,
//! and only until it completes ([`RemoteAccess`]): the target can touch no
//! other buffer, and none after the command is over.

use super::Done;
use super::{HostError, QueueLimits};
use io_uring::{opcode, types};
use rdmablk_common::nvme::{Cqe, Sgl, Sqe, Status, CQE_LEN, SQE_LEN};
use rdmablk_common::rdma::private_data::{decode_reject, ConnectReply, ConnectRequest};
use rdmablk_common::rdma::{
    access, next_rkey, CmChannel, CmEventKind, CmId, CompChannel, Completion, ConnParam, Cq, Mr,
    Mw, Pd, QpConfig, SendOp, SendWr, Sge,
};
use rdmablk_common::ring::Submissions;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long address and route resolution and the connection may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// What a work request was, in the bits of its wr_id above the command id
/// (receives carry their response slot and kind 0).
mod wr_kind {
    pub const SHIFT: u32 = 32;
    pub const RECV: u64 = 0;
    pub const SEND: u64 = 1;
    pub const BIND: u64 = 2;
    pub const INVALIDATE: u64 = 3;
}

fn wr_id(kind: u64, cid: u16) -> u64 {
    kind << wr_kind::SHIFT | cid as u64
}

/// How the target is given access to a command's data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteAccess {
    /// One type 2 memory window per command slot, bound to the command's
    /// buffer just before its capsule is sent (same doorbell) and revoked
    /// when it completes: by the target's SEND with Invalidate, which the
    /// keyed SGL asks for (subtype Fh), else by a local invalidate before
    /// the command completes. Where the device has type 2 windows (RoCE
    /// and InfiniBand NICs), soft-RoCE excepted.
    Windows,
    /// A registration of the command's buffer, deregistered when it
    /// completes (a system call each way): devices without windows, and
    /// soft-RoCE, whose retransmissions after an RNR NAK run a queue
    /// pair's window binds again.
    Registrations,
}

/// The key a command's data is reachable by, until revoked.
enum Key {
    /// The slot's window, bound with `rkey` (kept while a local invalidate
    /// of it is in flight).
    Window { rkey: u32 },
    /// A registration of the buffer alone, deregistered on drop.
    Registration(Mr),
}

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
    /// The target's access to the command's data, until revoked.
    key: Option<Key>,
}

/// One NVMe/RDMA queue (admin or I/O).
pub struct RdmaQueue {
    /// One per command slot (`RemoteAccess::Windows`). Declared first: a
    /// bound window holds its queue pair (rxe cannot destroy a queue pair
    /// that windows are still bound to), and without windows nothing of
    /// ours is remotely reachable while the queue pair goes.
    windows: Vec<Mw>,
    /// Declared before the memory areas: the queue pair goes before the
    /// memory it may touch.
    id: CmId,
    cm: Arc<CmChannel>,
    cq: Cq,
    pd: Arc<Pd>,
    addr: SocketAddr,
    capsules: Area<SQE_LEN>,
    responses: Area<CQE_LEN>,
    remote: RemoteAccess,
    /// Caller memory registered for data: local access, and memory window
    /// binding with `RemoteAccess::Windows`.
    regions: Vec<Mr>,
    limits: QueueLimits,
    cmds: Vec<Option<Inflight>>,
    free: Vec<u16>,
    done: Vec<Done>,
    failed: Option<String>,
    cq_armed: bool,
    cm_armed: bool,
    wcs: Vec<Completion>,
    /// The engine polls the CQ itself every round ([`RdmaQueue::poll_cq`])
    /// instead of waiting for the completion channel.
    busy_poll: bool,
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
    /// Connects queue `qid` with `depth` entries to the target at `addr`,
    /// giving the target access to command data as `remote` says (`None`:
    /// windows where the device has them).
    pub fn connect(
        addr: SocketAddr,
        qid: u16,
        depth: u16,
        remote: Option<RemoteAccess>,
    ) -> Result<RdmaQueue, HostError> {
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
        let remote = match remote {
            Some(RemoteAccess::Windows) if !attrs.memory_windows => {
                return Err(HostError::Unsupported(format!(
                    "NVMe/RDMA connection to {addr}: {} has no type 2 memory windows",
                    device.name()
                )))
            }
            Some(r) => r,
            // rxe re-executes the binds behind a request it retransmits
            // after an RNR NAK, and a second bind of a bound window fails
            // the queue pair.
            None if attrs.memory_windows && !attrs.is_soft_roce() => RemoteAccess::Windows,
            None => {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    let why = if attrs.memory_windows {
                        "soft-RoCE re-executes memory window binds when it retransmits"
                    } else {
                        "the RDMA device has no type 2 memory windows"
                    };
                    tracing::warn!(
                        device = %device.name(),
                        "{why}: each command's buffer is registered and deregistered on its own (slower)"
                    )
                });
                RemoteAccess::Registrations
            }
        };
        // Per command: a bind, the capsule's SEND and a local invalidate
        // on the send queue, the two signaled ones and the response in the CQ.
        let (send_wrs_per_command, cqes_per_command) = match remote {
            RemoteAccess::Windows => (3, 3),
            RemoteAccess::Registrations => (1, 2),
        };
        let channel = CompChannel::new(device).map_err(|e| rdma_err(addr, e))?;
        let depth_n = depth as u32;
        let cq = Cq::new(device, cqes_per_command * depth_n + 8, &channel)
            .map_err(|e| rdma_err(addr, e))?;
        id.create_qp(&QpConfig {
            pd: &pd,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            max_send_wr: send_wrs_per_command * depth_n + 1,
            max_recv_wr: depth_n + 1,
            max_send_sge: 2,
            max_recv_sge: 1,
            max_inline_data: 0,
        })
        .map_err(|e| rdma_err(addr, e))?;
        // Allocated after the queue pair: when the process dies, the kernel
        // releases its objects newest first, and rxe can release a queue
        // pair only once the windows bound on it are gone.
        let windows = match remote {
            RemoteAccess::Windows => (0..depth)
                .map(|_| Mw::new(&pd))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(|e| rdma_err(addr, e))?,
            RemoteAccess::Registrations => Vec::new(),
        };
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
            remote,
            windows,
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
            busy_poll: false,
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
        tracing::debug!(%addr, qid, depth = q.limits.depth, device = %device.name(), remote_access = ?q.remote, qp = q.id.qp_num(), "NVMe/RDMA queue connected");
        Ok(q)
    }

    fn post_recv(&mut self, i: usize) -> std::io::Result<()> {
        let sge = [self.responses.sge(i)];
        // SAFETY: the response slot is registered and belongs to this receive
        // until it completes.
        unsafe {
            rdmablk_common::rdma::verbs::post_recv(
                self.id.qp(),
                wr_id(wr_kind::RECV, i as u16),
                &sge,
            )
        }
    }

    /// Registers caller memory for data: local access only (and memory
    /// window binding); the target reaches a command's buffer by its key.
    ///
    /// # Safety
    /// The memory must stay mapped while the queue lives.
    pub unsafe fn register(&mut self, base: *mut u8, len: usize) -> Result<(), HostError> {
        if self.regions.iter().any(|r| r.contains(base, len)) {
            return Ok(());
        }
        let rights = match self.remote {
            RemoteAccess::Windows => access::LOCAL_WRITE | access::MW_BIND,
            RemoteAccess::Registrations => access::LOCAL_WRITE,
        };
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
        let region = match len {
            0 => None,
            _ => match self.regions.iter().position(|r| r.contains(buf, len)) {
                Some(i) => Some(i),
                None => {
                    self.free.push(cid);
                    self.fail("an I/O buffer lies outside the registered memory".into());
                    return None;
                }
            },
        };
        let inline = !to_host && len > 0 && len <= self.limits.in_capsule;
        // What the target may do with a keyed buffer: write into it for a
        // transfer to the host, read it for one to the controller.
        let rights = if to_host {
            access::REMOTE_WRITE
        } else {
            access::REMOTE_READ
        };
        let key = match region {
            Some(_) if inline => None,
            None => None,
            Some(_) if self.remote == RemoteAccess::Windows => Some(Key::Window {
                rkey: next_rkey(self.windows[cid as usize].rkey()),
            }),
            Some(_) => {
                // SAFETY: the caller keeps the buffer valid until the
                // command completes; the registration is dropped (and its
                // key gone) before that.
                match unsafe { Mr::register(&self.pd, buf, len, access::LOCAL_WRITE | rights) } {
                    Ok(mr) => Some(Key::Registration(mr)),
                    Err(e) => {
                        self.free.push(cid);
                        self.fail(format!("registering a command's buffer: {e}"));
                        return None;
                    }
                }
            }
        };
        let sgl = match (&key, region) {
            // NVMe/RDMA says "no data" with a zero-length keyed descriptor.
            (_, None) => Sgl::Keyed {
                addr: 0,
                len: 0,
                key: 0,
                invalidate: false,
            },
            (None, Some(_)) => Sgl::InCapsule {
                offset: 0,
                len: len as u32,
            },
            (Some(Key::Window { rkey }), Some(_)) => Sgl::Keyed {
                addr: buf as u64,
                len: len as u32,
                key: *rkey,
                // Subtype Fh: the target's SEND with Invalidate revokes it.
                invalidate: true,
            },
            // A registration's key cannot be invalidated remotely: it goes
            // with the deregistration.
            (Some(Key::Registration(mr)), Some(_)) => Sgl::Keyed {
                addr: buf as u64,
                len: len as u32,
                key: mr.rkey(),
                invalidate: false,
            },
        };
        sqe.set_sgl(&sgl);
        self.capsules.mem[cid as usize].copy_from_slice(&sqe.0);
        let mut sges: smallvec::SmallVec<[Sge; 2]> =
            smallvec::smallvec![self.capsules.sge(cid as usize)];
        if let (true, Some(r)) = (inline, region) {
            sges.push(Sge {
                addr: buf,
                len: len as u32,
                lkey: self.regions[r].lkey(),
            });
        }
        let mut wrs: smallvec::SmallVec<[SendWr; 2]> = smallvec::SmallVec::new();
        if let (Some(Key::Window { rkey }), Some(r)) = (&key, region) {
            // Unsignaled: only a failure completes; the SEND behind it on
            // the same send queue sees the window bound.
            wrs.push(SendWr {
                wr_id: wr_id(wr_kind::BIND, cid),
                op: SendOp::BindWindow {
                    window: &self.windows[cid as usize],
                    rkey: *rkey,
                    region: &self.regions[r],
                    addr: buf,
                    len: len as u32,
                    access: rights,
                },
                sges: &[],
                signaled: false,
                inline: false,
            });
        }
        wrs.push(SendWr {
            wr_id: wr_id(wr_kind::SEND, cid),
            op: SendOp::Send { invalidate: None },
            sges: &sges,
            signaled: true,
            inline: false,
        });
        // SAFETY: the QP is alive; the capsule slot and the caller's buffer
        // (registered, guaranteed valid by the caller) stay untouched until
        // the SEND completes, which the command waits for; the window is
        // the command slot's own, unbound (its last key was revoked before
        // the slot was freed), and bound to the caller's buffer only.
        let posted = unsafe { rdmablk_common::rdma::verbs::post_send(self.id.qp(), &wrs) };
        drop(wrs);
        if let Err(e) = posted {
            self.free.push(cid);
            self.fail(format!("posting a command: {e}"));
            return None;
        }
        self.cmds[cid as usize] = Some(Inflight {
            tag,
            sent: false,
            cqe: None,
            key,
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

    /// Makes the caller poll the CQ itself ([`RdmaQueue::poll_cq`]) rather
    /// than wait for the completion channel: no interrupt, no event, no
    /// system call per completion (busy polling).
    pub fn set_busy_poll(&mut self, on: bool) {
        self.busy_poll = on;
    }

    /// Whether the caller polls the CQ itself.
    pub fn busy_poll(&self) -> bool {
        self.busy_poll
    }

    /// Keeps polls on the completion channel (`cq_ud`, unless the caller
    /// polls the CQ itself) and the CM channel (`cm_ud`) in the caller's ring.
    pub fn pump(&mut self, sq: &mut Submissions, cq_ud: u64, cm_ud: u64) {
        if self.failed.is_some() {
            return;
        }
        if !self.cq_armed && !self.busy_poll {
            let e = opcode::PollAdd::new(types::Fd(self.cq.fd()), libc::POLLIN as u32);
            // SAFETY: a poll points at no memory.
            unsafe { sq.push(e.build().user_data(cq_ud)) };
            self.cq_armed = true;
        }
        if !self.cm_armed {
            let e = opcode::PollAdd::new(types::Fd(self.cm.fd()), libc::POLLIN as u32);
            // SAFETY: a poll points at no memory.
            unsafe { sq.push(e.build().user_data(cm_ud)) };
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
        self.poll_cq();
    }

    /// Takes the completions the CQ holds; returns whether there were any.
    pub fn poll_cq(&mut self) -> bool {
        if self.failed.is_some() {
            return false;
        }
        let mut any = false;
        let mut wcs = std::mem::take(&mut self.wcs);
        loop {
            wcs.clear();
            match self.cq.poll(&mut wcs) {
                Ok(0) => break,
                Ok(_) => any = true,
                Err(e) => {
                    self.fail(format!("polling the CQ: {e}"));
                    break;
                }
            }
            // A request that failed puts the queue pair in error and flushes
            // the others: report it, not a flush ahead of it in the batch.
            if let Some(wc) = wcs.iter().find(|wc| !wc.ok() && !wc.is_flush()) {
                self.on_completion(wc);
            }
            for wc in &wcs {
                self.on_completion(wc);
            }
        }
        self.wcs = wcs;
        // A failure completed every command: news too.
        any || self.failed.is_some()
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
        let kind = wc.wr_id >> wr_kind::SHIFT;
        let cid = wc.wr_id as u16;
        if !wc.ok() {
            let what = match kind {
                wr_kind::SEND => "command SEND",
                wr_kind::BIND => "binding a memory window",
                wr_kind::INVALIDATE => "invalidating a memory window",
                _ => "response receive",
            };
            let why = if wc.is_flush() {
                " (the queue pair was already in the error state: the target's access was refused, or see the kernel log)"
            } else {
                ""
            };
            return self.fail(format!("{what} failed: {}{why}", wc.status_str()));
        }
        match kind {
            wr_kind::SEND => {
                if let Some(c) = self.cmds.get_mut(cid as usize).and_then(Option::as_mut) {
                    c.sent = true;
                }
                self.finish(cid)
            }
            wr_kind::INVALIDATE => {
                if let Some(c) = self.cmds.get_mut(cid as usize).and_then(Option::as_mut) {
                    c.key = None;
                }
                self.finish(cid)
            }
            _ => self.on_response(cid as usize, wc),
        }
    }

    /// A response arrived in receive slot `slot`.
    fn on_response(&mut self, slot: usize, wc: &Completion) {
        if (wc.byte_len as usize) < CQE_LEN {
            return self.fail(format!("a {}-byte response", wc.byte_len));
        }
        let cqe = Cqe::from_bytes(&self.responses.mem[slot]);
        if let Err(e) = self.post_recv(slot) {
            return self.fail(format!("posting a receive: {e}"));
        }
        let cid = cqe.cid;
        let Some(c) = self
            .cmds
            .get_mut(cid as usize)
            .and_then(Option::as_mut)
            .filter(|c| c.cqe.is_none())
        else {
            return self.fail(format!("a response for unknown command id {cid}"));
        };
        c.cqe = Some(cqe);
        let key = c.key.take();
        let invalidated = wc.invalidated_rkey;
        if let Some(k) = invalidated {
            // Another command's key revoked: its window would be invalidated
            // twice, and that command's buffer handed back while the target
            // may think it still has it.
            let other = self.cmds.iter().enumerate().find(|(i, c)| {
                *i != cid as usize && matches!(c, Some(Inflight { key: Some(Key::Window { rkey }), .. }) if *rkey == k)
            });
            if let Some((other, _)) = other {
                return self.fail(format!(
                    "the target invalidated key {k:#x} of command {other} with the response to command {cid}"
                ));
            }
        }
        match key {
            None | Some(Key::Registration(_)) => {}
            // Revoked by the target, as the keyed SGL asked.
            Some(Key::Window { rkey }) if invalidated == Some(rkey) => {}
            // The target did not invalidate: revoke the key before the
            // buffer goes back to the caller.
            Some(Key::Window { rkey }) => {
                let wr = SendWr {
                    wr_id: wr_id(wr_kind::INVALIDATE, cid),
                    op: SendOp::LocalInvalidate { rkey },
                    sges: &[],
                    signaled: true,
                    inline: false,
                };
                // SAFETY: the QP is alive; a local invalidate touches no
                // memory of ours.
                let posted = unsafe { rdmablk_common::rdma::verbs::post_send(self.id.qp(), &[wr]) };
                if let Err(e) = posted {
                    return self.fail(format!("invalidating a memory window: {e}"));
                }
                if let Some(Some(c)) = self.cmds.get_mut(cid as usize) {
                    c.key = Some(Key::Window { rkey });
                }
            }
        }
        self.finish(cid);
    }

    /// Completes a command once its SEND and its response are done and the
    /// target's access to its buffer is revoked.
    fn finish(&mut self, cid: u16) {
        let ready = matches!(self.cmds.get(cid as usize),
            Some(Some(c)) if c.sent && c.cqe.is_some() && c.key.is_none());
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
