//! The transmission phase of NBD on an engine thread: requests are read from
//! each client socket through the engine's io_uring (payloads straight into
//! arena buffers), turned into NVMe commands on the engine's I/O queue, and
//! answered from the same buffers. Requests that are not aligned to the
//! namespace's blocks are served by read-modify-write.

use super::greeter::Seat;
use super::handshake::Negotiated;
use super::proto::{self, errno, flags, Command, Request, REQUEST_LEN};
use crate::host::block::{self, DSM_RANGE_LEN};
use crate::host::engine::{Cx, Driver};
use crate::host::Done;
use crate::host::NamespaceInfo;
use io_uring::{opcode, types};
use rdmablk_common::mem::{capacity_for, Arena, ArenaBuf};
use rdmablk_common::nvme::{nvm, Status};
use rdmablk_common::tcp::stream::TxQueue;
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
    pub ns: NamespaceInfo,
    /// Largest request accepted (NBD maximum block size).
    pub max_block: u32,
    /// Largest transfer of one NVMe command.
    pub max_transfer: usize,
}

/// A new client that finished its handshake.
pub struct NewClient {
    pub fd: OwnedFd,
    pub negotiated: Negotiated,
    pub peer: String,
    /// Its place among the export's clients, held until it is freed.
    pub seat: Seat,
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
    /// bytes of a write's payload (`rx[rx_start..rx_end]`). One receive
    /// brings as many headers as the client has sent.
    rx: [u8; RX_LEN],
    rx_start: usize,
    rx_end: usize,
    /// The receive in flight writes into `rx` (else into a payload's buffer).
    recv_into_rx: bool,
    /// The request whose payload is being received, if any.
    receiving: Option<usize>,
    reqs: Vec<Option<Req>>,
    recv_busy: bool,
    tx: TxQueue,
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

    /// Bytes received and not yet taken.
    fn staged(&self) -> &[u8] {
        &self.rx[self.rx_start..self.rx_end]
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
    /// Boxed: a client's receive writes into its `rx` while the table may
    /// grow; a box keeps it at one address until the client is freed, which
    /// waits for its receive and send to complete.
    clients: Vec<Option<Box<Client>>>,
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

    fn adopt(&mut self) {
        while let Ok(n) = self.incoming.try_recv() {
            let c = Box::new(Client {
                fd: n.fd,
                neg: n.negotiated,
                peer: n.peer,
                rx: [0; RX_LEN],
                rx_start: 0,
                rx_end: 0,
                recv_into_rx: false,
                receiving: None,
                reqs: (0..MAX_REQUESTS).map(|_| None).collect(),
                recv_busy: false,
                tx: TxQueue::default(),
                send_busy: false,
                closing: false,
                parked: None,
                shut: false,
                held: 0,
                stalled_since: None,
                _seat: n.seat,
            });
            tracing::info!(peer = %c.peer, structured = c.neg.structured_replies, "NBD client connected");
            match self.clients.iter().position(Option::is_none) {
                Some(i) => self.clients[i] = Some(c),
                None => self.clients.push(Some(c)),
            }
        }
    }

    /// Starts the next receive of a client: header bytes or payload.
    fn post_recv(&mut self, ci: usize, cx: &mut Cx) {
        let c = self.clients[ci].as_mut().expect("live client");
        // A closing client may still finish sending the request it started.
        if c.recv_busy || c.parked.is_some() || (c.closing && !c.mid_request()) {
            return;
        }
        // A payload whose start is not waiting in `rx` goes straight into
        // its buffer; everything else (headers, discarded payloads) into `rx`.
        let direct = match c.receiving {
            Some(ri) if c.rx_end == c.rx_start => {
                let req = c.reqs[ri].as_ref().expect("receiving request");
                match (&req.buf, req.stage) {
                    (Some(b), Stage::Payload) => {
                        let at = (req.r.offset - req.base) as usize + req.got;
                        Some((cx.arena.addr(b, at), req.r.length as usize - req.got))
                    }
                    _ => None,
                }
            }
            Some(_) => return, // staged bytes are taken first (drain_rx)
            None => None,
        };
        let (ptr, len) = match direct {
            Some(d) => d,
            None => {
                let free_slot = c.reqs.iter().any(Option::is_none);
                let whole_header = c.rx_end - c.rx_start >= REQUEST_LEN;
                if c.receiving.is_none() && (!free_slot || whole_header) {
                    return; // a request must finish, or drain_rx take what is here
                }
                if c.rx_start > 0 {
                    c.rx.copy_within(c.rx_start..c.rx_end, 0);
                    c.rx_end -= c.rx_start;
                    c.rx_start = 0;
                }
                (c.rx[c.rx_end..].as_mut_ptr(), RX_LEN - c.rx_end)
            }
        };
        c.recv_into_rx = direct.is_none();
        let e = opcode::Recv::new(types::Fd(c.fd.as_raw_fd()), ptr, len as u32).build();
        // SAFETY: the receive writes into the boxed client's `rx` (its free
        // tail) or into the arena buffer of the request whose payload it is;
        // the request keeps its buffer and the client stays in its box until
        // `recv_busy` is cleared by this receive's completion, and nothing
        // moves `rx` meanwhile (compaction happens only before a receive).
        unsafe { cx.submit(e, token(ci, false)) };
        c.recv_busy = true;
    }

    fn on_recv(&mut self, ci: usize, res: i32, cx: &mut Cx) {
        let c = self.clients[ci].as_mut().expect("live client");
        c.recv_busy = false;
        if c.shut {
            return self.release_idle(ci, cx);
        }
        if res <= 0 {
            if !c.closing {
                let mid = c.mid_request();
                let why = if res == 0 {
                    "closed the connection".to_string()
                } else {
                    std::io::Error::from_raw_os_error(-res).to_string()
                };
                if mid || res < 0 {
                    tracing::warn!(peer = %c.peer, "NBD client left mid-request: {why}");
                } else {
                    tracing::info!(peer = %c.peer, "NBD client disconnected");
                }
            }
            self.close(ci, cx);
            return;
        }
        let n = res as usize;
        if c.recv_into_rx {
            c.rx_end += n;
        } else {
            let ri = c.receiving.expect("a payload receive has its request");
            let req = c.reqs[ri].as_mut().expect("receiving request");
            req.got += n;
            if req.got == req.r.length as usize {
                c.receiving = None;
                self.start(ci, ri, cx);
            }
        }
        self.drain_rx(ci, cx);
    }

    /// Takes what `rx` holds: the rest of the payload being received, then
    /// whole request headers while a request slot is free. Stops at a
    /// request that must wait for arena space (the client is parked).
    fn drain_rx(&mut self, ci: usize, cx: &mut Cx) {
        loop {
            let Some(c) = self.clients[ci].as_mut() else {
                return;
            };
            if c.shut || c.closing || c.parked.is_some() || c.rx_end == c.rx_start {
                return;
            }
            if let Some(ri) = c.receiving {
                let req = c.reqs[ri].as_mut().expect("receiving request");
                let k = (req.r.length as usize - req.got).min(c.rx_end - c.rx_start);
                if let (Some(b), Stage::Payload) = (&req.buf, req.stage) {
                    let at = (req.r.offset - req.base) as usize + req.got;
                    cx.arena.write(b, at, &c.rx[c.rx_start..c.rx_start + k]);
                }
                req.got += k;
                let done = req.got == req.r.length as usize;
                let discard = req.stage == Stage::Discard;
                c.take_staged(k);
                if !done {
                    return;
                }
                c.receiving = None;
                if discard {
                    self.reply(ci, ri, cx);
                } else {
                    self.start(ci, ri, cx);
                }
                continue;
            }
            if c.rx_end - c.rx_start < REQUEST_LEN || c.reqs.iter().all(Option::is_some) {
                return;
            }
            let mut hdr = [0u8; REQUEST_LEN];
            hdr.copy_from_slice(&c.staged()[..REQUEST_LEN]);
            c.take_staged(REQUEST_LEN);
            if !self.on_request(ci, &hdr, cx) {
                if let Some(c) = self.clients[ci].as_mut() {
                    c.parked = Some(hdr);
                }
                return;
            }
        }
    }

    /// Takes a request whose header arrived. Returns false when it must wait
    /// for arena space (the client is parked with its header).
    fn on_request(&mut self, ci: usize, hdr: &[u8; REQUEST_LEN], cx: &mut Cx) -> bool {
        let export = self.export;
        let c = self.clients[ci].as_mut().expect("live client");
        let r = match Request::parse(hdr) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(peer = %c.peer, "NBD protocol error: {e}; closing");
                self.close(ci, cx);
                return true;
            }
        };
        if r.command == Command::Disc {
            c.closing = true;
            return true;
        }
        let ri = c
            .reqs
            .iter()
            .position(Option::is_none)
            .expect("post_recv waits for a free request");
        let size = export.ns.size_bytes();
        let mut err = proto::validate(&r, size, c.neg.transmission_flags, export.max_block).err();
        let block = export.ns.block_size as u64;
        let end = r.offset.saturating_add(r.length as u64);
        let aligned = r.offset.is_multiple_of(block) && end.is_multiple_of(block);
        let covering = || {
            let base = r.offset / block * block;
            (base, (end.next_multiple_of(block) - base) as usize)
        };
        // Only a request within the export is rounded out to blocks (its end
        // cannot overflow then).
        let (base, span) = match r.command {
            Command::Read | Command::Write if err.is_none() => covering(),
            // Zeroes that do not cover whole blocks are written as zeroes.
            Command::WriteZeroes if !aligned && err.is_none() => {
                if r.length > export.max_block {
                    err = Some(errno::EINVAL);
                }
                covering()
            }
            _ => (r.offset, 0),
        };
        let mut req = Req {
            r,
            stage: Stage::Queued,
            buf: None,
            base,
            span,
            got: 0,
            submitted: 0,
            rmw_unaligned: false,
            retry: false,
            attempts: 0,
            parts_left: 0,
            error: err.unwrap_or(0),
        };
        if err.is_none() && span > 0 {
            // Unaligned writes need room for two edge blocks after the span.
            let edges = if aligned { 0 } else { 2 * block as usize };
            // Within the client's share of the arena (at least one request
            // at a time): past it, it waits for its own replies to go.
            let cap = capacity_for(span + edges);
            if c.held > 0 && c.held + cap > cx.arena.len() / CLIENT_SHARE {
                return false;
            }
            let Some(b) = cx.arena.alloc(span + edges) else {
                return false; // no room now: retried as buffers free up
            };
            c.held += b.capacity();
            if r.command == Command::WriteZeroes {
                let at = (r.offset - base) as usize;
                cx.arena.fill(&b, at, r.length as usize, 0);
            }
            req.buf = Some(b);
        }
        let has_payload = r.payload_len() > 0;
        req.stage = match (has_payload, req.error) {
            (true, 0) => Stage::Payload,
            (true, _) => Stage::Discard,
            _ => Stage::Queued,
        };
        c.reqs[ri] = Some(req);
        if has_payload {
            c.receiving = Some(ri);
        } else if err.is_some() || c.reqs[ri].as_ref().is_some_and(|q| q.error != 0) {
            self.reply(ci, ri, cx);
        } else {
            self.start(ci, ri, cx);
        }
        true
    }

    /// Moves a received request on: edge reads for unaligned writes, else its commands.
    fn start(&mut self, ci: usize, ri: usize, cx: &mut Cx) {
        let block = self.block();
        let c = self.clients[ci].as_ref().expect("live client");
        let req = c.reqs[ri].as_ref().expect("request");
        let unaligned = !req.r.offset.is_multiple_of(block)
            || !(req.r.offset + req.r.length as u64).is_multiple_of(block);
        let rmw = req.rmw() && unaligned;
        let writes = matches!(
            req.r.command,
            Command::Write | Command::WriteZeroes | Command::Trim
        );
        if writes {
            // A read-modify-write rewrites whole blocks: it must not overlap
            // another write in progress, nor another write overlap it.
            let (s, e) = if req.span > 0 {
                (req.base, req.base + req.span as u64)
            } else {
                let end = req.r.offset + req.r.length as u64;
                (req.r.offset / block * block, end.next_multiple_of(block))
            };
            let conflict = self.writing.iter().any(|&(wc, wr, ws, we)| {
                let other_rmw = self.clients[wc]
                    .as_ref()
                    .and_then(|c| c.reqs[wr].as_ref())
                    .is_some_and(|o| o.rmw_unaligned);
                ws < e && s < we && (rmw || other_rmw)
            });
            if conflict {
                self.blocked.push((ci, ri));
                return;
            }
            self.writing.push((ci, ri, s, e));
        }
        let req = self.clients[ci]
            .as_mut()
            .and_then(|c| c.reqs[ri].as_mut())
            .expect("request");
        req.rmw_unaligned = rmw;
        req.stage = if rmw { Stage::EdgeRead } else { Stage::Queued };
        req.submitted = 0;
        self.queued.push_back((ci, ri));
        self.submit_queued(cx);
    }

    /// The NVMe commands a request needs now: (opcode, byte offset, bytes,
    /// buffer offset, fua/deallocate flag).
    fn plan(&self, req: &Req) -> Vec<(u8, u64, u64, usize, bool)> {
        let block = self.block();
        let mt = self.export.max_transfer as u64;
        let split = |op: u8, off: u64, len: u64, at: usize, flag: bool, max: u64| {
            let mut v = Vec::new();
            let mut done = 0;
            while done < len {
                let n = (len - done).min(max);
                v.push((op, off + done, n, at + done as usize, flag));
                done += n;
            }
            v
        };
        let r = &req.r;
        match (r.command, req.stage) {
            (Command::Read, _) => split(nvm::READ, req.base, req.span as u64, 0, false, mt),
            (Command::Write | Command::WriteZeroes, Stage::EdgeRead) => {
                // Read the partial head and tail blocks into the spare area
                // after the span.
                let mut v = Vec::new();
                let end = r.offset + r.length as u64;
                if !r.offset.is_multiple_of(block) {
                    v.push((nvm::READ, req.base, block, req.span, false));
                }
                let tail = end / block * block;
                if !end.is_multiple_of(block)
                    && (tail != req.base || r.offset.is_multiple_of(block))
                {
                    v.push((nvm::READ, tail, block, req.span + block as usize, false));
                }
                v
            }
            (Command::Write, _) | (Command::WriteZeroes, _) if req.rmw() => split(
                nvm::WRITE,
                req.base,
                req.span as u64,
                0,
                r.flags & flags::FUA != 0,
                mt,
            ),
            (Command::Flush, _) => vec![(nvm::FLUSH, 0, 0, 0, false)],
            (Command::WriteZeroes, _) => {
                let dealloc = r.flags & flags::NO_HOLE == 0 && self.export.ns.deallocate_zeroes;
                let (s, e) = (
                    r.offset.next_multiple_of(block),
                    (r.offset + r.length as u64) / block * block,
                );
                if s < e {
                    split(
                        nvm::WRITE_ZEROES,
                        s,
                        e - s,
                        0,
                        dealloc,
                        MAX_ZEROES_BLOCKS * block,
                    )
                } else {
                    Vec::new()
                }
            }
            (Command::Trim, _) => {
                let (s, e) = (
                    r.offset.next_multiple_of(block),
                    (r.offset + r.length as u64) / block * block,
                );
                if s < e {
                    split(nvm::DSM, s, e - s, 0, true, u32::MAX as u64 / block * block)
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        }
    }

    /// Submits the commands of queued requests as queue slots allow; a
    /// request with more commands than free slots goes out in batches.
    fn submit_queued(&mut self, cx: &mut Cx) {
        while let Some(&(ci, ri)) = self.queued.front() {
            let Some(req) = self
                .clients
                .get(ci)
                .and_then(Option::as_ref)
                .and_then(|c| c.reqs[ri].as_ref())
            else {
                self.queued.pop_front();
                continue;
            };
            let plan = self.plan(req);
            if plan.is_empty() {
                self.queued.pop_front();
                self.reply(ci, ri, cx);
                continue;
            }
            if cx.queue.failed().is_some() {
                if !self.give_up.load(Ordering::Acquire) {
                    return; // wait for the association to come back
                }
                self.queued.pop_front();
                let req = self.clients[ci]
                    .as_mut()
                    .and_then(|c| c.reqs[ri].as_mut())
                    .expect("request");
                req.error = errno::EIO;
                if req.parts_left == 0 {
                    self.reply(ci, ri, cx);
                }
                continue;
            }
            let is_trim = req.r.command == Command::Trim;
            if is_trim && req.buf.is_none() {
                // The DSM ranges, 16 bytes each, live in the arena with the request.
                let Some(b) = cx.arena.alloc(DSM_RANGE_LEN * plan.len()) else {
                    return;
                };
                let c = self.clients[ci].as_mut().expect("live client");
                c.held += b.capacity();
                let req = c.reqs[ri].as_mut().expect("request");
                req.buf = Some(b);
            }
            let free = cx.queue.free_slots();
            let req = self.clients[ci]
                .as_mut()
                .and_then(|c| c.reqs[ri].as_mut())
                .expect("request");
            let batch = (plan.len() - req.submitted).min(free);
            if batch == 0 {
                return; // completions free slots; pump retries
            }
            let first = req.submitted;
            req.submitted += batch;
            req.parts_left += batch;
            if req.submitted == plan.len() {
                self.queued.pop_front();
            }
            if req.stage == Stage::Queued {
                req.stage = Stage::Io;
            }
            let block = self.export.ns.block_size as u64;
            let nsid = self.export.ns.nsid;
            let buf = req.buf.as_ref();
            for (i, &(op, off, len, at, flag)) in plan.iter().enumerate().skip(first).take(batch) {
                let lba = off / block;
                let (ptr, bytes, to_host) = match op {
                    nvm::READ | nvm::WRITE => {
                        let b = buf.expect("data request has a buffer");
                        (cx.arena.addr(b, at), len as usize, op == nvm::READ)
                    }
                    nvm::DSM => {
                        let b = buf.expect("allocated above");
                        let mut range = [0u8; DSM_RANGE_LEN];
                        block::dsm_range(&mut range, lba, (len / block) as u32);
                        cx.arena.write(b, i * DSM_RANGE_LEN, &range);
                        (cx.arena.addr(b, i * DSM_RANGE_LEN), DSM_RANGE_LEN, false)
                    }
                    _ => (std::ptr::null_mut(), 0, false),
                };
                let sqe = block::sqe(op, nsid, lba, len / block, flag);
                // SAFETY: the buffers live in the arena until the request is
                // finished, which waits for every command's completion.
                let ok = unsafe { cx.queue.submit(sqe, ptr, bytes, to_host, tag(ci, ri)) };
                debug_assert!(ok, "free slots were checked");
            }
        }
    }

    /// Patches the edge blocks read for an unaligned write around the payload.
    fn merge_edges(&self, req: &Req, cx: &mut Cx) {
        let block = self.block() as usize;
        let b = req.buf.as_ref().expect("write buffer");
        // The edge blocks were read after the span, at `req.span` (head) and
        // `req.span + block` (tail).
        let head = (req.r.offset - req.base) as usize;
        let end = head + req.r.length as usize;
        if !head.is_multiple_of(block) {
            copy_within(cx.arena, b, req.span, 0, head);
        }
        if !end.is_multiple_of(block) {
            let tail = end / block * block;
            let n = req.span - end;
            let from = if tail == 0 && !head.is_multiple_of(block) {
                // Head and tail are the same block: it was read once, into the head slot.
                req.span + end
            } else {
                req.span + block + (end - tail)
            };
            copy_within(cx.arena, b, from, end, n);
        }
    }

    /// Frees a request and its buffer.
    fn release(&mut self, ci: usize, ri: usize, cx: &mut Cx) {
        self.end_write(ci, ri, cx);
        self.queued.retain(|&q| q != (ci, ri));
        self.blocked.retain(|&q| q != (ci, ri));
        let c = self.clients[ci].as_mut().expect("live client");
        if let Some(b) = c.reqs[ri].take().and_then(|mut r| r.buf.take()) {
            c.held -= b.capacity();
            cx.arena.free(b);
        }
    }

    /// A write finished: requests it blocked may start.
    fn end_write(&mut self, ci: usize, ri: usize, cx: &mut Cx) {
        let before = self.writing.len();
        self.writing.retain(|&(wc, wr, _, _)| (wc, wr) != (ci, ri));
        if self.writing.len() != before && !self.blocked.is_empty() {
            for (bc, br) in std::mem::take(&mut self.blocked) {
                if self
                    .clients
                    .get(bc)
                    .and_then(Option::as_ref)
                    .is_some_and(|c| c.reqs[br].is_some())
                {
                    self.start(bc, br, cx);
                }
            }
        }
    }

    /// Queues the reply of a request (and its data for reads).
    fn reply(&mut self, ci: usize, ri: usize, cx: &mut Cx) {
        self.end_write(ci, ri, cx);
        if self.clients[ci].as_ref().is_some_and(|c| c.shut) {
            return self.release(ci, ri, cx);
        }
        let c = self.clients[ci].as_mut().expect("live client");
        let req = c.reqs[ri].as_mut().expect("request");
        req.stage = Stage::Reply;
        let cookie = req.r.cookie;
        let t = Some(tag(ci, ri));
        if req.error != 0 {
            let msg = format!(
                "{:?} of {} bytes at {} failed",
                req.r.command, req.r.length, req.r.offset
            );
            let bytes = if c.neg.structured_replies {
                proto::structured_error(cookie, req.error, &msg)
            } else {
                let mut head = c.tx.buf();
                head.extend_from_slice(&proto::simple_reply(req.error, cookie));
                head
            };
            c.tx.push(bytes, t);
        } else if req.r.command == Command::Read && req.r.length > 0 {
            let b = req.buf.as_ref().expect("read buffer");
            let body = cx.arena.addr(b, (req.r.offset - req.base) as usize);
            let mut head = c.tx.buf();
            if c.neg.structured_replies {
                head.extend_from_slice(&proto::structured_offset_data_header(
                    cookie,
                    req.r.offset,
                    req.r.length,
                    true,
                ));
            } else {
                head.extend_from_slice(&proto::simple_reply(0, cookie));
            }
            c.tx.push_with_body(head, body, req.r.length as usize, None, t);
        } else {
            let mut head = c.tx.buf();
            if req.r.command == Command::Read && c.neg.structured_replies {
                head.extend_from_slice(&proto::structured_done(cookie));
            } else {
                head.extend_from_slice(&proto::simple_reply(0, cookie));
            }
            c.tx.push(head, t);
        }
    }

    fn on_send(&mut self, ci: usize, res: i32, cx: &mut Cx) {
        let c = self.clients[ci].as_mut().expect("live client");
        c.send_busy = false;
        if c.shut {
            return self.drop_unsent(ci, cx);
        }
        if res < 0 {
            if !c.closing {
                tracing::warn!(peer = %c.peer, "NBD client send failed: {}", std::io::Error::from_raw_os_error(-res));
            }
            return self.close(ci, cx);
        }
        let mut sent = std::mem::take(&mut self.sent);
        c.tx.advance(res as usize, &mut sent);
        // Replies moved: the clock restarts, or stops when all went out.
        c.stalled_since = (!c.tx.is_empty()).then(std::time::Instant::now);
        for t in sent.drain(..) {
            self.release(ci, (t & 0xffff_ffff) as usize, cx);
        }
        self.sent = sent;
    }

    /// Ends a client: the socket is shut down, requests not at the NVMe
    /// queue are dropped, and the rest are released as they complete.
    fn close(&mut self, ci: usize, cx: &mut Cx) {
        let c = self.clients[ci].as_mut().expect("live client");
        c.closing = true;
        if c.shut {
            return;
        }
        c.shut = true;
        c.receiving = None;
        // SAFETY: shutdown on a descriptor we own; it only ends the connection.
        unsafe { libc::shutdown(c.fd.as_raw_fd(), libc::SHUT_RDWR) };
        let (recv_busy, send_busy) = (c.recv_busy, c.send_busy);
        // A receive in flight may still write into a payload buffer, and a
        // send in flight still reads the queue's heads and the payloads of
        // the replies in it: what they point to goes once they complete
        // (`on_recv`, `on_send`).
        if !recv_busy {
            self.release_idle(ci, cx);
        }
        if !send_busy {
            self.drop_unsent(ci, cx);
        }
    }

    /// Releases a shut client's requests that are not at the NVMe queue.
    /// Only while no receive is in flight.
    fn release_idle(&mut self, ci: usize, cx: &mut Cx) {
        let c = self.clients[ci].as_ref().expect("live client");
        debug_assert!(!c.recv_busy);
        let idle: Vec<usize> = (0..MAX_REQUESTS)
            .filter(|&ri| {
                c.reqs[ri].as_ref().is_some_and(|r| {
                    matches!(r.stage, Stage::Payload | Stage::Discard | Stage::Queued)
                })
            })
            .collect();
        for ri in idle {
            self.release(ci, ri, cx);
        }
    }

    /// Drops what a shut client had queued to send, releasing the requests
    /// whose replies it held. Only while no send is in flight.
    fn drop_unsent(&mut self, ci: usize, cx: &mut Cx) {
        let c = self.clients[ci].as_mut().expect("live client");
        debug_assert!(!c.send_busy);
        let mut unsent = std::mem::take(&mut c.tx);
        let mut sent = std::mem::take(&mut self.sent);
        unsent.advance(usize::MAX / 2, &mut sent);
        for ri in sent.drain(..).map(|t| (t & 0xffff_ffff) as usize) {
            self.release(ci, ri, cx);
        }
        self.sent = sent;
    }
}

impl Driver for NbdDriver {
    fn pump(&mut self, cx: &mut Cx) -> bool {
        let stopping = self.stop.load(Ordering::Acquire);
        if !stopping {
            self.adopt();
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
            let idle = !c.busy() && !c.mid_request() && c.tx.is_empty() && !c.send_busy;
            if c.closing && (idle || grace_over) {
                if grace_over && !idle {
                    tracing::warn!(peer = %c.peer, "NBD client did not finish its request in time; closing");
                }
                self.close(ci, cx);
            }
            let c = self.clients[ci].as_mut().expect("live client");
            if !c.send_busy && !c.tx.is_empty() && !c.shut {
                let e = opcode::SendMsg::new(types::Fd(c.fd.as_raw_fd()), c.tx.message())
                    .flags(libc::MSG_NOSIGNAL as u32)
                    .build();
                // SAFETY: the message header and iovecs live in the boxed
                // client's TxQueue (its header boxed, its heads heap buffers
                // that do not move with the queue), payloads in the arena
                // buffers of requests released only when `advance` returns
                // their tokens; nothing of it is dropped while `send_busy`.
                unsafe { cx.submit(e, token(ci, true)) };
                c.send_busy = true;
                c.stalled_since.get_or_insert_with(std::time::Instant::now);
            }
            if !c.shut {
                self.post_recv(ci, cx);
            }
            let c = self.clients[ci].as_ref().expect("live client");
            if c.shut && !c.recv_busy && !c.send_busy && !c.busy() {
                tracing::debug!(peer = %c.peer, "NBD client released");
                self.clients[ci] = None;
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

/// Copies `len` bytes of an arena buffer from byte `from` to byte `to`
/// (ranges that do not overlap), through a stack chunk.
fn copy_within(arena: &mut Arena, b: &ArenaBuf, from: usize, to: usize, len: usize) {
    let mut chunk = [0u8; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len());
        arena.read(b, from + done, &mut chunk[..n]);
        arena.write(b, to + done, &chunk[..n]);
        done += n;
    }
}
