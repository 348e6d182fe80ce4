//! The transmission phase of NBD on an engine thread: requests are read from
//! each client socket through the engine's io_uring (payloads straight into
//! arena buffers), turned into NVMe commands on the engine's I/O queue, and
//! answered from the same buffers. Requests that are not aligned to the
//! namespace's blocks are served by read-modify-write.
//!
//! This module holds the state of clients and requests and the engine's
//! entry points; `receive` takes requests in, `plan` turns one into NVMe
//! commands, `submit` puts them on the queue, and `reply` answers and frees
//! requests and ends clients.

mod plan;
mod receive;
mod reply;
mod submit;

use super::handoff::{NewClient, Seat};
use super::handshake::Negotiated;
use super::proto::{errno, Command, Request, REQUEST_LEN};
use crate::host::engine::{Cx, Driver, RxId, TxId};
use crate::host::Done;
use crate::host::NamespaceInfo;
use rdmablk_common::mem::ArenaBuf;
use rdmablk_common::nvme::Status;
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;

/// Requests a client may have in progress at once.
const MAX_REQUESTS: usize = 64;
/// The share of an engine's arena one client may hold: a client that
/// never reads its replies holds at most this much, and the others go on.
const CLIENT_SHARE: usize = 8;
/// A client whose replies do not move for this long is closed: what it
/// holds goes back to the others.
const SEND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Times a request is tried again after transient transport errors.
const MAX_ATTEMPTS: u32 = 5;
/// A client's receive buffer for request headers (and the start of a
/// write's payload that comes with them): room for over a hundred headers.
const RX_LEN: usize = 4096;
/// Most blocks one Write Zeroes command covers (16-bit NLB).
const MAX_ZEROES_BLOCKS: u64 = 1 << 16;

/// What every connection of an export shares.
#[derive(Clone, Copy, Debug)]
pub struct ExportInfo {
    /// The namespace served.
    pub ns: NamespaceInfo,
    /// Largest request accepted (NBD maximum block size).
    pub max_block: u32,
    /// Largest transfer of one NVMe command.
    pub max_transfer: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Receiving the write payload.
    Payload,
    /// Discarding the payload of a refused write.
    Discard,
    /// Waiting for NVMe queue slots.
    Queued,
    /// Reading the edge blocks of an unaligned write.
    EdgeRead,
    /// NVMe commands in flight.
    Io,
    /// The reply is queued.
    Reply,
}

struct Req {
    r: Request,
    stage: Stage,
    buf: Option<ArenaBuf>,
    /// Byte offset in the namespace of `buf`'s first byte.
    base: u64,
    /// Bytes of `buf` that the NVMe commands cover.
    span: usize,
    /// Bytes received (payload) or discarded.
    got: usize,
    /// Commands of the current step submitted so far, and still in flight.
    submitted: usize,
    /// Served by read-modify-write (unaligned write or zeroes).
    rmw_unaligned: bool,
    /// A command failed on a lost connection: run the step again.
    retry: bool,
    /// Times the request was retried.
    attempts: u32,
    parts_left: usize,
    error: u32,
}

impl Req {
    /// Whether the request is served by read-modify-write of whole blocks:
    /// writes, and Write Zeroes not aligned to the block size.
    fn rmw(&self) -> bool {
        self.span > 0 && self.r.command != Command::Read
    }
}

struct Client {
    fd: OwnedFd,
    neg: Negotiated,
    peer: String,
    /// Bytes received and not yet taken: request headers, and the first
    /// bytes of a write's payload (`rx[rx_start..rx_end]`, a buffer of
    /// `RX_LEN` bytes the engine keeps). One receive brings as many headers
    /// as the client has sent.
    rx: RxId,
    rx_start: usize,
    rx_end: usize,
    /// The receive in flight writes into `rx` (else into a payload's buffer).
    recv_into_rx: bool,
    /// The request whose payload is being received, if any.
    receiving: Option<usize>,
    reqs: Vec<Option<Req>>,
    recv_busy: bool,
    /// Replies to send, in a queue the engine keeps.
    tx: TxId,
    send_busy: bool,
    /// No more requests: the client sent DISC, broke the protocol or left.
    closing: bool,
    /// A request header waiting for arena space; nothing more is read meanwhile.
    parked: Option<[u8; REQUEST_LEN]>,
    shut: bool,
    /// Arena bytes its requests hold.
    held: usize,
    /// Since when replies have waited to be sent with none going out.
    stalled_since: Option<std::time::Instant>,
    _seat: Seat,
}

impl Client {
    fn busy(&self) -> bool {
        self.reqs.iter().any(Option::is_some)
    }

    /// Part of a request (header or payload) has arrived, the rest has not.
    fn mid_request(&self) -> bool {
        self.rx_end > self.rx_start || self.receiving.is_some() || self.parked.is_some()
    }

    /// Takes `n` staged bytes; an emptied buffer starts over at its front.
    fn take_staged(&mut self, n: usize) {
        self.rx_start += n;
        if self.rx_start == self.rx_end {
            self.rx_start = 0;
            self.rx_end = 0;
        }
    }
}

/// Serves the NBD clients handed to one engine.
pub struct NbdDriver {
    export: ExportInfo,
    /// A client is freed once its receive and send have completed.
    clients: Vec<Option<Client>>,
    incoming: Receiver<NewClient>,
    stop: Arc<AtomicBool>,
    /// The association is gone for good: fail what waits for it.
    give_up: Arc<AtomicBool>,
    queued: VecDeque<(usize, usize)>,
    /// Writes in progress, by block span: (client, request, first byte, end).
    writing: Vec<(usize, usize, u64, u64)>,
    /// Requests waiting for an overlapping read-modify-write to finish.
    blocked: Vec<(usize, usize)>,
    /// When the stop was first seen; clients get a grace period to finish
    /// sending a request they started.
    stop_seen: Option<std::time::Instant>,
    sent: Vec<u64>,
}

/// How long a stopping export waits for clients to finish sending a request.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

fn token(client: usize, send: bool) -> u32 {
    (client as u32) << 1 | send as u32
}

fn tag(client: usize, req: usize) -> u64 {
    (client as u64) << 32 | req as u64
}

impl NbdDriver {
    /// A driver for the clients that come through `incoming`; it ends
    /// once `stop` is set and its clients are gone. Once `give_up` is set,
    /// requests waiting for a lost association fail.
    pub fn new(
        export: ExportInfo,
        incoming: Receiver<NewClient>,
        stop: Arc<AtomicBool>,
        give_up: Arc<AtomicBool>,
    ) -> NbdDriver {
        NbdDriver {
            export,
            clients: Vec::new(),
            incoming,
            stop,
            give_up,
            queued: VecDeque::new(),
            writing: Vec::new(),
            blocked: Vec::new(),
            stop_seen: None,
            sent: Vec::new(),
        }
    }

    fn block(&self) -> u64 {
        self.export.ns.block_size as u64
    }

    fn adopt(&mut self, cx: &mut Cx) {
        while let Ok(n) = self.incoming.try_recv() {
            let c = Client {
                fd: n.fd,
                neg: n.negotiated,
                peer: n.peer,
                rx: cx.rx_open(RX_LEN),
                rx_start: 0,
                rx_end: 0,
                recv_into_rx: false,
                receiving: None,
                reqs: (0..MAX_REQUESTS).map(|_| None).collect(),
                recv_busy: false,
                tx: cx.tx_open(),
                send_busy: false,
                closing: false,
                parked: None,
                shut: false,
                held: 0,
                stalled_since: None,
                _seat: n.seat,
            };
            tracing::info!(peer = %c.peer, structured = c.neg.structured_replies, "NBD client connected");
            match self.clients.iter().position(Option::is_none) {
                Some(i) => self.clients[i] = Some(c),
                None => self.clients.push(Some(c)),
            }
        }
    }
}

impl Driver for NbdDriver {
    fn pump(&mut self, cx: &mut Cx) -> bool {
        let stopping = self.stop.load(Ordering::Acquire);
        if !stopping {
            self.adopt(cx);
        } else if self.stop_seen.is_none() {
            self.stop_seen = Some(std::time::Instant::now());
        }
        let grace_over = self.stop_seen.is_some_and(|t| t.elapsed() > STOP_GRACE);
        self.submit_queued(cx);
        for ci in 0..self.clients.len() {
            if let Some(hdr) = self.clients[ci].as_ref().and_then(|c| c.parked) {
                if self.on_request(ci, &hdr, cx) {
                    if let Some(c) = self.clients[ci].as_mut() {
                        c.parked = None;
                    }
                }
            }
            // Headers that waited for a free request slot or for the parked one.
            self.drain_rx(ci, cx);
            let Some(c) = self.clients[ci].as_mut() else {
                continue;
            };
            if stopping && !c.closing {
                c.closing = true;
            }
            let idle = !c.busy() && !c.mid_request() && cx.tx_is_empty(&c.tx) && !c.send_busy;
            if c.closing && (idle || grace_over) {
                if grace_over && !idle {
                    tracing::warn!(peer = %c.peer, "NBD client did not finish its request in time; closing");
                }
                self.close(ci, cx);
            }
            let c = self.clients[ci].as_mut().expect("live client");
            if !c.send_busy && !cx.tx_is_empty(&c.tx) && !c.shut {
                // Payloads are in the arena buffers of requests released
                // only when `tx_advance` returns their tokens.
                cx.send(c.fd.as_raw_fd(), &c.tx, token(ci, true));
                c.send_busy = true;
                c.stalled_since.get_or_insert_with(std::time::Instant::now);
            }
            if !c.shut {
                self.post_recv(ci, cx);
            }
            let c = self.clients[ci].as_ref().expect("live client");
            if c.shut && !c.recv_busy && !c.send_busy && !c.busy() {
                tracing::debug!(peer = %c.peer, "NBD client released");
                let c = self.clients[ci].take().expect("live client");
                cx.rx_close(c.rx);
                cx.tx_close(c.tx);
            }
        }
        !(stopping && self.clients.iter().all(Option::is_none))
    }

    fn on_done(&mut self, done: Done, cx: &mut Cx) {
        let (ci, ri) = ((done.tag >> 32) as usize, (done.tag & 0xffff_ffff) as usize);
        let Some(req) = self
            .clients
            .get_mut(ci)
            .and_then(Option::as_mut)
            .and_then(|c| c.reqs[ri].as_mut())
        else {
            return;
        };
        let st = done.cqe.status();
        if !st.is_success() {
            let transient =
                st == Status::TRANSIENT_TRANSPORT_ERROR || (st.sct == 0 && st.sc == 0x22);
            if transient && !self.give_up.load(Ordering::Acquire) && req.attempts < MAX_ATTEMPTS {
                req.retry = true;
            } else if req.error == 0 {
                tracing::warn!(command = ?req.r.command, offset = req.r.offset, "NVMe command failed: {st}");
                req.error = errno::EIO;
            }
        }
        req.parts_left -= 1;
        if req.parts_left > 0 {
            return; // more commands in flight
        }
        if req.retry {
            // Once the connection is back (or at once, for a transient
            // error on a live one), the whole step runs again.
            req.retry = false;
            req.attempts += 1;
            req.submitted = 0;
            if !self.queued.contains(&(ci, ri)) {
                self.queued.push_back((ci, ri));
            }
            return;
        }
        if self.queued.contains(&(ci, ri)) {
            return; // more commands to submit
        }
        if req.stage == Stage::EdgeRead && req.error == 0 {
            let r = self.clients[ci]
                .as_ref()
                .and_then(|c| c.reqs[ri].as_ref())
                .expect("request");
            self.merge_edges(r, cx);
            let req = self.clients[ci]
                .as_mut()
                .and_then(|c| c.reqs[ri].as_mut())
                .expect("request");
            req.stage = Stage::Queued;
            req.submitted = 0;
            self.queued.push_back((ci, ri));
            return;
        }
        self.reply(ci, ri, cx);
    }

    /// Closes clients that have not taken their replies within
    /// `SEND_TIMEOUT`: what they hold goes back to the others.
    fn on_tick(&mut self, cx: &mut Cx) {
        for ci in 0..self.clients.len() {
            let stuck = self.clients[ci].as_ref().is_some_and(|c| {
                !c.shut && c.stalled_since.is_some_and(|t| t.elapsed() > SEND_TIMEOUT)
            });
            if stuck {
                let c = self.clients[ci].as_ref().expect("live client");
                tracing::warn!(peer = %c.peer, "NBD client did not read its replies within {}s; closing", SEND_TIMEOUT.as_secs());
                self.close(ci, cx);
            }
        }
    }

    fn on_op(&mut self, token: u32, res: i32, cx: &mut Cx) {
        let ci = (token >> 1) as usize;
        if self.clients.get(ci).is_none_or(Option::is_none) {
            return;
        }
        if token & 1 == 1 {
            self.on_send(ci, res, cx);
        } else {
            self.on_recv(ci, res, cx);
        }
    }

    fn ops_in_flight(&self) -> usize {
        self.clients
            .iter()
            .flatten()
            .map(|c| c.recv_busy as usize + c.send_busy as usize)
            .sum()
    }
}
