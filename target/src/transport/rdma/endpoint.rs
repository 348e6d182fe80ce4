//! The RDMA side of one poller: adopting connect requests, its devices'
//! completions and CM events, and freeing queues once their work requests
//! are done.

use super::connection::RdmaQueue;
use super::device::DeviceRes;
use super::listener::Incoming;
use super::wire::RdmaWire;
use super::{Phase, RECV_BIT};
use crate::engine::binding::Binding;
use crate::engine::poller::{Endpoint, Io, Token};
use crate::engine::queue::{self, Queue};
use crate::engine::ready::Ready;
use crate::nvme::port::Arrival;
use rdmablk_common::nvme::{Sqe, SQE_LEN};
use rdmablk_common::rdma::private_data::{encode_reject, ConnectReply, RejectStatus};
use rdmablk_common::rdma::{CmChannel, CmEventKind, CmId, Completion, ConnParam, Device, QpConfig};
use std::any::Any;
use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// How long a closed queue waits for its work requests to flush before it
/// is freed anyway (a removed device may never deliver them): destroying
/// the QP ends the device's access to its buffers.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// What an endpoint's own tokens stand for: its CM channel, a device's CQ.
const CM: u16 = 0;
const CQ: u16 = 1;

/// The RDMA side of one poller.
pub(super) struct RdmaEndpoint {
    ep: u8,
    poller: usize,
    cm: Option<Arc<CmChannel>>,
    cm_armed: bool,
    devices: Vec<DeviceRes>,
    conns: Vec<Option<Box<RdmaQueue<CmId>>>>,
    /// The queues the next pump looks at.
    ready: Ready,
    /// Scratch: this pump's.
    round: Vec<u32>,
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
        self.ready.mark(queue);
        let conn = self.conns.get_mut(queue as usize).and_then(Option::as_mut);
        if let Some(c) = conn {
            c.q.on_backend(slot, res, io, &mut c.w);
        }
    }

    fn on_tick(&mut self, io: &mut Io) {
        for c in self.conns.iter_mut().flatten() {
            c.on_tick(io);
        }
        self.ready.mark_all();
    }

    fn pump(&mut self, io: &mut Io) -> usize {
        let freed = self.pump_queues(io);
        self.arm(io);
        freed
    }

    fn poll(&mut self, io: &mut Io) -> bool {
        let mut any = false;
        for dev in 0..self.devices.len() {
            any |= self.drain_cq(dev, io);
        }
        any
    }

    fn queues(&self) -> usize {
        self.conns.iter().flatten().count()
    }

    fn backend_ops(&self) -> usize {
        self.conns.iter().flatten().map(|c| c.q.backend_ops()).sum()
    }

    fn standing_buffers(&self) -> usize {
        self.devices.iter().map(DeviceRes::recv_buffers).sum()
    }

    fn close_all(&mut self, why: &str) {
        for c in self.conns.iter_mut().flatten() {
            c.close(why);
        }
        self.ready.mark_all();
    }
}

impl RdmaEndpoint {
    pub(super) fn new(ep: u8, poller: usize) -> RdmaEndpoint {
        RdmaEndpoint {
            ep,
            poller,
            cm: None,
            cm_armed: false,
            devices: Vec::new(),
            conns: Vec::new(),
            ready: Ready::default(),
            round: Vec::new(),
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
        let arrival = Arrival {
            ana: inc.ana,
            local: id.local().map(|a| a.ip()),
            tls: None,
        };
        let wire = RdmaWire::new(id, arrival, lkey, idx as u32, depth, read_credits);
        self.conns[idx] = Some(Box::new(RdmaQueue {
            q,
            w: wire,
            dev,
            qp_num,
            send_wr,
        }));
        self.ready.mark(idx as u32);
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
            self.ready.mark(ev.context as u32);
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

    /// Handles every completion the device's CQ holds, then reposts
    /// receives; returns whether there were any.
    fn drain_cq(&mut self, dev: usize, io: &mut Io) -> bool {
        let mut wcs = std::mem::take(&mut self.completions);
        let mut any = false;
        loop {
            wcs.clear();
            match self.devices[dev].cq.poll(&mut wcs) {
                Ok(0) => break,
                Ok(_) => any = true,
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
        any
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
        let Some(&i) = self.by_qp.get(&(dev, wc.qp_num)) else {
            return;
        };
        self.ready.mark(i as u32);
        let Some(conn) = self.conns[i].as_mut() else {
            return;
        };
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
            self.ready.mark(idx as u32);
        }
    }

    /// Lets queues move on (arena space freed, a drain) and frees closed
    /// ones; returns how many.
    fn pump_queues(&mut self, io: &mut Io) -> usize {
        let mut done = Vec::new();
        let mut freed = 0;
        if io.stopping {
            self.ready.mark_all();
        }
        self.ready.take(self.conns.len(), &mut self.round);
        for &idx in &self.round {
            let i = idx as usize;
            let Some(conn) = &mut self.conns[i] else {
                continue;
            };
            conn.pump(io);
            if conn.q.can_free(&conn.w) {
                done.push((i, false));
            } else if conn.w.phase == Phase::Closing
                && conn.q.idle_backend()
                && conn.w.since.elapsed() > FLUSH_TIMEOUT
            {
                done.push((i, true));
            }
            if !conn.quiet() {
                self.ready.mark(idx);
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
            if !(conn.q.can_free(&conn.w) || forced && conn.q.idle_backend()) {
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
