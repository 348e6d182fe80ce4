//! The NVMe/TCP connections of one poller, as it drives them.

use super::connection::TcpQueue;
use super::listener::Accepted;
use super::RECV;
use crate::engine::poller::{Endpoint, Io};
use crate::engine::queue;
use crate::engine::ready::Ready;
use std::any::Any;

/// The NVMe/TCP connections of one poller.
pub(super) struct TcpEndpoint {
    ep: u8,
    queues: Vec<Option<Box<TcpQueue>>>,
    /// The queues the next pump looks at.
    ready: Ready,
    /// Scratch: this pump's.
    round: Vec<u32>,
}

impl TcpEndpoint {
    pub(super) fn new(ep: u8) -> TcpEndpoint {
        TcpEndpoint {
            ep,
            queues: Vec::new(),
            ready: Ready::default(),
            round: Vec::new(),
        }
    }

    /// Queue `idx`, which had an event: it is pumped next.
    fn queue(&mut self, idx: u32) -> Option<&mut TcpQueue> {
        self.ready.mark(idx);
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
                self.ready.mark(idx as u32);
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
        self.ready.mark_all();
    }

    fn pump(&mut self, io: &mut Io) -> usize {
        if io.stopping {
            self.ready.mark_all();
        }
        self.ready.take(self.queues.len(), &mut self.round);
        let mut freed = 0;
        for &idx in &self.round {
            let slot = &mut self.queues[idx as usize];
            let Some(c) = slot else { continue };
            c.pump(io);
            if c.q.can_free(&c.w) {
                c.q.teardown(io);
                *slot = None;
                freed += 1;
            } else if !c.quiet() {
                self.ready.mark(idx);
            }
        }
        freed
    }

    fn queues(&self) -> usize {
        self.queues.iter().flatten().count()
    }

    fn backend_ops(&self) -> usize {
        self.queues
            .iter()
            .flatten()
            .map(|c| c.q.backend_ops())
            .sum()
    }

    fn close_all(&mut self, why: &str) {
        for c in self.queues.iter_mut().flatten() {
            c.close(why);
        }
        self.ready.mark_all();
    }
}
