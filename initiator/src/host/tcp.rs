//! An NVMe/TCP I/O queue driven by the caller's io_uring: commands go out as
//! CapsuleCmd PDUs (small writes with their data in the capsule), R2Ts are
//! answered with H2CData straight from the caller's buffer, C2HData lands in
//! the caller's buffer, and CapsuleResps come back as completions.

use super::{Done, QueueLimits};
use io_uring::{opcode, types};
use rdmablk_common::mem::crc32c_raw;
use rdmablk_common::nvme::{Cqe, Sgl, Sqe, Status};
use rdmablk_common::ring::Submissions;
use rdmablk_common::tcp::stream::{RxBuf, TxQueue};
use rdmablk_common::tcp::{self, flags, Header, Transfer};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Largest PDU accepted from the target (C2HData of up to 4 MiB).
const MAX_PDU: usize = (4 << 20) + 256;

/// C2HData at least this large is received straight into the command's
/// buffer rather than through the receive buffer.
const DIRECT_MIN: usize = 16 << 10;

/// A C2HData payload being received in place.
struct Direct {
    cid: u16,
    /// Where the next bytes go, and how many are still to come.
    dst: *mut u8,
    left: usize,
    /// The whole payload, for the data digest that follows it.
    start: *const u8,
    len: usize,
    digest: bool,
    /// The PDU had the SUCCESS flag: the command completes with it.
    success: bool,
}

struct Inflight {
    tag: u64,
    buf: *mut u8,
    len: usize,
    to_host: bool,
    /// Queued PDUs whose payload is this command's buffer (in-capsule data,
    /// H2CData) not yet sent.
    sends: u32,
    /// A response that arrived while `sends` was not zero: the command
    /// completes once its data is out, so its buffer is not handed back
    /// while the kernel may still read it.
    early: Option<Cqe>,
}

/// One I/O queue.
pub struct TcpQueue {
    sock: TcpStream,
    limits: QueueLimits,
    rx: RxBuf,
    recv_busy: bool,
    tx: TxQueue,
    send_busy: bool,
    /// Socket sends made (each carries every PDU that was ready).
    sends: u64,
    sent: Vec<u64>,
    cmds: Vec<Option<Inflight>>,
    free: Vec<u16>,
    done: Vec<Done>,
    failed: Option<String>,
    direct: Option<Direct>,
    /// The receive in flight writes into a command's buffer.
    recv_direct: bool,
}

// SAFETY: the raw buffer pointers refer to memory the submitter keeps valid
// until completion; the queue is used by one thread at a time.
unsafe impl Send for TcpQueue {}

impl TcpQueue {
    pub fn new(sock: TcpStream, limits: QueueLimits) -> Self {
        let depth = limits.depth as usize;
        TcpQueue {
            sock,
            limits,
            // Failing to map 256 KiB is running out of memory, as a failed
            // heap allocation would be.
            rx: RxBuf::new(2 * MAX_PDU).expect("mapping a receive buffer"),
            recv_busy: false,
            tx: TxQueue::default(),
            send_busy: false,
            sends: 0,
            sent: Vec::new(),
            cmds: (0..depth).map(|_| None).collect(),
            free: (0..depth as u16).rev().collect(),
            done: Vec::new(),
            failed: None,
            direct: None,
            recv_direct: false,
        }
    }

    /// Commands that can still be submitted.
    pub fn free_slots(&self) -> usize {
        if self.failed.is_some() {
            0
        } else {
            self.free.len()
        }
    }

    /// Why the queue stopped working, if it did.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Whether nothing is in flight or queued (a failed queue: nothing in
    /// the ring any more).
    pub fn idle(&self) -> bool {
        if self.failed.is_some() {
            return !self.ops_in_flight();
        }
        self.free.len() == self.cmds.len() && self.tx.is_empty() && !self.send_busy
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
        if self.failed.is_some() {
            return None;
        }
        let cid = self.free.pop()?;
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
        let mut head = self.tx.buf();
        let data_len = if inline { len } else { 0 };
        tcp::encode_header(
            &mut head,
            &Header::CapsuleCmd(sqe),
            0,
            data_len,
            self.limits.digests,
            1,
        );
        if inline {
            let digest = self.limits.digests.data.then(|| {
                // SAFETY: the caller guarantees `buf` holds `len` readable bytes.
                unsafe { crc32c_raw(buf, len) }.to_le_bytes()
            });
            self.tx
                .push_with_body(head, buf, len, digest, Some(cid as u64));
        } else {
            self.tx.push(head, None);
        }
        self.cmds[cid as usize] = Some(Inflight {
            tag,
            buf,
            len,
            to_host,
            sends: inline as u32,
            early: None,
        });
        Some(cid)
    }

    /// Whether completions wait to be taken.
    pub fn has_done(&self) -> bool {
        !self.done.is_empty()
    }

    /// Completions gathered since the last call.
    pub fn take_done(&mut self, out: &mut Vec<Done>) {
        out.append(&mut self.done);
    }

    /// Parses what arrived and keeps a receive and a send in flight.
    pub fn pump(&mut self, sq: &mut Submissions, recv_ud: u64, send_ud: u64) {
        if self.failed.is_some() {
            return;
        }
        self.process_rx();
        if !self.recv_busy && self.failed.is_none() {
            let (ptr, len, direct) = match &self.direct {
                Some(d) if d.left > 0 => (d.dst, d.left, true),
                _ => {
                    let spare = self.rx.spare();
                    (spare.as_mut_ptr(), spare.len(), false)
                }
            };
            let e = opcode::Recv::new(types::Fd(self.sock.as_raw_fd()), ptr, len as u32)
                .build()
                .user_data(recv_ud);
            // SAFETY: the receive writes into the queue's receive buffer (a
            // mapping of its own, which lives as long as the queue), or into
            // the buffer of the command whose C2HData it is, which its
            // submitter keeps until the command's completion is taken: the
            // command cannot complete before its data is in, and a failed
            // queue completes its commands only once this receive is over.
            // The engine drops or replaces a queue only once none of its
            // operations is in the ring.
            unsafe { sq.push(e) };
            self.recv_busy = true;
            self.recv_direct = direct;
        }
        if !self.send_busy && !self.tx.is_empty() {
            let e = opcode::SendMsg::new(types::Fd(self.sock.as_raw_fd()), self.tx.message())
                .flags(libc::MSG_NOSIGNAL as u32)
                .build()
                .user_data(send_ud);
            // SAFETY: the message header and its iovecs are the send queue's
            // (in the boxed queue) and stay unchanged until the next
            // `message`, built only once this send completed; PDU heads are
            // heap buffers of the queued items; payloads are command buffers,
            // whose commands complete only once their sends are done (`sends`,
            // `early`). The engine drops or replaces a queue only once none
            // of its operations is in the ring.
            unsafe { sq.push(e) };
            self.send_busy = true;
            self.sends += 1;
        }
    }

    /// Socket sends made so far.
    pub fn sends(&self) -> u64 {
        self.sends
    }

    pub fn on_recv(&mut self, res: i32) {
        self.recv_busy = false;
        if std::mem::take(&mut self.recv_direct) {
            if self.failed.is_some() {
                // Completions waited for this receive to leave the buffer.
                return self.settle_failed();
            }
            if res > 0 {
                let d = self.direct.as_mut().expect("a direct receive has a target");
                d.left -= res as usize;
                d.dst = d.dst.wrapping_add(res as usize);
                return;
            }
        }
        match res {
            0 => self.fail("the target closed the connection".into()),
            r if r < 0 => self.fail(format!(
                "receive failed: {}",
                std::io::Error::from_raw_os_error(-r)
            )),
            r => self.rx.filled(r as usize),
        }
    }

    pub fn on_send(&mut self, res: i32) {
        self.send_busy = false;
        if res < 0 {
            self.fail(format!(
                "send failed: {}",
                std::io::Error::from_raw_os_error(-res)
            ));
            return;
        }
        let mut sent = std::mem::take(&mut self.sent);
        self.tx.advance(res as usize, &mut sent);
        for cid in sent.drain(..).map(|t| t as u16) {
            let Some(c) = self.cmds.get_mut(cid as usize).and_then(Option::as_mut) else {
                continue;
            };
            c.sends -= 1;
            if c.sends == 0 {
                if let Some(cqe) = c.early.take() {
                    let tag = c.tag;
                    self.cmds[cid as usize] = None;
                    self.free.push(cid);
                    self.done.push(Done { tag, cqe });
                }
            }
        }
        self.sent = sent;
        self.settle_failed();
    }

    /// Whether operations of this queue are still in the ring.
    pub fn ops_in_flight(&self) -> bool {
        self.recv_busy || self.send_busy
    }

    /// Ends the queue: every command in flight completes with an error.
    pub fn fail(&mut self, why: String) {
        if self.failed.is_none() {
            tracing::error!("I/O queue failed: {why}");
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
            self.failed = Some(why);
            self.direct = None;
            self.settle_failed();
        }
    }

    /// On a failed queue, completes every command once nothing in flight
    /// points into their buffers: a receive still writing into one, or a
    /// send still reading from them, must end first.
    fn settle_failed(&mut self) {
        let busy = self.recv_busy && self.recv_direct || self.send_busy;
        if self.failed.is_some() && !busy {
            self.complete_all_failed();
        }
    }

    /// Completes every command in flight with a transient transport error.
    fn complete_all_failed(&mut self) {
        {
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
    }

    fn process_rx(&mut self) {
        loop {
            if self.direct.is_some() {
                match self.drain_direct() {
                    Ok(true) => continue,
                    Ok(false) => return,
                    Err(why) => return self.fail(why),
                }
            }
            let decoded = tcp::decode(self.rx.pending(), self.limits.digests, MAX_PDU);
            let (header, fl, data_ok, data_at, data_len, n) = match decoded {
                Ok(None) => {
                    if let Err(why) = self.start_direct() {
                        self.fail(why);
                    }
                    return;
                }
                Ok(Some((pdu, n))) => {
                    let base = self.rx.pending().as_ptr();
                    // Offsets rather than slices, so that `self` can change below.
                    let at = pdu.data.as_ptr() as usize - base as usize;
                    (
                        pdu.header,
                        pdu.flags,
                        pdu.data_digest_ok,
                        at,
                        pdu.data.len(),
                        n,
                    )
                }
                Err(e) => return self.fail(format!("malformed PDU from the target: {e}")),
            };
            if let Err(why) = self.handle(header, fl, data_ok, data_at, data_len) {
                return self.fail(why);
            }
            self.rx.consume(n);
        }
    }

    /// Starts placing a large C2HData payload whose header has arrived
    /// straight into its command's buffer.
    fn start_direct(&mut self) -> Result<(), String> {
        let pending = self.rx.pending();
        let Ok(Some(f)) = tcp::decode_framing(pending, self.limits.digests, MAX_PDU) else {
            return Ok(()); // errors surface once the whole PDU is here
        };
        let Header::C2HData(t) = f.header else {
            return Ok(());
        };
        if f.data_len < DIRECT_MIN || pending.len() >= f.plen {
            return Ok(());
        }
        let c = self
            .cmds
            .get(t.cccid as usize)
            .and_then(Option::as_ref)
            .ok_or("C2HData for an unknown command")?;
        let end = t.offset as usize + f.data_len;
        if !c.to_host || end > c.len {
            return Err(format!(
                "C2HData {}..{end} outside the command's {} bytes",
                t.offset, c.len
            ));
        }
        let start = c.buf.wrapping_add(t.offset as usize);
        let have = pending.len().saturating_sub(f.data_at).min(f.data_len);
        let src = &pending[f.data_at..f.data_at + have];
        // SAFETY: `start` has `f.data_len` writable bytes (checked against the
        // command's length above; submit's contract keeps the buffer alive).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), start, have) };
        self.rx.consume(f.data_at + have);
        self.direct = Some(Direct {
            cid: t.cccid,
            dst: start.wrapping_add(have),
            left: f.data_len - have,
            start,
            len: f.data_len,
            digest: f.data_digest,
            success: f.flags & flags::SUCCESS != 0,
        });
        Ok(())
    }

    /// Moves received bytes of a direct payload into place and finishes it
    /// (digest, SUCCESS). Returns true once it is finished.
    fn drain_direct(&mut self) -> Result<bool, String> {
        let d = self.direct.as_mut().expect("direct placement in progress");
        if d.left > 0 {
            let pending = self.rx.pending();
            let n = pending.len().min(d.left);
            // SAFETY: `d.dst` has `d.left` writable bytes of the command's buffer.
            unsafe { std::ptr::copy_nonoverlapping(pending.as_ptr(), d.dst, n) };
            d.left -= n;
            d.dst = d.dst.wrapping_add(n);
            self.rx.consume(n);
            if d.left > 0 {
                return Ok(false);
            }
        }
        if d.digest {
            let pending = self.rx.pending();
            if pending.len() < tcp::DIGEST_LEN {
                return Ok(false);
            }
            let want = u32::from_le_bytes(pending[..4].try_into().expect("4 bytes"));
            // SAFETY: the payload was written to `d.start..d.start + d.len`
            // above, in the command's buffer (submit's contract).
            if unsafe { crc32c_raw(d.start, d.len) } != want {
                return Err("C2HData data digest mismatch".into());
            }
            self.rx.consume(tcp::DIGEST_LEN);
        }
        let d = self.direct.take().expect("checked above");
        if d.success {
            let c = self.take(d.cid)?;
            let cqe = Cqe {
                cid: d.cid,
                ..Default::default()
            };
            self.done.push(Done { tag: c.tag, cqe });
        }
        Ok(true)
    }

    fn handle(
        &mut self,
        header: Header,
        fl: u8,
        data_ok: bool,
        data_at: usize,
        data_len: usize,
    ) -> Result<(), String> {
        match header {
            Header::CapsuleResp(cqe) => {
                let pending = self
                    .cmds
                    .get_mut(cqe.cid as usize)
                    .and_then(Option::as_mut)
                    .filter(|c| c.sends > 0);
                if let Some(c) = pending {
                    // The target answered before all our data went out
                    // (it failed the command early): complete once sent.
                    if c.early.replace(cqe).is_some() {
                        return Err(format!("two responses for command {}", cqe.cid));
                    }
                } else {
                    let c = self.take(cqe.cid)?;
                    self.done.push(Done { tag: c.tag, cqe });
                }
            }
            Header::C2HData(t) => {
                if !data_ok {
                    return Err("C2HData data digest mismatch".into());
                }
                let c = self
                    .cmds
                    .get(t.cccid as usize)
                    .and_then(Option::as_ref)
                    .ok_or("C2HData for an unknown command")?;
                let end = t.offset as usize + data_len;
                if !c.to_host || end > c.len {
                    return Err(format!(
                        "C2HData {}..{end} outside the command's {} bytes",
                        t.offset, c.len
                    ));
                }
                let src = &self.rx.pending()[data_at..data_at + data_len];
                // SAFETY: `c.buf` holds `c.len` writable bytes (submit's contract)
                // and the range was checked against `c.len`.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.as_ptr(),
                        c.buf.add(t.offset as usize),
                        data_len,
                    )
                };
                if fl & flags::SUCCESS != 0 {
                    let c = self.take(t.cccid)?;
                    let cqe = Cqe {
                        cid: t.cccid,
                        ..Default::default()
                    };
                    self.done.push(Done { tag: c.tag, cqe });
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
        Ok(())
    }

    fn take(&mut self, cid: u16) -> Result<Inflight, String> {
        let c = self
            .cmds
            .get_mut(cid as usize)
            .and_then(Option::take)
            .ok_or_else(|| format!("completion for unknown command {cid}"))?;
        self.free.push(cid);
        Ok(c)
    }

    fn answer_r2t(&mut self, r2t: Transfer) -> Result<(), String> {
        let c = self
            .cmds
            .get(r2t.cccid as usize)
            .and_then(Option::as_ref)
            .ok_or("R2T for an unknown command")?;
        let end = r2t.offset as usize + r2t.len as usize;
        if c.to_host || end > c.len {
            return Err(format!(
                "R2T {}..{end} outside the command's {} bytes",
                r2t.offset, c.len
            ));
        }
        let buf = c.buf;
        let cid = r2t.cccid;
        for (t, fl) in tcp::split_transfer(r2t, self.limits.max_h2c) {
            let (at, n) = (t.offset as usize, t.len as usize);
            let mut head = self.tx.buf();
            tcp::encode_header(
                &mut head,
                &Header::H2CData(t),
                fl,
                n,
                self.limits.digests,
                1,
            );
            let body = buf.wrapping_add(at);
            let digest = self.limits.digests.data.then(|| {
                // SAFETY: the range lies inside the command's buffer (checked above).
                unsafe { crc32c_raw(body, n) }.to_le_bytes()
            });
            self.tx
                .push_with_body(head, body, n, digest, Some(cid as u64));
            if let Some(c) = self.cmds[cid as usize].as_mut() {
                c.sends += 1;
            }
        }
        Ok(())
    }
}
