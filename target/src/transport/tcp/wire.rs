//! The byte stream of a connection: the `queue::Wire` of NVMe/TCP (R2Ts,
//! C2HData and responses), and its socket operations on the ring.

use super::{Phase, IN_CAPSULE_DATA, MAX_H2C_DATA, NO_SLOT, PROFILE, RECV, SEND};
use crate::engine::poller::{Io, Token};
use crate::engine::queue::{Queue, Response, SendWatch, Wire};
use crate::nvme::command::Command;
use crate::nvme::fabric::TransportCaps;
use crate::nvme::port::Arrival;
use rdmablk_common::fabrics::SQHD_FLOW_DISABLED;
use rdmablk_common::tcp::stream::{Inbound, InboundLimits, Records, Role, Stream};
use rdmablk_common::tcp::{self, fes, Digests, Header, PduError, Transfer};
use std::net::TcpStream;
use std::time::Instant;

/// Largest C2HData payload the target sends; larger reads are split.
const MAX_C2H_DATA: usize = 128 << 10;
/// Receive buffer: room for any PDU that passes through it (a capsule, an
/// H2CData below `DIRECT_MIN`) plus the start of the next.
const RX_BUF: usize = 32 << 10;
/// Largest PDU accepted: an H2CData PDU with digests and the most padding
/// (whose data goes straight to its command's buffer, see `DIRECT_MIN`).
const MAX_PDU: usize = MAX_H2C_DATA + 256;
/// Largest PDU other than H2CData: a command capsule with the most
/// in-capsule data, digests and padding.
const MAX_CAPSULE_PDU: usize = 72 + IN_CAPSULE_DATA + 256;
/// H2CData at least this large is received straight into the command's
/// arena buffer rather than through the receive buffer.
const DIRECT_MIN: usize = 16 << 10;

/// The byte stream of a connection, as the state machine uses it.
pub(super) struct TcpWire {
    /// The socket with the PDUs it receives and those queued for it.
    pub(super) stream: Stream,
    /// Where the host reached the target.
    arrival: Arrival,
    ep: u8,
    idx: u32,
    pub(super) phase: Phase,
    pub(super) since: Instant,
    pub(super) digests: Digests,
    /// Alignment of data in C2H PDUs the host asked for (HPDA).
    pub(super) c2h_align: usize,
    /// Slots whose last PDU went out (scratch for `Stream::sent`); a token
    /// is a command slot, or [`NO_SLOT`].
    pub(super) sent_slots: Vec<u64>,
    /// Whether the host reads what is sent (limits.send_timeout).
    pub(super) sends: SendWatch,
    /// Socket operations of the closed connection were cancelled.
    pub(super) cancelled: bool,
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
            let arena = &io.arena;
            // The payload is sent from the command's buffer, which the
            // command keeps until its token comes back from the stream.
            self.stream.outbound.push_transfer(
                Header::C2HData,
                all,
                MAX_C2H_DATA,
                arena.addr(buf, 0),
                self.digests,
                self.c2h_align,
                |at, n| arena.crc32c(buf, at, n),
                if success_in_data {
                    tcp::flags::SUCCESS
                } else {
                    0
                },
                success_in_data.then_some(token),
            );
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
        self.stream.shutdown();
    }

    fn sends(&self) -> &SendWatch {
        &self.sends
    }

    /// What the host did not read is dropped (the socket resets) rather
    /// than kept for it.
    fn abandon_unsent(&mut self) {
        let _ = nix::sys::socket::setsockopt(
            self.stream.socket(),
            nix::sys::socket::sockopt::Linger,
            &libc::linger {
                l_onoff: 1,
                l_linger: 0,
            },
        );
    }

    /// No PDU left to send, and no send in flight.
    fn drained(&self) -> bool {
        self.stream.outbound.drained()
    }

    fn idle(&self) -> bool {
        !self.stream.busy()
    }
}

impl TcpWire {
    /// The receive side of a new connection's wire.
    pub(super) fn inbound() -> std::io::Result<Inbound> {
        Inbound::new(
            Role::Controller,
            InboundLimits {
                buffer: RX_BUF,
                max_pdu: MAX_PDU,
                max_other: MAX_CAPSULE_PDU,
                direct_min: DIRECT_MIN,
            },
        )
    }

    /// The wire of connection `idx` of endpoint `ep` on `sock` (reached
    /// through `arrival`), receiving into `inbound`, waiting for its ICReq.
    pub(super) fn new(
        sock: TcpStream,
        inbound: Inbound,
        tls: Option<Box<Records>>,
        arrival: Arrival,
        ep: u8,
        idx: u32,
    ) -> TcpWire {
        TcpWire {
            stream: Stream::with_tls(sock, inbound, tls),
            arrival,
            ep,
            idx,
            phase: Phase::Handshake,
            since: Instant::now(),
            digests: Digests::default(),
            c2h_align: 1,
            sent_slots: Vec::new(),
            sends: SendWatch::default(),
            cancelled: false,
        }
    }

    /// Queues a PDU without data; `token` comes back once it is sent.
    pub(super) fn push_pdu(&mut self, h: &Header, token: Option<u64>) {
        let digests = match h {
            Header::IcResp { .. } => Digests::default(),
            _ => self.digests,
        };
        self.stream.outbound.push(h, &[], digests, token);
    }

    pub(super) fn token(&self, what: u16) -> Token {
        Token::Endpoint {
            ep: self.ep,
            queue: self.idx,
            what,
        }
    }

    pub(super) fn start_recv(&mut self, io: &mut Io) {
        let Some(e) = self.stream.recv_entry(self.token(RECV).encode()) else {
            return; // one in flight, or full of a stalled PDU
        };
        // SAFETY: the receive writes into this connection's receive buffer
        // (a mapping of its own, unmapped only with the boxed connection,
        // which is freed only once no receive is in flight), or into the
        // arena buffer of the command whose H2CData it is: that command
        // cannot complete, and so keep or free its buffer, before its data
        // arrives, and teardown also waits for the receive.
        unsafe { io.sq.push(e) };
    }

    pub(super) fn start_send(&mut self, io: &mut Io) {
        let Some(e) = self.stream.send_entry(self.token(SEND).encode()) else {
            return;
        };
        // SAFETY: the message header and iovecs live in the stream's send
        // queue (in this boxed connection) and stay put until the next
        // send is built, only once this one has completed; PDU heads and
        // digests are heap buffers owned by the queued items, which do not
        // move when the queue grows; payloads are arena buffers whose
        // commands are freed only when `Stream::sent` hands back their
        // token; the connection is freed only once no send is in flight.
        unsafe { io.sq.push(e) };
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
