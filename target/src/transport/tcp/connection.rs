//! One NVMe/TCP connection: its queue and wire, their receives and sends,
//! and its own deadlines and drain.

use super::listener::Accepted;
use super::wire::TcpWire;
use super::{Phase, NO_SLOT, RECV, SEND};
use crate::base::admission::Silent;
use crate::engine::binding::Binding;
use crate::engine::poller::{Io, Token};
use crate::engine::queue::{Queue, Wire};
use crate::nvme::port::Arrival;
use io_uring::opcode;
use rdmablk_common::tcp::stream::Received;
use std::time::Duration;

/// A connection that was sent a TermReq is closed after this time at most.
const TERMINATE_GRACE: Duration = Duration::from_secs(1);
/// A closed connection whose socket operations have not ended after this
/// time has them cancelled.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// One NVMe/TCP connection: one queue (admin or I/O) of a controller.
pub(super) struct TcpQueue {
    /// Until its ICReq: a newcomer may push it out (`base::admission`).
    /// Before `w`: dropped first, so that its hang-up never names a closed
    /// descriptor.
    pub(super) silent: Option<Silent>,
    pub(super) q: Queue,
    pub(super) w: TcpWire,
}

impl TcpQueue {
    /// A new connection, holding one of the places of connections waiting
    /// for their Connect.
    pub(super) fn new(c: Accepted, ep: u8, idx: u32) -> std::io::Result<Self> {
        // Before the socket moves: a failure drops `c` (its `silent` first).
        let inbound = TcpWire::inbound()?;
        let _ = c.sock.set_nodelay(true);
        let (records, tls) = c.tls.map_or((None, None), |(r, p)| (r, Some(p)));
        let arrival = Arrival {
            ana: c.ana,
            local: c.sock.local_addr().ok().map(|a| a.ip()),
            tls,
        };
        Ok(TcpQueue {
            silent: c.silent,
            q: Queue::new(Binding::new(c.pending), c.peer.to_string(), ep, idx, 0),
            w: TcpWire::new(c.sock, inbound, records, arrival, ep, idx),
        })
    }

    pub(super) fn close(&mut self, why: &str) {
        self.q.close(&mut self.w, why);
    }

    /// Periodic checks of every deadline: the handshake and a TermReq's
    /// grace, those of a live queue (Connect, keep-alive and enable, R2T
    /// data, send progress: see `Queue::check_deadlines`), and the
    /// cancellation of socket operations that outlive a close.
    pub(super) fn on_tick(&mut self, io: &mut Io) {
        let limits = &io.registry.admission.limits;
        match self.w.phase {
            Phase::Handshake if self.w.since.elapsed() > limits.handshake_timeout => {
                self.close("no ICReq within limits.handshake_timeout")
            }
            Phase::Terminating if self.w.since.elapsed() > TERMINATE_GRACE => {
                self.close("terminated")
            }
            Phase::Live => self.q.check_deadlines(&mut self.w, limits),
            Phase::Closing if !self.w.cancelled && self.w.since.elapsed() > CANCEL_GRACE => {
                // The shutdown should have ended them; make sure.
                let stream = &self.w.stream;
                let ops = [(stream.receiving(), RECV), (stream.sending(), SEND)];
                for (busy, what) in ops {
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
    pub(super) fn pump(&mut self, io: &mut Io) {
        let live = |p| matches!(p, Phase::Handshake | Phase::Live);
        if live(self.w.phase) {
            self.q.pump(io, &mut self.w);
            self.process_rx(io);
        }
        if live(self.w.phase) {
            self.w.start_recv(io);
        }
        if self.w.phase != Phase::Closing {
            self.w.start_send(io);
        }
        let drained = self.w.drained();
        if self.w.phase == Phase::Terminating && drained {
            self.close("terminated after a protocol error");
        }
        // The target's shutdown closes a connection once its stream is drained.
        self.q.close_when_done(&mut self.w, io.stopping && drained);
    }

    /// Whether the connection waits only for its host (the poller need not
    /// pump it until an event: `engine::ready`): in its handshake or live,
    /// its stream and its queue quiet.
    pub(super) fn quiet(&self) -> bool {
        matches!(self.w.phase, Phase::Handshake | Phase::Live)
            && self.w.stream.quiet()
            && self.q.quiet()
    }

    pub(super) fn on_recv(&mut self, res: i32) {
        let received = self.w.stream.received(res);
        if self.w.phase == Phase::Closing {
            return;
        }
        match received {
            Received::Bytes => {}
            Received::Closed => self.close("host closed the connection"),
            Received::Failed(e) => self.close(&format!("receive failed: {e}")),
        }
    }

    pub(super) fn on_send(&mut self, res: i32, io: &mut Io) {
        let mut sent = std::mem::take(&mut self.w.sent_slots);
        match self.w.stream.sent(res, &mut sent) {
            Err(e) => self.close(&format!("send failed: {e}")),
            Ok(n) => {
                if n > 0 {
                    let more = !self.w.stream.outbound.is_empty();
                    self.w.sends.progressed(more);
                }
                for token in sent.drain(..) {
                    let slot = (token != NO_SLOT).then_some(token as u16);
                    self.q.sent(slot, io);
                }
            }
        }
        self.w.sent_slots = sent;
    }
}
