//! The byte stream of a connection: the `queue::Wire` of NVMe/TCP (R2Ts,
//! C2HData and responses), and its socket operations on the ring.

use super::{Phase, MAX_H2C_DATA, NO_SLOT, PROFILE, RECV, SEND};
use crate::engine::poller::{Io, Token};
use crate::engine::queue::{Queue, Response, SendWatch, Wire};
use crate::nvme::command::Command;
use crate::nvme::fabric::TransportCaps;
use crate::nvme::port::Arrival;
use io_uring::{opcode, types};
use rdmablk_common::fabrics::SQHD_FLOW_DISABLED;
use rdmablk_common::tcp::stream::{RxBuf, TxQueue};
use rdmablk_common::tcp::{self, fes, Digests, Header, PduError, Transfer};
use std::net::{Shutdown, TcpStream};
use std::os::unix::io::AsRawFd;
use std::time::Instant;

/// Largest C2HData payload the target sends; larger reads are split.
const MAX_C2H_DATA: usize = 128 << 10;
/// Receive buffer: room for any PDU that passes through it (a capsule, an
/// H2CData below `DIRECT_MIN`) plus the start of the next.
const RX_BUF: usize = 32 << 10;

/// The byte stream of a connection, as the state machine uses it.
pub(super) struct TcpWire {
    sock: TcpStream,
    /// Where the host reached the target.
    arrival: Arrival,
    ep: u8,
    idx: u32,
    pub(super) phase: Phase,
    pub(super) since: Instant,
    pub(super) digests: Digests,
    /// Alignment of data in C2H PDUs the host asked for (HPDA).
    pub(super) c2h_align: usize,
    pub(super) rx: RxBuf,
    pub(super) recv_busy: bool,
    /// Queued PDUs; a token is a command slot (or [`NO_SLOT`]) to hand
    /// back once sent.
    pub(super) tx: TxQueue,
    pub(super) send_busy: bool,
    /// Slots whose last PDU went out (scratch for `TxQueue::advance`).
    pub(super) sent_slots: Vec<u64>,
    /// Whether the host reads what is sent (limits.send_timeout).
    pub(super) sends: SendWatch,
    /// Socket operations of the closed connection were cancelled.
    pub(super) cancelled: bool,
    pub(super) direct: Option<Direct>,
    /// The receive in flight writes into a command's buffer.
    pub(super) recv_direct: bool,
}

/// An H2CData payload being received in place.
pub(super) struct Direct {
    pub(super) slot: u16,
    /// Where the next bytes go, and how many are still to come.
    pub(super) dst: *mut u8,
    pub(super) left: usize,
    /// The payload's offset in the command's data and its length, for the
    /// data digest that follows it.
    pub(super) at: usize,
    pub(super) len: usize,
    pub(super) digest: bool,
}

/// Why a PDU cannot be handled: the connection ends with a TermReq.
pub(super) struct Fatal {
    pub(super) fes: u16,
    pub(super) fei: u32,
    pub(super) why: String,
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

pub(super) fn fatal(fes: u16, fei: u32, why: impl Into<String>) -> Fatal {
    Fatal {
        fes,
        fei,
        why: why.into(),
    }
}

impl Wire for TcpWire {
    const DATA_OVERDUE: &'static str =
        "the host did not send the data asked for by an R2T within limits.data_timeout";
    const SENDS_STALLED: &'static str =
        "the host did not read what was sent to it within limits.send_timeout";

    fn caps(&self) -> TransportCaps {
        PROFILE.caps
    }

    fn arrival(&self) -> &Arrival {
        &self.arrival
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

    fn sends(&self) -> &SendWatch {
        &self.sends
    }

    /// What the host did not read is dropped (the socket resets) rather
    /// than kept for it.
    fn abandon_unsent(&mut self) {
        let _ = nix::sys::socket::setsockopt(
            &self.sock,
            nix::sys::socket::sockopt::Linger,
            &libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        );
    }

    /// No PDU left to send, and no send in flight.
    fn drained(&self) -> bool {
        self.tx.is_empty() && !self.send_busy
    }

    fn idle(&self) -> bool {
        !self.recv_busy && !self.send_busy
    }
}

impl TcpWire {
    /// The wire of connection `idx` of endpoint `ep` on `sock` (reached
    /// through `arrival`), waiting for its ICReq.
    pub(super) fn new(
        sock: TcpStream,
        arrival: Arrival,
        ep: u8,
        idx: u32,
    ) -> std::io::Result<TcpWire> {
        Ok(TcpWire {
            sock,
            arrival,
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
        })
    }

    /// Queues a PDU without data; `token` comes back once it is sent.
    pub(super) fn push_pdu(&mut self, h: &Header, token: Option<u64>) {
        let digests = match h {
            Header::IcResp { .. } => Digests::default(),
            _ => self.digests,
        };
        let mut head = self.tx.buf();
        tcp::encode_into(&mut head, h, 0, &[], digests, 1);
        self.tx.push(head, token);
    }

    pub(super) fn token(&self, what: u16) -> Token {
        Token::Endpoint {
            ep: self.ep,
            queue: self.idx,
            what,
        }
    }

    pub(super) fn start_recv(&mut self, io: &mut Io) {
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

    pub(super) fn start_send(&mut self, io: &mut Io) {
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
        *io.sends += 1;
    }

    /// Checks an H2CData header against the command it names; returns
    /// where its data goes.
    pub(super) fn check_h2c(q: &Queue, t: Transfer, len: usize, io: &Io) -> Result<*mut u8, Fatal> {
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
