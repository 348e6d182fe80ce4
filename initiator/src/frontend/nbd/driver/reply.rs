//! Answering requests and letting go of them: replies and their sends,
//! freeing requests, and ending clients.

use super::{tag, NbdDriver, Stage, MAX_REQUESTS};
use crate::frontend::nbd::proto::{self, Command};
use crate::host::engine::Cx;
use nix::sys::socket::{shutdown, Shutdown};
use std::os::fd::AsRawFd;

impl NbdDriver {
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
    pub(super) fn reply(&mut self, ci: usize, ri: usize, cx: &mut Cx) {
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
                let mut head = cx.tx_buf(&c.tx);
                head.extend_from_slice(&proto::simple_reply(req.error, cookie));
                head
            };
            cx.tx_push(&c.tx, bytes, t);
        } else if req.r.command == Command::Read && req.r.length > 0 {
            let b = req.buf.as_ref().expect("read buffer");
            let body = cx.data(b, (req.r.offset - req.base) as usize, req.r.length as usize);
            let mut head = cx.tx_buf(&c.tx);
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
            cx.tx_push_data(&c.tx, head, body, t);
        } else {
            let mut head = cx.tx_buf(&c.tx);
            if req.r.command == Command::Read && c.neg.structured_replies {
                head.extend_from_slice(&proto::structured_done(cookie));
            } else {
                head.extend_from_slice(&proto::simple_reply(0, cookie));
            }
            cx.tx_push(&c.tx, head, t);
        }
    }

    pub(super) fn on_send(&mut self, ci: usize, res: i32, cx: &mut Cx) {
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
        cx.tx_advance(&c.tx, res as usize, &mut sent);
        // Replies moved: the clock restarts, or stops when all went out.
        c.stalled_since = (!cx.tx_is_empty(&c.tx)).then(std::time::Instant::now);
        for t in sent.drain(..) {
            self.release(ci, (t & 0xffff_ffff) as usize, cx);
        }
        self.sent = sent;
    }

    /// Ends a client: the socket is shut down, requests not at the NVMe
    /// queue are dropped, and the rest are released as they complete.
    pub(super) fn close(&mut self, ci: usize, cx: &mut Cx) {
        let c = self.clients[ci].as_mut().expect("live client");
        c.closing = true;
        if c.shut {
            return;
        }
        c.shut = true;
        c.receiving = None;
        let _ = shutdown(c.fd.as_raw_fd(), Shutdown::Both);
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
    pub(super) fn release_idle(&mut self, ci: usize, cx: &mut Cx) {
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
        let unsent = std::mem::replace(&mut c.tx, cx.tx_open());
        let mut sent = std::mem::take(&mut self.sent);
        cx.tx_advance(&unsent, usize::MAX / 2, &mut sent);
        cx.tx_close(unsent);
        for ri in sent.drain(..).map(|t| (t & 0xffff_ffff) as usize) {
            self.release(ci, ri, cx);
        }
        self.sent = sent;
    }
}
