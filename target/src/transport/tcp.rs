//! NVMe/TCP: the ICReq/ICResp handshake, capsule PDUs, R2T and H2CData for
//! host data, C2HData for controller data, CapsuleResp, and C2HTermReq on
//! protocol errors. Socket I/O goes through the poller's ring; commands go
//! through the shared state machine (`queue.rs`), to which [`TcpWire`]
//! brings R2Ts and responses.

use crate::admission::Permit;
use crate::binding::Binding;
use crate::command::Command;
use crate::config;
use crate::error::{starting, DaemonError};
use crate::fabric::TransportCaps;
use crate::poller::{Endpoint, Io, Token};
use crate::queue::{self, InCapsule, Intake, Queue, Response, SendWatch, Wire};
use crate::transport::{base_caps_with, Listen, ListenerHandle, Profile, Transport};
use io_uring::{opcode, types};
use rdmablk_common::fabrics::discovery::trtype;
use rdmablk_common::fabrics::SQHD_FLOW_DISABLED;
use rdmablk_common::nvme::identify::sgls;
use rdmablk_common::nvme::Sqe;
use rdmablk_common::ring::Op;
use rdmablk_common::tcp::stream::{RxBuf, TxQueue};
use rdmablk_common::tcp::{self, fes, Digests, Header, PduError, Transfer};
use std::any::Any;
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Largest H2CData payload the target accepts (MAXH2CDATA).
const MAX_H2C_DATA: usize = 128 << 10;
/// Largest C2HData payload the target sends; larger reads are split.
const MAX_C2H_DATA: usize = 128 << 10;
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
/// The send token of a response to a command that never had a slot.
const NO_SLOT: u64 = u64::MAX;
/// A connection that was sent a TermReq is closed after this time at most.
const TERMINATE_GRACE: Duration = Duration::from_secs(1);
/// A closed connection whose socket operations have not ended after this
/// time has them cancelled.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// The NVMe/TCP transport.
pub struct NvmeTcp;

/// NVMe/TCP as controllers and discovery see it.
const PROFILE: Profile = Profile {
    kind: config::Transport::Tcp,
    caps: base_caps_with(sgls::TRANSPORT, "tcp"),
    ring_ops: &[
        Op(opcode::Recv::CODE, "RECV"),
        Op(opcode::SendMsg::CODE, "SENDMSG"),
    ],
    trtype: trtype::TCP,
    // NVMe/TCP 1.0 defines no TSAS without TLS.
    tsas: [0; 32],
};

/// In-capsule data the target accepts (beyond the 64-byte command).
const IN_CAPSULE_DATA: usize = PROFILE.caps.in_capsule_data as usize;

impl Transport for NvmeTcp {
    fn profile(&self) -> &'static Profile {
        &PROFILE
    }

    fn listen(&self, l: Listen) -> Result<ListenerHandle, DaemonError> {
        let addr = l.addr;
        let failed = |source| DaemonError::Listen {
            url: format!("tcp://{addr}"),
            source,
            hint: "",
        };
        let listener = TcpListener::bind(addr).map_err(failed)?;
        let wake = listener.try_clone().map_err(failed)?;
        let handle = ListenerHandle::new(l.stop.clone(), Some(wake));
        std::thread::Builder::new()
            .name(format!("accept-{addr}"))
            .spawn(move || accept_loop(listener, l))
            .map_err(starting("the acceptor"))?;
        Ok(handle)
    }

    fn endpoint(&self, ep: u8, _poller: usize) -> Box<dyn Endpoint> {
        Box::new(TcpEndpoint {
            ep,
            queues: Vec::new(),
        })
    }
}

/// A connection accepted, on its way to a poller.
struct Accepted {
    sock: TcpStream,
    peer: SocketAddr,
    /// Its place among connections waiting for their Connect.
    pending: Permit,
}

fn accept_loop(listener: TcpListener, l: Listen) {
    let mut next = 0;
    loop {
        let accepted = listener.accept();
        if l.stop.load(Ordering::Acquire) {
            tracing::info!("stopped listening on tcp://{}", l.addr);
            return;
        }
        match accepted {
            Ok((sock, peer)) => {
                // Past limits.pending_connections the socket is closed at once.
                let Some(pending) = l.registry.admission.pending_connection(&peer) else {
                    continue;
                };
                let conn = Accepted {
                    sock,
                    peer,
                    pending,
                };
                l.pollers[next % l.pollers.len()].adopt(l.ep, Box::new(conn));
                next += 1;
            }
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// What the endpoint's own tokens stand for: a connection's receive, its send.
const RECV: u16 = 0;
const SEND: u16 = 1;

/// The NVMe/TCP connections of one poller.
struct TcpEndpoint {
    ep: u8,
    queues: Vec<Option<Box<TcpQueue>>>,
}

impl TcpEndpoint {
    fn queue(&mut self, idx: u32) -> Option<&mut TcpQueue> {
        self.queues
            .get_mut(idx as usize)
            .and_then(|q| q.as_deref_mut())
    }
}

impl Endpoint for TcpEndpoint {
    fn adopt(&mut self, conn: Box<dyn Any + Send>, io: &mut Io) -> bool {
        let Ok(conn) = conn.downcast::<Accepted>() else {
            return false;
        };
        if io.stopping {
            return false; // dropping the socket closes it
        }
        let idx = queue::vacant(&mut self.queues);
        match TcpQueue::new(*conn, self.ep, idx as u32) {
            Ok(q) => {
                tracing::debug!(peer = %q.q.peer, "connection accepted");
                self.queues[idx] = Some(Box::new(q));
                true
            }
            Err(e) => {
                tracing::warn!("connection refused: {e}");
                false
            }
        }
    }

    fn on_completion(&mut self, queue: u32, what: u16, res: i32, io: &mut Io) {
        let Some(c) = self.queue(queue) else { return };
        match what {
            RECV => c.on_recv(res),
            _ => c.on_send(res, io),
        }
    }

    fn on_backend(&mut self, queue: u32, slot: u16, res: i32, io: &mut Io) {
        if let Some(c) = self.queue(queue) {
            c.q.on_backend(slot, res, io, &mut c.w);
        }
    }

    fn on_tick(&mut self, io: &mut Io) {
        for c in self.queues.iter_mut().flatten() {
            c.on_tick(io);
        }
    }

    fn pump(&mut self, io: &mut Io) -> usize {
        let mut freed = 0;
        for slot in self.queues.iter_mut() {
            let Some(c) = slot else { continue };
            c.pump(io);
            if c.can_free() {
                c.q.teardown(io);
                *slot = None;
                freed += 1;
            }
        }
        freed
    }

    fn queues(&self) -> usize {
        self.queues.iter().flatten().count()
    }

    fn close_all(&mut self, why: &str) {
        for c in self.queues.iter_mut().flatten() {
            c.close(why);
        }
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
struct TcpQueue {
    q: Queue,
    w: TcpWire,
}

/// The byte stream of a connection, as the state machine uses it.
struct TcpWire {
    sock: TcpStream,
    /// The address the host reached.
    local: Option<IpAddr>,
    ep: u8,
    idx: u32,
    phase: Phase,
    since: Instant,
    digests: Digests,
    /// Alignment of data in C2H PDUs the host asked for (HPDA).
    c2h_align: usize,
    rx: RxBuf,
    recv_busy: bool,
    /// Queued PDUs; a token is a command slot (or [`NO_SLOT`]) to hand
    /// back once sent.
    tx: TxQueue,
    send_busy: bool,
    /// Slots whose last PDU went out (scratch for `TxQueue::advance`).
    sent_slots: Vec<u64>,
    /// Whether the host reads what is sent (limits.send_timeout).
    sends: SendWatch,
    /// Socket operations of the closed connection were cancelled.
    cancelled: bool,
    direct: Option<Direct>,
    /// The receive in flight writes into a command's buffer.
    recv_direct: bool,
}

/// An H2CData payload being received in place.
struct Direct {
    slot: u16,
    /// Where the next bytes go, and how many are still to come.
    dst: *mut u8,
    left: usize,
    /// The payload's offset in the command's data and its length, for the
    /// data digest that follows it.
    at: usize,
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
    /// Leave it in the buffer and retry later (no room to hold it yet).
    Stall,
}

impl Wire for TcpWire {
    const DATA_OVERDUE: &'static str =
        "the host did not send the data asked for by an R2T within limits.data_timeout";

    fn caps(&self) -> TransportCaps {
        PROFILE.caps
    }

    fn local_addr(&self) -> Option<IpAddr> {
        self.local
    }

    /// One R2T of at most MAXH2CDATA at a time: hosts that predate
    /// splitting H2CData send each R2T's data in one PDU.
    fn fetch(&mut self, slot: u16, cmd: &mut Command, _io: &mut Io) {
        let n = (cmd.len - cmd.received).min(MAX_H2C_DATA);
        let r2t = Header::R2T(Transfer {
            cccid: cmd.sqe.cid(),
            ttag: slot,
            offset: cmd.received as u32,
            len: n as u32,
        });
        cmd.requested += n;
        self.push_pdu(&r2t, None);
    }

    fn respond(&mut self, r: Response<'_>, io: &mut Io) {
        let token = r.slot.map_or(NO_SLOT, u64::from);
        let cqe = r.cqe;
        let mut success_in_data = false;
        if let Some((buf, len)) = r.data {
            // NVMe/TCP 1.0, 3.3.2.1 and 3.6.2.9: without SQ flow control, a
            // read whose completion has nothing to say ends with its last
            // C2HData PDU (SUCCESS) and no response capsule.
            success_in_data = cqe.sqhd == SQHD_FLOW_DISABLED && cqe.dw0 == 0 && cqe.dw1 == 0;
            let all = Transfer {
                cccid: cqe.cid,
                ttag: 0,
                offset: 0,
                len: len as u32,
            };
            for (t, fl) in tcp::split_transfer(all, MAX_C2H_DATA) {
                let (at, n) = (t.offset as usize, t.len as usize);
                let last = fl & tcp::flags::LAST_PDU != 0;
                let ends = last && success_in_data;
                let fl = if ends { fl | tcp::flags::SUCCESS } else { fl };
                let mut head = self.tx.buf();
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
                    .then(|| io.arena.crc32c(buf, at, n).to_le_bytes());
                // The payload is sent from the command's buffer, which the
                // command keeps until its token comes back from the queue.
                self.tx.push_with_body(
                    head,
                    io.arena.addr(buf, at),
                    n,
                    digest,
                    ends.then_some(token),
                );
            }
        }
        if !success_in_data {
            self.push_pdu(&Header::CapsuleResp(cqe), Some(token));
        }
    }

    fn closing(&self) -> bool {
        self.phase == Phase::Closing
    }

    /// Shuts the socket down so that pending socket operations complete.
    fn shut(&mut self) {
        self.phase = Phase::Closing;
        self.since = Instant::now();
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}

impl TcpWire {
    /// Queues a PDU without data; `token` comes back once it is sent.
    fn push_pdu(&mut self, h: &Header, token: Option<u64>) {
        let digests = match h {
            Header::IcResp { .. } => Digests::default(),
            _ => self.digests,
        };
        let mut head = self.tx.buf();
        tcp::encode_into(&mut head, h, 0, &[], digests, 1);
        self.tx.push(head, token);
    }

    fn token(&self, what: u16) -> Token {
        Token::Endpoint {
            ep: self.ep,
            queue: self.idx,
            what,
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
            .user_data(self.token(RECV).encode());
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

    fn start_send(&mut self, io: &mut Io) {
        let e = opcode::SendMsg::new(types::Fd(self.sock.as_raw_fd()), self.tx.message())
            .flags(libc::MSG_NOSIGNAL as u32)
            .build()
            .user_data(self.token(SEND).encode());
        // SAFETY: the message header and iovecs live in the TxQueue (boxed
        // and in this boxed connection) and stay put until the next
        // `message`, called only once this send has completed
        // (`send_busy`); PDU heads and digests are heap buffers owned by the
        // queued items, which do not move when the item deque grows;
        // payloads are arena buffers whose commands are freed only when
        // `advance` hands back their token; the connection is freed only
        // once `send_busy` is clear.
        unsafe { io.sq.push(e) };
        self.send_busy = true;
        self.sends.posted();
    }

    /// Checks an H2CData header against the command it names; returns
    /// where its data goes.
    fn check_h2c(q: &Queue, t: Transfer, len: usize, io: &Io) -> Result<*mut u8, Fatal> {
        let cmd = q
            .command(t.ttag)
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
}

impl TcpQueue {
    /// A new connection, holding one of the places of connections waiting
    /// for their Connect.
    fn new(c: Accepted, ep: u8, idx: u32) -> std::io::Result<Self> {
        let _ = c.sock.set_nodelay(true);
        let local = c.sock.local_addr().ok().map(|a| a.ip());
        Ok(TcpQueue {
            q: Queue::new(Binding::new(c.pending), c.peer.to_string(), ep, idx, 0),
            w: TcpWire {
                sock: c.sock,
                local,
                ep,
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
                cancelled: false,
                direct: None,
                recv_direct: false,
            },
        })
    }

    /// Whether the connection is shut down and nothing refers to it any more.
    fn can_free(&self) -> bool {
        self.w.phase == Phase::Closing
            && !self.w.recv_busy
            && !self.w.send_busy
            && self.q.idle_backend()
    }

    fn close(&mut self, why: &str) {
        self.q.close(&mut self.w, why);
    }

    /// Closes a connection whose host stopped reading: what it did not read
    /// is dropped (the socket resets) rather than kept for it.
    fn abort(&mut self, why: &str) {
        let _ = nix::sys::socket::setsockopt(
            &self.w.sock,
            nix::sys::socket::sockopt::Linger,
            &libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        );
        self.close(why);
    }

    /// Periodic checks of every deadline: handshake, Connect, keep-alive and
    /// enable, R2T data (through the queue), send progress.
    fn on_tick(&mut self, io: &mut Io) {
        let limits = &io.registry.admission.limits;
        match self.w.phase {
            Phase::Handshake if self.w.since.elapsed() > limits.handshake_timeout => {
                self.close("no ICReq within limits.handshake_timeout")
            }
            Phase::Terminating if self.w.since.elapsed() > TERMINATE_GRACE => {
                self.close("terminated")
            }
            Phase::Live => {
                if let Some(why) = self.q.overdue::<TcpWire>(limits) {
                    self.close(why);
                } else if self.w.sends.stalled(limits.send_timeout) {
                    self.abort(
                        "the host did not read what was sent to it within limits.send_timeout",
                    );
                }
            }
            Phase::Closing if !self.w.cancelled && self.w.since.elapsed() > CANCEL_GRACE => {
                // The shutdown should have ended them; make sure.
                for (busy, what) in [(self.w.recv_busy, RECV), (self.w.send_busy, SEND)] {
                    if busy {
                        let cancel = opcode::AsyncCancel::new(self.w.token(what).encode())
                            .build()
                            .user_data(Token::Cancel.encode());
                        // SAFETY: a cancellation points at no memory.
                        unsafe { io.sq.push(cancel) };
                    }
                }
                self.w.cancelled = true;
            }
            _ => {}
        }
    }

    /// Does whatever the connection can do now: parse buffered PDUs, keep a
    /// receive and a send in flight, finish a drain.
    fn pump(&mut self, io: &mut Io) {
        let live = |p| matches!(p, Phase::Handshake | Phase::Live);
        if live(self.w.phase) {
            self.q.grant_buffers(io, &mut self.w);
            self.q.deliver_events(io, &mut self.w);
            self.process_rx(io);
        }
        if live(self.w.phase) && !self.w.recv_busy {
            self.w.start_recv(io);
        }
        if !self.w.send_busy && !self.w.tx.is_empty() && self.w.phase != Phase::Closing {
            self.w.start_send(io);
        }
        let drained = self.w.tx.is_empty() && !self.w.send_busy;
        if self.w.phase == Phase::Terminating && drained {
            self.close("terminated after a protocol error");
        }
        if self.w.phase == Phase::Live && self.q.bind.must_close() && drained {
            self.close("disconnected, and no place for a connection waiting for its Connect");
        }
        if io.stopping && self.w.phase != Phase::Closing && drained && self.q.busy() == 0 {
            self.close("target shutting down");
        }
    }

    fn on_recv(&mut self, res: i32) {
        self.w.recv_busy = false;
        let direct = std::mem::take(&mut self.w.recv_direct);
        if self.w.phase == Phase::Closing {
            return;
        }
        if let (true, Some(d)) = (direct && res > 0, self.w.direct.as_mut()) {
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
            self.w.rx.filled(res as usize);
        }
    }

    fn on_send(&mut self, res: i32, io: &mut Io) {
        self.w.send_busy = false;
        if res < 0 {
            self.close(&format!(
                "send failed: {}",
                std::io::Error::from_raw_os_error(-res)
            ));
            return;
        }
        let mut sent = std::mem::take(&mut self.w.sent_slots);
        self.w.tx.advance(res as usize, &mut sent);
        if res > 0 {
            self.w.sends.progressed(!self.w.tx.is_empty());
        }
        for token in sent.drain(..) {
            let slot = (token != NO_SLOT).then_some(token as u16);
            self.q.sent(slot, io);
        }
        self.w.sent_slots = sent;
    }

    fn process_rx(&mut self, io: &mut Io) {
        // Take the buffer out so that PDUs can borrow it while `self` changes.
        let mut rx = std::mem::replace(&mut self.w.rx, RxBuf::empty());
        while matches!(self.w.phase, Phase::Handshake | Phase::Live) {
            if self.w.direct.is_some() {
                if self.drain_direct(&mut rx, io) {
                    continue;
                }
                break;
            }
            let avail = rx.pending();
            let expect = if self.w.phase == Phase::Handshake {
                Digests::default()
            } else {
                self.w.digests
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
                Ok(Some((Flow::Stall, _))) => break,
                Err(f) => {
                    let hdr = &avail[..avail.len().min(tcp::TERM_REQ_MAX_DATA)];
                    self.terminate(f, hdr);
                }
            }
        }
        self.w.rx = rx;
    }

    /// Sends a C2HTermReq carrying the offending header and ends the connection.
    fn terminate(&mut self, f: Fatal, bad_header: &[u8]) {
        tracing::warn!(peer = %self.q.peer, fes = f.fes, fei = f.fei, "protocol error: {}; sending C2HTermReq", f.why);
        let h = Header::TermReq {
            from_host: false,
            fes: f.fes,
            fei: f.fei,
        };
        let mut pdu = self.w.tx.buf();
        tcp::encode_into(&mut pdu, &h, 0, bad_header, self.w.digests, 1);
        self.w.tx.push(pdu, None);
        self.w.phase = Phase::Terminating;
        self.w.since = Instant::now();
    }

    fn handle_pdu(&mut self, pdu: &tcp::Pdu<'_>, io: &mut Io) -> Result<Flow, Fatal> {
        match (self.w.phase, pdu.header) {
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
                self.w.digests = digests;
                self.w.c2h_align = (hpda as usize + 1) * 4;
                let resp = Header::IcResp {
                    pfv: 0,
                    cpda: 0,
                    digests,
                    maxh2cdata: MAX_H2C_DATA as u32,
                };
                self.w.push_pdu(&resp, None);
                self.w.phase = Phase::Live;
                tracing::debug!(peer = %self.q.peer, ?digests, hpda, "NVMe/TCP connection initialized");
                Ok(Flow::Consumed)
            }
            (Phase::Handshake, _) => {
                Err(fatal(fes::INVALID_HEADER_FIELD, 0, "expected ICReq first"))
            }
            // While the daemon drains, capsules that still arrive are served
            // too: the connection closes at its first idle moment.
            (Phase::Live, Header::CapsuleCmd(sqe)) => {
                Ok(self.handle_capsule(&sqe, pdu.data, pdu.data_digest_ok, io))
            }
            (Phase::Live, Header::H2CData(t)) => {
                let dst = TcpWire::check_h2c(&self.q, t, pdu.data.len(), io)?;
                // SAFETY: check_h2c found `pdu.data.len()` bytes of the
                // command's arena buffer at `dst` (within what was requested
                // of the host); the receive buffer is not arena memory.
                unsafe { std::ptr::copy_nonoverlapping(pdu.data.as_ptr(), dst, pdu.data.len()) };
                let end = t.offset as usize + pdu.data.len();
                self.q
                    .data_arrived(t.ttag, end, pdu.data_digest_ok, io, &mut self.w);
                Ok(Flow::Consumed)
            }
            (_, Header::TermReq { fes, fei, .. }) => {
                tracing::warn!(peer = %self.q.peer, fes, fei, "host terminated the connection (H2CTermReq)");
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

    fn handle_capsule(&mut self, sqe: &Sqe, data: &[u8], digest_ok: bool, io: &mut Io) -> Flow {
        let data = InCapsule::Bytes { data, digest_ok };
        match self.q.receive(sqe, data, io, &mut self.w) {
            Intake::Taken => Flow::Consumed,
            // Left in the socket until buffers or responses go.
            Intake::Stall => Flow::Stall,
            Intake::Overrun => {
                self.close("the host sent more commands than its queue holds");
                Flow::Consumed
            }
        }
    }

    /// Starts placing a large H2CData payload whose header has arrived
    /// straight into its command's arena buffer.
    fn start_direct(&mut self, rx: &mut RxBuf, io: &Io) -> Result<(), Fatal> {
        if self.w.phase != Phase::Live {
            return Ok(());
        }
        let pending = rx.pending();
        let Some(f) = tcp::decode_framing(pending, self.w.digests, MAX_PDU)? else {
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
        let dst = TcpWire::check_h2c(&self.q, t, f.data_len, io)?;
        let have = (pending.len() - f.data_at).min(f.data_len);
        // SAFETY: check_h2c found `f.data_len` bytes of the command's buffer
        // at `dst`; the receive buffer is not arena memory.
        unsafe { std::ptr::copy_nonoverlapping(pending[f.data_at..].as_ptr(), dst, have) };
        rx.consume(f.data_at + have);
        self.w.direct = Some(Direct {
            slot: t.ttag,
            dst: dst.wrapping_add(have),
            left: f.data_len - have,
            at: t.offset as usize,
            len: f.data_len,
            digest: f.data_digest,
        });
        Ok(())
    }

    /// Moves received bytes of a direct payload into place and, once all is
    /// there (with its digest), hands it to the command. Returns true then.
    fn drain_direct(&mut self, rx: &mut RxBuf, io: &mut Io) -> bool {
        let d = self
            .w
            .direct
            .as_mut()
            .expect("direct placement in progress");
        if d.left > 0 {
            let pending = rx.pending();
            let n = pending.len().min(d.left);
            // SAFETY: `d.dst` has `d.left` writable bytes of the command's
            // buffer; the receive buffer is not arena memory.
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
            let buf = self.q.command(d.slot).and_then(|c| c.buf.as_ref());
            digest_ok = buf.is_some_and(|b| io.arena.crc32c(b, d.at, d.len) == want);
            rx.consume(tcp::DIGEST_LEN);
        }
        let d = self.w.direct.take().expect("checked above");
        self.q
            .data_arrived(d.slot, d.at + d.len, digest_ok, io, &mut self.w);
        true
    }
}
