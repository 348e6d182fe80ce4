//! Taking requests in: receives of request headers and write payloads, and
//! the requests they carry.

use super::{token, NbdDriver, Req, Stage, CLIENT_SHARE};
use crate::frontend::nbd::proto::{self, errno, Command, Request, REQUEST_LEN};
use crate::host::engine::Cx;
use rdmablk_common::mem::capacity_for;
use std::os::fd::AsRawFd;

impl NbdDriver {
    /// Starts the next receive of a client: header bytes or payload.
    pub(super) fn post_recv(&mut self, ci: usize, cx: &mut Cx) {
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
                        Some(cx.data(b, at, req.r.length as usize - req.got))
                    }
                    _ => None,
                }
            }
            Some(_) => return, // staged bytes are taken first (drain_rx)
            None => None,
        };
        let fd = c.fd.as_raw_fd();
        match direct {
            // The request keeps its buffer until this receive completes.
            Some(data) => {
                c.recv_into_rx = false;
                cx.recv_data(fd, data, token(ci, false));
            }
            None => {
                let free_slot = c.reqs.iter().any(Option::is_none);
                let whole_header = c.rx_end - c.rx_start >= REQUEST_LEN;
                if c.receiving.is_none() && (!free_slot || whole_header) {
                    return; // a request must finish, or drain_rx take what is here
                }
                if c.rx_start > 0 {
                    cx.rx(&c.rx).copy_within(c.rx_start..c.rx_end, 0);
                    c.rx_end -= c.rx_start;
                    c.rx_start = 0;
                }
                c.recv_into_rx = true;
                cx.recv(fd, &c.rx, c.rx_end, token(ci, false));
            }
        }
        c.recv_busy = true;
    }

    pub(super) fn on_recv(&mut self, ci: usize, res: i32, cx: &mut Cx) {
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
    pub(super) fn drain_rx(&mut self, ci: usize, cx: &mut Cx) {
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
                    let (rx, arena) = cx.rx_and_arena(&c.rx);
                    arena.write(b, at, &rx[c.rx_start..c.rx_start + k]);
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
            hdr.copy_from_slice(&cx.rx(&c.rx)[c.rx_start..c.rx_start + REQUEST_LEN]);
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
    pub(super) fn on_request(&mut self, ci: usize, hdr: &[u8; REQUEST_LEN], cx: &mut Cx) -> bool {
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
}
