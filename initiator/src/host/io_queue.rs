//! An I/O queue over either transport, as the engines drive it.

use super::rdma::RdmaQueue;
use super::tcp::TcpQueue;
use super::HostError;
use io_uring::squeue;
use rdmablk_common::mem::Arena;
use rdmablk_common::nvme::{Cqe, Sqe};

/// A finished command: the caller's tag and the completion entry.
#[derive(Clone, Copy, Debug)]
pub struct Done {
    pub tag: u64,
    pub cqe: Cqe,
}

/// One I/O queue.
pub enum IoQueue {
    Tcp(Box<TcpQueue>),
    Rdma(Box<RdmaQueue>),
}

impl IoQueue {
    /// Makes `arena` usable for this queue's data (registers it with the
    /// RDMA device; nothing to do for NVMe/TCP).
    ///
    /// # Safety
    /// The arena must outlive the queue.
    pub unsafe fn register_arena(&mut self, arena: &Arena) -> Result<(), HostError> {
        match self {
            IoQueue::Tcp(_) => Ok(()),
            // SAFETY: the caller keeps the arena mapped while the queue lives.
            IoQueue::Rdma(q) => unsafe { q.register(arena.base(), arena.len()) },
        }
    }

    /// Commands that can still be submitted.
    pub fn free_slots(&self) -> usize {
        match self {
            IoQueue::Tcp(q) => q.free_slots(),
            IoQueue::Rdma(q) => q.free_slots(),
        }
    }

    /// Why the queue stopped working, if it did.
    pub fn failed(&self) -> Option<&str> {
        match self {
            IoQueue::Tcp(q) => q.failed(),
            IoQueue::Rdma(q) => q.failed(),
        }
    }

    /// Whether completions wait to be taken.
    pub fn has_done(&self) -> bool {
        match self {
            IoQueue::Tcp(q) => q.has_done(),
            IoQueue::Rdma(q) => q.has_done(),
        }
    }

    /// Whether nothing is in flight.
    pub fn idle(&self) -> bool {
        match self {
            IoQueue::Tcp(q) => q.idle(),
            IoQueue::Rdma(q) => q.idle(),
        }
    }

    /// Submits a command moving `len` bytes at `buf` (to the host when
    /// `to_host`). Returns false when no slot is free.
    ///
    /// # Safety
    /// `buf` must stay valid for `len` bytes, and unchanged for writes, until
    /// the command's completion is taken from [`IoQueue::take_done`] or the
    /// queue is dropped; for NVMe/RDMA it must lie in the registered arena.
    pub unsafe fn submit(
        &mut self,
        sqe: Sqe,
        buf: *mut u8,
        len: usize,
        to_host: bool,
        tag: u64,
    ) -> bool {
        match self {
            // SAFETY: the caller's guarantees are the queues' own.
            IoQueue::Tcp(q) => unsafe { q.submit(sqe, buf, len, to_host, tag) },
            // SAFETY: as above.
            IoQueue::Rdma(q) => unsafe { q.submit(sqe, buf, len, to_host, tag) },
        }
    }

    /// Completions gathered since the last call.
    pub fn take_done(&mut self, out: &mut Vec<Done>) {
        match self {
            IoQueue::Tcp(q) => q.take_done(out),
            IoQueue::Rdma(q) => q.take_done(out),
        }
    }

    /// Keeps the queue's operations in the ring: for NVMe/TCP a receive
    /// (`a`) and a send (`b`), for NVMe/RDMA polls on the completion (`a`)
    /// and CM (`b`) channels.
    pub fn pump(&mut self, sq: &mut Vec<squeue::Entry>, a: u64, b: u64) {
        match self {
            IoQueue::Tcp(q) => q.pump(sq, a, b),
            IoQueue::Rdma(q) => q.pump(sq, a, b),
        }
    }

    /// Operation `a` of [`IoQueue::pump`] completed.
    pub fn on_a(&mut self, res: i32) {
        match self {
            IoQueue::Tcp(q) => q.on_recv(res),
            IoQueue::Rdma(q) => q.on_cq_ready(),
        }
    }

    /// Operation `b` of [`IoQueue::pump`] completed.
    pub fn on_b(&mut self, res: i32) {
        match self {
            IoQueue::Tcp(q) => q.on_send(res),
            IoQueue::Rdma(q) => q.on_cm_ready(),
        }
    }

    /// Whether operations that point into the queue are still in the ring
    /// (NVMe/RDMA polls hold only descriptors, and a failed RDMA queue pair
    /// no longer reaches our memory).
    pub fn ops_in_flight(&self) -> bool {
        match self {
            IoQueue::Tcp(q) => q.ops_in_flight(),
            IoQueue::Rdma(_) => false,
        }
    }

    /// Ends the queue: every command in flight completes with an error.
    pub fn fail(&mut self, why: String) {
        match self {
            IoQueue::Tcp(q) => q.fail(why),
            IoQueue::Rdma(q) => q.fail(why),
        }
    }
}
