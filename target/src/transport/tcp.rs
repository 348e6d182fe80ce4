//! NVMe/TCP queues: the ICReq/ICResp handshake, capsule parsing, R2T and
//! H2CData for host data, C2HData for controller data, CapsuleResp, and
//! C2HTermReq on protocol errors. Socket I/O goes through the poller's ring.

use crate::admission::Permit;
use crate::budget::Staged;
use crate::command::{self, Command, Work};
use crate::controller::TransportCaps;
use crate::poller::{Io, Token};
use crate::queue::{self, BackendStep, Binding, Ran, SendWatch};
use io_uring::{opcode, types};
use rdmablk_common::fabrics::ConnectCmd;
use rdmablk_common::nvme::identify::sgls;
use rdmablk_common::nvme::{Sgl, Sqe, Status};
use rdmablk_common::tcp::stream::{RxBuf, TxQueue};
use rdmablk_common::tcp::{self, fes, Digests, Header, PduError, Transfer};
use std::collections::VecDeque;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::io::AsRawFd;
use std::time::{Duration, Instant};

/// In-capsule data the target accepts (beyond the 64-byte command).
pub const IN_CAPSULE_DATA: usize = 8192;
/// Largest H2CData payload the target accepts (MAXH2CDATA).
pub const MAX_H2C_DATA: usize = 128 << 10;
/// Largest C2HData payload the target sends; larger reads are split.
pub const MAX_C2H_DATA: usize = 128 << 10;
/// Largest PDU accepted: an H2CData PDU with digests and the most padding
/// (whose data goes straight to its command's buffer, see `DIRECT_MIN`).
const MAX_PDU: usize = MAX_H2C_DATA + 256;
/// Largest PDU other than H2CData: a command capsule with the most
/// in-capsule data, digests and padding.
const MAX_CAPSULE_PDU: usize = 72 + IN_CAPSULE_DATA + 256;
/// H2CData at least this large is received straight into the command's
/// arena buffer rather than through the receive buffer.
const DIRECT_MIN: usize = 16 << 10;
/// Receive buffer: room for any PDU that passes through it (a capsule, an
/// H2CData below `DIRECT_MIN`) plus the start of the next.
const RX_BUF: usize = 32 << 10;
/// Commands per queue before Connect says how deep it is.
const INITIAL_SLOTS: usize = 32;
/// The send token of a response to a command that never had a slot.
const NO_SLOT: u64 = u64::MAX;
/// A connection that was sent a TermReq is closed after this time at most.
const TERMINATE_GRACE: Duration = Duration::from_secs(1);
/// A closed connection whose socket operations have not ended after this
/// time has them cancelled.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// What NVMe/TCP contributes to Identify Controller.
pub fn caps() -> TransportCaps {
    TransportCaps {
        ioccsz: ((64 + IN_CAPSULE_DATA) / 16) as u32,
        sgls: sgls::SUPPORTED | sgls::OFFSET | sgls::TRANSPORT,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for ICReq.
    Handshake,
    Live,
    /// A TermReq is queued; close once it is sent.
    Terminating,
    /// Shut down; freed once no operation is in flight.
    Closing,
}

/// One NVMe/TCP connection: one queue (admin or I/O) of a controller.
pub struct TcpConn {
    sock: TcpStream,
    peer: String,
    idx: usize,
    phase: Phase,
    since: Instant,
    digests: Digests,
    /// Alignment of data in C2H PDUs the host asked for (HPDA).
    c2h_align: usize,
    rx: RxBuf,
    recv_busy: bool,
    /// Queued PDUs; a token is a command slot to release once sent.
    tx: TxQueue,
    send_busy: bool,
    /// Slots whose last PDU went out (scratch for `TxQueue::advance`).
    sent_slots: Vec<u64>,
    /// Whether the host reads what is sent (limits.send_timeout).
    sends: SendWatch,
    bind: Binding,
    /// The queue id, once connected.
    qid: u16,
    /// Socket operations of the closed connection were cancelled.
    cancelled: bool,
    /// Responses queued for commands refused before they had a slot, not
    /// yet sent: at the queue's depth, nothing more is read until they go.
    unslotted: usize,
    cmds: Vec<Option<Command>>,
    /// Backend operations in flight.
    backend_ops: usize,
    /// CIDs of held Asynchronous Event Requests.
    held_aers: Vec<u16>,
    /// Submission queue head reported in responses.
    sq_head: u16,
    /// A capsule is waiting for a command slot (the host exceeded the depth).
    stalled: bool,
    /// Commands waiting for arena space, in arrival order.
    awaiting_buffer: VecDeque<u16>,
    direct: Option<Direct>,
    /// The receive in flight writes into a command's buffer.
    recv_direct: bool,
    /// C2HData PDUs sent (for tests and stats).
    pub c2h_pdus: u64,
}

/// An H2CData payload being received in place.
struct Direct {
    slot: u16,
    /// Where the next bytes go, and how many are still to come.
    dst: *mut u8,
    left: usize,
    /// The whole payload, for the data digest that follows it.
    start: *const u8,
    len: usize,
    digest: bool,
}

/// Why a PDU cannot be handled: the connection ends with a TermReq.
struct Fatal {
    fes: u16,
    fei: u32,
    why: String,
}

impl From<PduError> for Fatal {
    fn from(e: PduError) -> Fatal {
        Fatal {
            fes: e.fes(),
            fei: e.fei(),
            why: e.to_string(),
        }
    }
}

fn fatal(fes: u16, fei: u32, why: impl Into<String>) -> Fatal {
    Fatal {
        fes,
        fei,
        why: why.into(),
    }
}

/// What became of one received PDU.
enum Flow {
    Consumed,
    /// Leave it in the buffer and retry later (no slot or buffer free).
    Stall,
}

impl TcpConn {
    /// A new connection, holding one of the places of connections waiting
    /// for their Connect.
    pub fn new(
        sock: TcpStream,
        peer: SocketAddr,
        idx: usize,
        pending: Permit,
    ) -> std::io::Result<Self> {
        let _ = sock.set_nodelay(true);
        Ok(TcpConn {
            sock,
            peer: peer.to_string(),
            idx,
            phase: Phase::Handshake,
            since: Instant::now(),
            digests: Digests::default(),
            c2h_align: 1,
            rx: RxBuf::new(RX_BUF)?,
            recv_busy: false,
            tx: TxQueue::default(),
            send_busy: false,
            sent_slots: Vec::new(),
            sends: SendWatch::default(),
            bind: Binding::new(pending),
            qid: 0,
            cancelled: false,
            unslotted: 0,
            cmds: (0..INITIAL_SLOTS).map(|_| None).collect(),
            backend_ops: 0,
            held_aers: Vec::new(),
            sq_head: 0,
            stalled: false,
            awaiting_buffer: VecDeque::new(),
            direct: None,
            recv_direct: false,
            c2h_pdus: 0,
        })
    }

    /// Whether the connection is shut down and nothing refers to it any more.
    pub fn can_free(&self) -> bool {
        self.phase == Phase::Closing && !self.recv_busy && !self.send_busy && self.backend_ops == 0
    }

    /// Commands in progress (held AERs excluded).
    fn busy_commands(&self) -> usize {
        self.cmds.iter().filter(|c| c.is_some()).count()
    }

    /// Starts closing the connection: the socket is shut down so that pending
    /// socket operations complete, and nothing new is started.
    pub fn close(&mut self, why: &str) {
        if self.phase == Phase::Closing {
            return;
        }
        match &self.bind.assoc {
            Some(a) => {
                tracing::info!(peer = %self.peer, cntlid = a.ctrl.cntlid, qid = a.qid, "queue closed: {why}")
            }
            // A connection that never connected a queue: a flood of them
            // would flood the log too.
            None => tracing::debug!(peer = %self.peer, "connection closed: {why}"),
        }
        self.phase = Phase::Closing;
        self.since = Instant::now();
        let _ = self.sock.shutdown(Shutdown::Both);
    }

    /// Closes a connection whose host stopped reading: what it did not read
    /// is dropped (the socket resets) rather than kept for it.
    fn abort(&mut self, why: &str) {
        let _ = nix::sys::socket::setsockopt(
            &self.sock,
            nix::sys::socket::sockopt::Linger,
            &libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        );
        self.close(why);
    }

    /// Frees what the connection holds; call once `can_free`.
    pub fn teardown(&mut self, io: &mut Io) {
        for c in self.cmds.iter_mut().filter_map(Option::take) {
            let mut c = c;
            self.bind.release(&mut c, io);
        }
        queue::end_association(self.bind.assoc.take(), io.stopping);
    }

    /// Periodic checks of every deadline: handshake, Connect, keep-alive and
    /// enable (through the association), R2T data, send progress.
    pub fn on_tick(&mut self, io: &mut Io) {
        let limits = &io.registry.admission.limits;
        match self.phase {
            Phase::Handshake if queue::handshake_overdue(self.since, limits) => {
                self.close("no ICReq within limits.handshake_timeout")
            }
            Phase::Terminating if self.since.elapsed() > TERMINATE_GRACE => {
                self.close("terminated")
            }
            Phase::Live => {
                if self.bind.assoc.is_none() && queue::handshake_overdue(self.since, limits) {
                    self.close("no Connect within limits.handshake_timeout of the connection");
                }
                if let Some(why) = queue::check_association(self.bind.assoc.as_ref(), limits) {
                    self.close(why);
                }
                let stuck =
                    self.cmds.iter().flatten().any(|c| {
                        c.received < c.requested && c.since.elapsed() > limits.data_timeout
                    });
                if stuck {
                    self.close("the host did not send the data asked for by an R2T within limits.data_timeout");
                }
                if self.sends.stalled(limits.send_timeout) {
                    self.abort(
                        "the host did not read what was sent to it within limits.send_timeout",
                    );
                }
            }
            Phase::Closing if !self.cancelled && self.since.elapsed() > CANCEL_GRACE => {
                // The shutdown should have ended them; make sure.
                for (busy, token) in [
                    (self.recv_busy, Token::Recv(self.idx)),
                    (self.send_busy, Token::Send(self.idx)),
                ] {
                    if busy {
                        let cancel = opcode::AsyncCancel::new(token.encode())
                            .build()
                            .user_data(Token::Cancel.encode());
                        // SAFETY: a cancellation points at no memory.
                        unsafe { io.sq.push(cancel) };
                    }
                }
                self.cancelled = true;
            }
            _ => {}
        }
    }

    /// Does whatever the connection can do now: parse buffered PDUs, keep a
    /// receive and a send in flight, finish a drain.
    pub fn pump(&mut self, io: &mut Io) {
        if matches!(self.phase, Phase::Handshake | Phase::Live) {
            self.grant_buffers(io);
            self.process_rx(io);
        }
        if matches!(self.phase, Phase::Handshake | Phase::Live) && !self.recv_busy {
            self.start_recv(io);
        }
        if !self.send_busy && !self.tx.is_empty() && self.phase != Phase::Closing {
            self.start_send(io);
        }
        let drained = self.tx.is_empty() && !self.send_busy;
        if self.phase == Phase::Terminating && drained {
            self.close("terminated after a protocol error");
        }
        if self.phase == Phase::Live && self.bind.must_close() && drained {
            self.close("disconnected, and no place for a connection waiting for its Connect");
        }
        if io.stopping && self.phase != Phase::Closing && drained && self.busy_commands() == 0 {
            self.close("target shutting down");
        }
    }

    fn start_recv(&mut self, io: &mut Io) {
        let (ptr, len, direct) = match &self.direct {
            Some(d) if d.left > 0 => (d.dst, d.left, true),
            _ => {
                let spare = self.rx.spare();
                (spare.as_mut_ptr(), spare.len(), false)
            }
        };
        if len == 0 {
            return; // full of a stalled PDU: wait for resources
        }
        let e = opcode::Recv::new(types::Fd(self.sock.as_raw_fd()), ptr, len as u32)
            .build()
            .user_data(Token::Recv(self.idx).encode());
        // SAFETY: the receive writes into this connection's receive buffer
        // (a mapping of its own, unmapped only with the boxed connection,
        // which is freed only once `recv_busy` is clear), or into the arena
        // buffer of the command whose H2CData it is: that command cannot
        // complete, and so keep or free its buffer, before its data arrives,
        // and teardown also waits for `recv_busy`.
        unsafe { io.sq.push(e) };
        self.recv_busy = true;
        self.recv_direct = direct;
    }

    pub fn on_recv(&mut self, res: i32) {
        self.recv_busy = false;
        let direct = std::mem::take(&mut self.recv_direct);
        if self.phase == Phase::Closing {
            return;
        }
        if let (true, Some(d)) = (direct && res > 0, self.direct.as_mut()) {
            d.left -= res as usize;
            d.dst = d.dst.wrapping_add(res as usize);
            return;
        }
        if res == 0 {
            self.close("host closed the connection");
        } else if res < 0 {
            self.close(&format!(
                "receive failed: {}",
                std::io::Error::from_raw_os_error(-res)
            ));
        } else {
            self.rx.filled(res as usize);
        }
    }

    fn start_send(&mut self, io: &mut Io) {
        let e = opcode::SendMsg::new(types::Fd(self.sock.as_raw_fd()), self.tx.message())
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
            .user_data(Token::Send(self.idx).encode());
        // SAFETY: the message header and iovecs live in the boxed TxQueue and
        // stay put until the next `message`, called only once this send has
        // completed (`send_busy`); PDU headers and digests are heap buffers
        // owned by its items (they do not move when the item deque grows);
        // payloads are arena buffers whose commands are released only when
        // `advance` reports their last PDU sent; the connection is freed only
        // once `send_busy` is clear.
        unsafe { io.sq.push(e) };
        self.send_busy = true;
        self.sends.posted();
    }

    pub fn on_send(&mut self, res: i32, io: &mut Io) {
        self.send_busy = false;
        if res < 0 {
            self.close(&format!(
                "send failed: {}",
                std::io::Error::from_raw_os_error(-res)
            ));
            return;
        }
        let mut sent = std::mem::take(&mut self.sent_slots);
        self.tx.advance(res as usize, &mut sent);
        if res > 0 {
            self.sends.progressed(!self.tx.is_empty());
        }
        for token in sent.drain(..) {
            match token {
                NO_SLOT => self.unslotted -= 1,
                slot => self.free_slot(slot as u16, io),
            }
        }
        self.sent_slots = sent;
    }

    fn free_slot(&mut self, slot: u16, io: &mut Io) {
        if let Some(mut c) = self.cmds.get_mut(slot as usize).and_then(Option::take) {
            self.bind.release(&mut c, io);
        }
    }

    pub fn on_backend(&mut self, slot: u16, res: i32, io: &mut Io) {
        self.backend_ops -= 1;
        let Some(cmd) = self.cmds.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        match queue::on_backend(cmd, res, io) {
            BackendStep::Submit(next) => {
                let e = next.user_data(Token::Backend(self.idx, slot).encode());
                // SAFETY: as `queue::submit_backend`: the rest of a short
                // transfer, in the command's arena buffer.
                unsafe { io.sq.push(e) };
                self.backend_ops += 1;
            }
            BackendStep::Complete => self.complete(slot, io),
            BackendStep::Pending => {}
        }
    }

    fn process_rx(&mut self, io: &mut Io) {
        // Take the buffer out so that PDUs can borrow it while `self` changes.
        let mut rx = std::mem::replace(&mut self.rx, RxBuf::empty());
        self.stalled = false;
        while matches!(self.phase, Phase::Handshake | Phase::Live) {
            if self.direct.is_some() {
                if self.drain_direct(&mut rx, io) {
                    continue;
                }
                break;
            }
            let avail = rx.pending();
            let expect = if self.phase == Phase::Handshake {
                Digests::default()
            } else {
                self.digests
            };
            let res = tcp::decode(avail, expect, MAX_PDU)
                .map_err(Fatal::from)
                .and_then(|d| match d {
                    None => Ok(None),
                    Some((pdu, n)) => self.handle_pdu(&pdu, io).map(|f| Some((f, n))),
                });
            match res {
                Ok(None) => {
                    if let Err(f) = self.start_direct(&mut rx, io) {
                        let avail = rx.pending();
                        let hdr = &avail[..avail.len().min(tcp::TERM_REQ_MAX_DATA)];
                        self.terminate(f, hdr);
                    }
                    break;
                }
                Ok(Some((Flow::Consumed, n))) => rx.consume(n),
                Ok(Some((Flow::Stall, _))) => {
                    self.stalled = true;
                    break;
                }
                Err(f) => {
                    let hdr = &avail[..avail.len().min(tcp::TERM_REQ_MAX_DATA)];
                    self.terminate(f, hdr);
                }
            }
        }
        self.rx = rx;
    }

    /// Sends a C2HTermReq carrying the offending header and ends the connection.
    fn terminate(&mut self, f: Fatal, bad_header: &[u8]) {
        tracing::warn!(peer = %self.peer, fes = f.fes, fei = f.fei, "protocol error: {}; sending C2HTermReq", f.why);
        let h = Header::TermReq {
            from_host: false,
            fes: f.fes,
            fei: f.fei,
        };
        self.queue(tcp::encode(&h, 0, bad_header, self.digests, 1), None);
        self.phase = Phase::Terminating;
        self.since = Instant::now();
    }

    fn handle_pdu(&mut self, pdu: &tcp::Pdu<'_>, io: &mut Io) -> Result<Flow, Fatal> {
        match (self.phase, pdu.header) {
            (
                Phase::Handshake,
                Header::IcReq {
                    pfv, hpda, digests, ..
                },
            ) => {
                if pfv != 0 {
                    return Err(fatal(
                        fes::UNSUPPORTED_PARAMETER,
                        8,
                        format!("PDU format version {pfv}"),
                    ));
                }
                if hpda > 31 {
                    return Err(fatal(
                        fes::INVALID_HEADER_FIELD,
                        10,
                        format!("HPDA {hpda} is above 31"),
                    ));
                }
                self.digests = digests;
                self.c2h_align = (hpda as usize + 1) * 4;
                let resp = Header::IcResp {
                    pfv: 0,
                    cpda: 0,
                    digests,
                    maxh2cdata: MAX_H2C_DATA as u32,
                };
                self.queue(tcp::encode(&resp, 0, &[], Digests::default(), 1), None);
                self.phase = Phase::Live;
                tracing::debug!(peer = %self.peer, ?digests, hpda, "NVMe/TCP connection initialized");
                Ok(Flow::Consumed)
            }
            (Phase::Handshake, _) => {
                Err(fatal(fes::INVALID_HEADER_FIELD, 0, "expected ICReq first"))
            }
            // While the daemon drains, capsules that still arrive are served
            // too: the connection closes at its first idle moment.
            (Phase::Live, Header::CapsuleCmd(sqe)) => {
                self.handle_capsule(&sqe, pdu.data, pdu.data_digest_ok, io)
            }
            (Phase::Live, Header::H2CData(t)) => {
                self.handle_h2c(t, pdu.data, pdu.data_digest_ok, io)?;
                Ok(Flow::Consumed)
            }
            (_, Header::TermReq { fes, fei, .. }) => {
                tracing::warn!(peer = %self.peer, fes, fei, "host terminated the connection (H2CTermReq)");
                self.close("host sent H2CTermReq");
                Ok(Flow::Consumed)
            }
            (_, h) => Err(fatal(
                fes::INVALID_HEADER_FIELD,
                0,
                format!(
                    "PDU type {:#04x} is not one a host sends here",
                    h.pdu_type()
                ),
            )),
        }
    }

    fn handle_capsule(
        &mut self,
        sqe: &Sqe,
        data: &[u8],
        digest_ok: bool,
        io: &mut Io,
    ) -> Result<Flow, Fatal> {
        let cid = sqe.cid();
        if self.unslotted >= self.depth() as usize {
            // As many refusals unsent as the queue has entries: a host that
            // keeps sending bad capsules without reading waits for them.
            return Ok(Flow::Stall);
        }
        let sgl = sqe.sgl();
        let in_capsule = match sgl {
            Sgl::InCapsule { offset, len } => {
                if offset != 0 {
                    return Ok(self.respond_now(cid, Status::SGL_OFFSET_INVALID));
                }
                if len as usize != data.len() || data.len() > IN_CAPSULE_DATA {
                    return Ok(self.respond_now(cid, Status::SGL_DATA_LENGTH_INVALID));
                }
                true
            }
            Sgl::Transport { .. } | Sgl::Null => {
                if !data.is_empty() {
                    return Ok(self.respond_now(cid, Status::SGL_DATA_LENGTH_INVALID));
                }
                false
            }
            Sgl::Keyed { .. } | Sgl::Unsupported(_) => {
                return Ok(self.respond_now(cid, Status::SGL_DESCRIPTOR_TYPE_INVALID));
            }
        };
        let mut cmd = match command::plan(self.bind.assoc.as_ref(), sqe, sgl.len()) {
            Ok(c) => c,
            Err(st) => return Ok(self.respond_now(cid, st)),
        };
        if in_capsule && (cmd.to_host || data.len() != cmd.len) {
            // Data to the host travels in C2HData PDUs, and data in the
            // capsule must be exactly what the command moves.
            return Ok(self.respond_now(cid, Status::SGL_DATA_LENGTH_INVALID));
        }
        let Some(slot) = self.cmds.iter().position(Option::is_none) else {
            return Ok(Flow::Stall); // the host exceeded the queue depth
        };
        if cmd.len > 0 {
            cmd.buf = self.bind.alloc(cmd.len, io);
        }
        if in_capsule && !data.is_empty() {
            match &cmd.buf {
                Some(b) => io.arena.bytes_mut(b, data.len()).copy_from_slice(data),
                None => {
                    // Commands holding buffers while their H2CData is still
                    // to come: that data may be behind this capsule, so the
                    // stream must not stop here.
                    let must = self
                        .cmds
                        .iter()
                        .flatten()
                        .any(|c| c.buf.is_some() && !c.to_host && c.received < c.len);
                    match self.bind.stage(data, must, io) {
                        Staged::Copy(d) => cmd.staged = Some(d),
                        // The poller holds all the staged data it may: leave
                        // this capsule in the socket until buffers come back.
                        Staged::Stall => return Ok(Flow::Stall),
                        Staged::Refuse => {
                            let st = self.bind.retry_later();
                            return Ok(self.respond_now(cid, st));
                        }
                    }
                }
            }
            cmd.received = data.len();
            cmd.requested = data.len();
            if !digest_ok {
                cmd.status = Status::TRANSIENT_TRANSPORT_ERROR;
            }
        }
        self.sq_head = (self.sq_head + 1) % self.depth();
        self.cmds[slot] = Some(cmd);
        self.advance(slot as u16, io);
        Ok(Flow::Consumed)
    }

    /// Moves a command on: it waits for an arena buffer, asks the host for
    /// the next piece of its data, or runs.
    fn advance(&mut self, slot: u16, io: &mut Io) {
        let cmd = self.cmds[slot as usize]
            .as_mut()
            .expect("advancing a live slot");
        if cmd.len > 0 && cmd.buf.is_none() {
            // The arena is full: wait without blocking the byte stream, which
            // carries the data that lets other commands finish.
            if !self.awaiting_buffer.contains(&slot) {
                self.awaiting_buffer.push_back(slot);
            }
            return;
        }
        self.bind.unstage_into(cmd, io);
        if !cmd.to_host && cmd.received < cmd.len {
            if cmd.requested == cmd.received {
                // One R2T of at most MAXH2CDATA at a time: hosts that predate
                // splitting H2CData send each R2T's data in one PDU.
                let n = (cmd.len - cmd.received).min(MAX_H2C_DATA);
                let r2t = Header::R2T(Transfer {
                    cccid: cmd.sqe.cid(),
                    ttag: slot,
                    offset: cmd.received as u32,
                    len: n as u32,
                });
                cmd.requested += n;
                cmd.since = Instant::now();
                self.queue(tcp::encode(&r2t, 0, &[], self.digests, 1), None);
            }
            return;
        }
        self.run(slot, io);
    }

    /// Gives freed arena space to the commands waiting for it, in order.
    fn grant_buffers(&mut self, io: &mut Io) {
        while let Some(&slot) = self.awaiting_buffer.front() {
            let Some(cmd) = self.cmds.get_mut(slot as usize).and_then(Option::as_mut) else {
                self.awaiting_buffer.pop_front();
                continue;
            };
            match self.bind.alloc(cmd.len, io) {
                Some(b) => {
                    cmd.buf = Some(b);
                    self.awaiting_buffer.pop_front();
                    self.advance(slot, io);
                }
                None => return,
            }
        }
    }

    /// Queue entries: what Connect negotiated, or the admin maximum before.
    fn depth(&self) -> u16 {
        self.bind
            .assoc
            .as_ref()
            .map_or(INITIAL_SLOTS as u16, |a| a.depth)
    }

    /// Checks an H2CData header against the command it names; returns
    /// where its data goes.
    fn check_h2c(&self, t: Transfer, len: usize, io: &Io) -> Result<*mut u8, Fatal> {
        let cmd = self
            .cmds
            .get(t.ttag as usize)
            .and_then(Option::as_ref)
            .filter(|c| c.sqe.cid() == t.cccid && !c.to_host && c.received < c.requested)
            .ok_or_else(|| {
                fatal(
                    fes::INVALID_HEADER_FIELD,
                    10,
                    format!("H2CData for unknown transfer tag {}", t.ttag),
                )
            })?;
        if len > MAX_H2C_DATA {
            return Err(fatal(
                fes::DATA_LIMIT_EXCEEDED,
                16,
                "H2CData larger than MAXH2CDATA",
            ));
        }
        let end = t.offset as usize + len;
        if t.offset as usize != cmd.received || end > cmd.requested {
            return Err(fatal(
                fes::DATA_OUT_OF_RANGE,
                12,
                format!(
                    "H2CData offset {} length {len} outside the requested {}..{}",
                    t.offset, cmd.received, cmd.requested
                ),
            ));
        }
        let b = cmd
            .buf
            .as_ref()
            .expect("data is asked for only into a buffer");
        Ok(io.arena.addr(b, t.offset as usize))
    }

    /// Records that H2CData for `slot` arrived up to `end` and moves it on.
    fn h2c_received(&mut self, slot: u16, end: usize, digest_ok: bool, io: &mut Io) {
        let cmd = self.cmds[slot as usize]
            .as_mut()
            .expect("checked by check_h2c");
        cmd.received = end;
        if !digest_ok {
            tracing::warn!(peer = %self.peer, cid = cmd.sqe.cid(), "H2CData data digest mismatch");
            cmd.status = Status::TRANSIENT_TRANSPORT_ERROR;
        }
        self.advance(slot, io);
    }

    fn handle_h2c(
        &mut self,
        t: Transfer,
        data: &[u8],
        digest_ok: bool,
        io: &mut Io,
    ) -> Result<(), Fatal> {
        let dst = self.check_h2c(t, data.len(), io)?;
        // SAFETY: check_h2c found `data.len()` bytes of the command's arena
        // buffer at `dst` (within what was requested of the host).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        self.h2c_received(t.ttag, t.offset as usize + data.len(), digest_ok, io);
        Ok(())
    }

    /// Starts placing a large H2CData payload whose header has arrived
    /// straight into its command's arena buffer.
    fn start_direct(&mut self, rx: &mut RxBuf, io: &Io) -> Result<(), Fatal> {
        if self.phase != Phase::Live {
            return Ok(());
        }
        let pending = rx.pending();
        let Some(f) = tcp::decode_framing(pending, self.digests, MAX_PDU)? else {
            return Ok(());
        };
        let Header::H2CData(t) = f.header else {
            if f.plen > MAX_CAPSULE_PDU {
                // It could never be received whole: refuse it now.
                return Err(fatal(
                    fes::INVALID_HEADER_FIELD,
                    4,
                    format!(
                        "PLEN {} is larger than any capsule this target accepts",
                        f.plen
                    ),
                ));
            }
            return Ok(());
        };
        if f.data_len < DIRECT_MIN || pending.len() >= f.plen {
            return Ok(());
        }
        if pending.len() < f.data_at {
            return Ok(()); // the header's padding is still to come
        }
        let dst = self.check_h2c(t, f.data_len, io)?;
        let have = (pending.len() - f.data_at).min(f.data_len);
        // SAFETY: check_h2c found `f.data_len` bytes of the command's buffer at `dst`.
        unsafe { std::ptr::copy_nonoverlapping(pending[f.data_at..].as_ptr(), dst, have) };
        rx.consume(f.data_at + have);
        self.direct = Some(Direct {
            slot: t.ttag,
            dst: dst.wrapping_add(have),
            left: f.data_len - have,
            start: dst,
            len: f.data_len,
            digest: f.data_digest,
        });
        Ok(())
    }

    /// Moves received bytes of a direct payload into place and, once all is
    /// there (with its digest), hands it to the command. Returns true then.
    fn drain_direct(&mut self, rx: &mut RxBuf, io: &mut Io) -> bool {
        let d = self.direct.as_mut().expect("direct placement in progress");
        if d.left > 0 {
            let pending = rx.pending();
            let n = pending.len().min(d.left);
            // SAFETY: `d.dst` has `d.left` writable bytes of the command's buffer.
            unsafe { std::ptr::copy_nonoverlapping(pending.as_ptr(), d.dst, n) };
            d.left -= n;
            d.dst = d.dst.wrapping_add(n);
            rx.consume(n);
            if d.left > 0 {
                return false;
            }
        }
        let mut digest_ok = true;
        if d.digest {
            let pending = rx.pending();
            if pending.len() < tcp::DIGEST_LEN {
                return false;
            }
            let want = u32::from_le_bytes(pending[..4].try_into().expect("4 bytes"));
            // SAFETY: the payload was written to `d.start..d.start + d.len`.
            let data = unsafe { std::slice::from_raw_parts(d.start, d.len) };
            digest_ok = crc32c::crc32c(data) == want;
            rx.consume(tcp::DIGEST_LEN);
        }
        let d = self.direct.take().expect("checked above");
        let received = self.cmds[d.slot as usize]
            .as_ref()
            .map_or(0, |c| c.received);
        self.h2c_received(d.slot, received + d.len, digest_ok, io);
        true
    }

    /// Executes a command whose data (if any) has arrived.
    fn run(&mut self, slot: u16, io: &mut Io) {
        let cmd = self.cmds[slot as usize]
            .as_mut()
            .expect("running a live slot");
        match queue::run(
            cmd,
            &mut self.bind,
            io,
            caps(),
            &self.peer,
            self.held_aers.len(),
        ) {
            Ran::Complete => {
                if let Some(a) = &self.bind.assoc {
                    self.qid = a.qid;
                }
                let depth = self.depth() as usize;
                if depth > self.cmds.len() {
                    self.cmds.resize_with(depth, || None);
                }
                self.complete(slot, io);
            }
            Ran::Disconnected => {
                // The connection stays (NVMe Base 2.1, 6.4) but has no
                // queue: it gets the Connect deadline again.
                self.complete(slot, io);
                self.since = Instant::now();
            }
            Ran::Held => {
                self.held_aers.push(cmd.sqe.cid());
                self.free_slot(slot, io);
            }
            Ran::Waiting(entries) => {
                self.backend_ops +=
                    queue::submit_backend(entries, Token::Backend(self.idx, slot), io);
            }
        }
    }

    /// Queues the data (for reads) and the response of a finished command.
    fn complete(&mut self, slot: u16, io: &mut Io) {
        let cmd = self.cmds[slot as usize]
            .as_ref()
            .expect("completing a live slot");
        let (cid, status, dw0, dw1) = (cmd.sqe.cid(), cmd.status, cmd.dw0, cmd.dw1);
        // A Connect answers for the queue it asked for.
        let sqid = match &cmd.work {
            Work::Connect => ConnectCmd::from_sqe(&cmd.sqe).qid,
            _ => self.qid,
        };
        let mut success_in_data = false;
        if cmd.to_host && status.is_success() && cmd.len > 0 {
            // NVMe/TCP 1.0, 3.3.2.1 and 3.6.2.9: without SQ flow control, a
            // read whose completion has nothing to say ends with its last
            // C2HData PDU (SUCCESS) and no response capsule.
            success_in_data = self.bind.assoc.as_ref().is_some_and(|a| a.sq_flow_disabled)
                && dw0 == 0
                && dw1 == 0;
            let buf = cmd.buf.as_ref().expect("data command has a buffer");
            let all = Transfer {
                cccid: cid,
                ttag: 0,
                offset: 0,
                len: cmd.len as u32,
            };
            for (t, fl) in tcp::split_transfer(all, MAX_C2H_DATA) {
                let (at, n) = (t.offset as usize, t.len as usize);
                let last = fl & tcp::flags::LAST_PDU != 0;
                let fl = if last && success_in_data {
                    fl | tcp::flags::SUCCESS
                } else {
                    fl
                };
                let mut head = Vec::with_capacity(64);
                tcp::encode_header(
                    &mut head,
                    &Header::C2HData(t),
                    fl,
                    n,
                    self.digests,
                    self.c2h_align,
                );
                let digest = self
                    .digests
                    .data
                    .then(|| tcp::data_digest(&io.arena.bytes(buf, at + n)[at..]));
                let release = (last && success_in_data).then_some(slot as u64);
                self.tx
                    .push_with_body(head, io.arena.addr(buf, at), n, digest, release);
                self.c2h_pdus += 1;
            }
        }
        if !success_in_data {
            self.respond(cid, status, (dw0, dw1), sqid, Some(slot as u64));
        }
    }

    fn respond(
        &mut self,
        cid: u16,
        status: Status,
        dws: (u32, u32),
        sqid: u16,
        token: Option<u64>,
    ) {
        if !status.is_success() {
            tracing::debug!(peer = %self.peer, cid, %status, "command failed");
        }
        let cqe = queue::response(&self.bind, (cid, status), dws, self.sq_head, sqid);
        let pdu = tcp::encode(&Header::CapsuleResp(cqe), 0, &[], self.digests, 1);
        self.queue(pdu, token);
    }

    /// Completes a command that never got a slot (refused while parsing).
    fn respond_now(&mut self, cid: u16, status: Status) -> Flow {
        self.sq_head = (self.sq_head + 1) % self.depth();
        self.unslotted += 1;
        self.respond(cid, status, (0, 0), self.qid, Some(NO_SLOT));
        Flow::Consumed
    }

    /// Queues a PDU; `token` (a slot, or [`NO_SLOT`]) comes back once sent.
    fn queue(&mut self, head: Vec<u8>, token: Option<u64>) {
        self.tx.push(head, token);
    }
}
