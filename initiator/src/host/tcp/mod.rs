//! An NVMe/TCP I/O queue driven by the caller's io_uring: commands go out as
//! CapsuleCmd PDUs (small writes with their data in the capsule), R2Ts are
//! answered with H2CData straight from the caller's buffer, C2HData lands in
//! the caller's buffer, and CapsuleResps come back as completions.

mod sync;

pub use sync::TcpSync;

use super::slots::{InFlight, Slots};
use super::{Done, QueueLimits};
use rdmablk_common::mem::crc32c_raw;
use rdmablk_common::nvme::{Cqe, Sgl, Sqe};
use rdmablk_common::ring::Submissions;
use rdmablk_common::tcp::stream::Records;
use rdmablk_common::tcp::stream::{
    Flow, Inbound, InboundLimits, Placed, Received, Receiver, Role, Stop, Stream,
};
use rdmablk_common::tcp::{flags, Digests, Header, Pdu, Transfer};
use std::net::TcpStream;

/// Largest PDU accepted from the target (C2HData of up to 4 MiB).
const MAX_PDU: usize = (4 << 20) + 256;

/// C2HData at least this large is received straight into the command's
/// buffer rather than through the receive buffer.
const DIRECT_MIN: usize = 16 << 10;

struct Inflight {
    tag: u64,
    buf: *mut u8,
    len: usize,
    to_host: bool,
    /// Queued transfers of this command's buffer not yet sent (its
    /// in-capsule data, the H2CData answering each R2T): each counts until
    /// its last PDU is on the wire.
    sends: u32,
    /// A response that arrived while `sends` was not zero: the command
    /// completes once its data is out, so its buffer is not handed back
    /// while the kernel may still read it.
    early: Option<Cqe>,
}

impl InFlight for Inflight {
    fn tag(&self) -> u64 {
        self.tag
    }
}

/// One I/O queue.
pub struct TcpQueue {
    stream: Stream,
    limits: QueueLimits,
    /// Socket sends made (each carries every PDU that was ready).
    sends: u64,
    sent: Vec<u64>,
    slots: Slots<Inflight>,
}

// SAFETY: the raw buffer pointers refer to memory the submitter keeps valid
// until completion; the queue is used by one thread at a time.
unsafe impl Send for TcpQueue {}

impl TcpQueue {
    /// The queue of `sock`, connected and initialized; `tls` is the record
    /// layer of a TLS connection.
    pub fn new(sock: TcpStream, tls: Option<Box<Records>>, limits: QueueLimits) -> Self {
        let inbound = Inbound::new(
            Role::Host,
            InboundLimits {
                buffer: 2 * MAX_PDU,
                max_pdu: MAX_PDU,
                max_other: MAX_PDU,
                direct_min: DIRECT_MIN,
            },
        );
        TcpQueue {
            // Failing to map the receive buffer is running out of memory,
            // as a failed heap allocation would be.
            stream: Stream::with_tls(sock, inbound.expect("mapping a receive buffer"), tls),
            limits,
            sends: 0,
            sent: Vec::new(),
            slots: Slots::new(limits.depth),
        }
    }

    /// Commands that can still be submitted.
    pub fn free_slots(&self) -> usize {
        self.slots.free_slots()
    }

    /// Why the queue stopped working, if it did.
    pub fn failed(&self) -> Option<&str> {
        self.slots.failed()
    }

    /// Whether nothing is in flight or queued (a failed queue: nothing in
    /// the ring any more).
    pub fn idle(&self) -> bool {
        if self.slots.failed().is_some() {
            return !self.ops_in_flight();
        }
        self.slots.all_free() && self.stream.outbound.drained()
    }

    /// Submits a command moving `len` bytes at `buf` (to the host when
    /// `to_host`). Returns its command id, or `None` when no slot is free.
    ///
    /// # Safety
    /// `buf` must stay valid for `len` bytes, and unchanged for writes, until
    /// the command's completion is taken from [`TcpQueue::take_done`] or the
    /// queue is dropped.
    pub unsafe fn submit(
        &mut self,
        mut sqe: Sqe,
        buf: *mut u8,
        len: usize,
        to_host: bool,
        tag: u64,
    ) -> Option<u16> {
        let cid = self.slots.claim()?;
        sqe.set_cid(cid);
        let inline = !to_host && len > 0 && len <= self.limits.in_capsule;
        let sgl = match (len, inline) {
            (0, _) => Sgl::Null,
            (_, true) => Sgl::InCapsule {
                offset: 0,
                len: len as u32,
            },
            _ => Sgl::Transport { len: len as u32 },
        };
        sqe.set_sgl(&sgl);
        let (out, digests) = (&mut self.stream.outbound, self.limits.digests);
        if inline {
            // SAFETY: the caller guarantees `buf` holds `len` readable bytes.
            let digest = || unsafe { crc32c_raw(buf, len) };
            let h = Header::CapsuleCmd(sqe);
            out.push_with_body(&h, 0, buf, len, digests, 1, digest, Some(cid as u64));
        } else {
            out.push(&Header::CapsuleCmd(sqe), &[], digests, None);
        }
        self.slots.start(
            cid,
            Inflight {
                tag,
                buf,
                len,
                to_host,
                sends: inline as u32,
                early: None,
            },
        );
        Some(cid)
    }

    /// Whether completions wait to be taken.
    pub fn has_done(&self) -> bool {
        self.slots.has_done()
    }

    /// Completions gathered since the last call.
    pub fn take_done(&mut self, out: &mut Vec<Done>) {
        self.slots.take_done(out);
    }

    /// Parses what arrived and keeps a receive and a send in flight.
    pub fn pump(&mut self, sq: &mut Submissions, recv_ud: u64, send_ud: u64) {
        if self.slots.failed().is_some() {
            return;
        }
        self.process_rx();
        let failed = self.slots.failed().is_some();
        if let Some(e) = self.stream.recv_entry(recv_ud).filter(|_| !failed) {
            // SAFETY: the receive writes into the stream's receive buffer (a
            // mapping of its own, which lives as long as the queue), or into
            // the buffer of the command whose C2HData it is, which its
            // submitter keeps until the command's completion is taken: the
            // command cannot complete before its data is in, and a failed
            // queue completes its commands only once this receive is over.
            // The engine drops or replaces a queue only once none of its
            // operations is in the ring.
            unsafe { sq.push(e) };
        }
        if let Some(e) = self.stream.send_entry(send_ud) {
            // SAFETY: the message header and its iovecs are the stream's (in
            // the boxed queue) and stay unchanged until the next send is
            // built, only once this one completed; PDU heads are heap buffers
            // of the queued items; payloads are command buffers, whose
            // commands complete only once their sends are done (`sends`,
            // `early`). The engine drops or replaces a queue only once none
            // of its operations is in the ring.
            unsafe { sq.push(e) };
            self.sends += 1;
        }
    }

    /// Socket sends made so far.
    pub fn sends(&self) -> u64 {
        self.sends
    }

    pub fn on_recv(&mut self, res: i32) {
        match self.stream.received(res) {
            Received::Bytes => {}
            Received::Closed => self.fail("the target closed the connection".into()),
            Received::Failed(e) => self.fail(format!("receive failed: {e}")),
        }
        // Completions of a failed queue may have waited for this receive.
        self.settle_failed();
    }

    pub fn on_send(&mut self, res: i32) {
        let mut sent = std::mem::take(&mut self.sent);
        if let Err(e) = self.stream.sent(res, &mut sent) {
            self.sent = sent;
            return self.fail(format!("send failed: {e}"));
        }
        for cid in sent.drain(..).map(|t| t as u16) {
            let Some(c) = self.slots.get_mut(cid) else {
                continue;
            };
            c.sends -= 1;
            if c.sends == 0 {
                if let Some(cqe) = c.early.take() {
                    self.slots.complete(cid, cqe);
                }
            }
        }
        self.sent = sent;
        self.settle_failed();
    }

    /// Whether operations of this queue are still in the ring.
    pub fn ops_in_flight(&self) -> bool {
        self.stream.busy()
    }

    /// Ends the queue: every command in flight completes with an error,
    /// once no operation in the ring points into their buffers. Called
    /// again on a failed queue (a send that ends in an error after the
    /// receive saw the close), it settles what that operation held back.
    pub fn fail(&mut self, why: String) {
        if self.slots.set_failed(why) {
            self.stream.shutdown();
            self.stream.inbound.abandon_placement();
        }
        self.settle_failed();
    }

    /// On a failed queue, completes every command once nothing in flight
    /// points into their buffers: a receive still writing into one, or a
    /// send still reading from them, must end first.
    fn settle_failed(&mut self) {
        let busy = self.stream.receiving_in_place() || self.stream.sending();
        if self.slots.failed().is_some() && !busy {
            self.slots.fail_all();
        }
    }

    fn process_rx(&mut self) {
        // Take the PDUs out so that they can be handled while `self` changes.
        let mut inbound = std::mem::take(&mut self.stream.inbound);
        let res = inbound.process(self);
        self.stream.inbound = inbound;
        match res {
            Ok(()) => {}
            Err(Stop::Malformed(e)) => self.fail(format!("malformed PDU from the target: {e}")),
            Err(Stop::Refused(why)) => self.fail(why),
        }
    }

    /// The command a C2HData PDU carries `len` bytes of data for, checked.
    fn receiving_command(&self, t: &Transfer, len: usize) -> Result<&Inflight, String> {
        let c = self
            .slots
            .get(t.cccid)
            .ok_or("C2HData for an unknown command")?;
        let end = t.offset as usize + len;
        if !c.to_host || end > c.len {
            return Err(format!(
                "C2HData {}..{end} outside the command's {} bytes",
                t.offset, c.len
            ));
        }
        Ok(c)
    }

    /// Completes command `cid` with `cqe`.
    fn complete(&mut self, cid: u16, cqe: Cqe) -> Result<(), String> {
        match self.slots.complete(cid, cqe) {
            Some(_) => Ok(()),
            None => Err(format!("completion for unknown command {cid}")),
        }
    }

    fn answer_r2t(&mut self, r2t: Transfer) -> Result<(), String> {
        let c = self
            .slots
            .get_mut(r2t.cccid)
            .ok_or("R2T for an unknown command")?;
        let end = r2t.offset as usize + r2t.len as usize;
        if c.to_host || end > c.len {
            return Err(format!(
                "R2T {}..{end} outside the command's {} bytes",
                r2t.offset, c.len
            ));
        }
        let body = c.buf.wrapping_add(r2t.offset as usize);
        // SAFETY: every piece lies inside the command's buffer (checked
        // above), which the submitter keeps readable (submit's contract).
        let digest_of = |at: usize, n: usize| unsafe { crc32c_raw(body.add(at), n) };
        self.stream.outbound.push_transfer(
            Header::H2CData,
            r2t,
            self.limits.max_h2c,
            body,
            self.limits.digests,
            1,
            digest_of,
            0,
            Some(r2t.cccid as u64),
        );
        // The last PDU's token says all of them are sent.
        c.sends += 1;
        Ok(())
    }
}

// SAFETY: `place` gives the part of a command's buffer that a C2HData PDU
// fills, checked against the command's length; the submitter keeps the
// buffer until the command's completion is taken, which comes only after
// `placed` (SUCCESS, or the CapsuleResp behind the data), or, on a failed
// queue, once no receive into it is in flight (`settle_failed`).
unsafe impl Receiver for TcpQueue {
    type Error = String;

    fn digests(&self) -> Digests {
        self.limits.digests
    }

    fn receiving(&self) -> bool {
        self.slots.failed().is_none()
    }

    fn place(&mut self, t: &Transfer, len: usize) -> Result<*mut u8, String> {
        let c = self.receiving_command(t, len)?;
        Ok(c.buf.wrapping_add(t.offset as usize))
    }

    fn placed(&mut self, p: Placed) -> Result<(), String> {
        if !p.digest_ok {
            return Err("C2HData data digest mismatch".into());
        }
        if p.flags & flags::SUCCESS != 0 {
            // The command completed with its last data PDU.
            let cid = p.transfer.cccid;
            let cqe = Cqe {
                cid,
                ..Default::default()
            };
            self.complete(cid, cqe)?;
        }
        Ok(())
    }

    fn pdu(&mut self, pdu: &Pdu<'_>) -> Result<Flow, String> {
        match pdu.header {
            Header::CapsuleResp(cqe) => {
                let pending = self.slots.get_mut(cqe.cid).filter(|c| c.sends > 0);
                if let Some(c) = pending {
                    // The target answered before all our data went out
                    // (it failed the command early): complete once sent.
                    if c.early.replace(cqe).is_some() {
                        return Err(format!("two responses for command {}", cqe.cid));
                    }
                } else {
                    self.complete(cqe.cid, cqe)?;
                }
            }
            Header::R2T(t) => self.answer_r2t(t)?,
            Header::TermReq { fes, fei, .. } => {
                return Err(format!(
                    "target terminated the queue (FES {fes}, FEI {fei})"
                ))
            }
            h => {
                return Err(format!(
                    "unexpected PDU type {:#x} from the target",
                    h.pdu_type()
                ))
            }
        }
        Ok(Flow::Consumed)
    }
}
