//! An I/O queue over either transport, as the engines drive it; commands
//! that fail with a status the host may retry are submitted again here,
//! after the delay the controller asks for, before the front-end sees them
//! (path statuses excepted: those go to another path, `paths`).

use super::rdma::RdmaQueue;
use super::tcp::TcpQueue;
use super::HostError;
use rdmablk_common::mem::Arena;
use rdmablk_common::ring::Submissions;

use rdmablk_common::nvme::{crd_of, dnr_of, Cqe, Sqe, Status};
use std::time::{Duration, Instant};

/// Times one command is submitted again after a retryable failure.
const MAX_RETRIES: u8 = 5;
/// Status Code Type of path related statuses.
const SCT_PATH: u8 = 3;

/// A finished command: the caller's tag and the completion entry.
#[derive(Clone, Copy, Debug)]
pub struct Done {
    pub tag: u64,
    pub cqe: Cqe,
}

/// The transport of an I/O queue.
pub enum Link {
    Tcp(Box<TcpQueue>),
    Rdma(Box<RdmaQueue>),
}

/// A command as it was submitted: what submitting it again takes.
#[derive(Clone, Copy)]
struct Submitted {
    sqe: Sqe,
    buf: *mut u8,
    len: usize,
    to_host: bool,
    tag: u64,
    retries: u8,
}

/// One I/O queue.
pub struct IoQueue {
    link: Link,
    /// Commands in flight, by command id.
    submitted: Vec<Option<Submitted>>,
    /// Commands to submit again, and when.
    waiting: Vec<(Instant, Submitted)>,
    /// Command Retry Delay Times 1 to 3 of the controller, 100 ms units.
    crdt: [u16; 3],
    /// Scratch for completions of the link.
    done: Vec<Done>,
    /// Commands that waited for a retry when the queue failed.
    failed_waiting: Vec<Done>,
}

// SAFETY: the raw buffer pointers are the callers' (see `submit`), which
// keep them valid until the command's completion is taken; nothing is tied
// to the creating thread.
unsafe impl Send for IoQueue {}

impl IoQueue {
    /// A queue over `link` whose controller reports `crdt`.
    pub fn new(link: Link, crdt: [u16; 3]) -> IoQueue {
        IoQueue {
            link,
            submitted: Vec::new(),
            waiting: Vec::new(),
            crdt,
            done: Vec::new(),
            failed_waiting: Vec::new(),
        }
    }

    /// Makes `arena` usable for this queue's data (registers it with the
    /// RDMA device; nothing to do for NVMe/TCP).
    ///
    /// # Safety
    /// The arena must outlive the queue.
    pub unsafe fn register_arena(&mut self, arena: &Arena) -> Result<(), HostError> {
        match &mut self.link {
            Link::Tcp(_) => Ok(()),
            // SAFETY: the caller keeps the arena mapped while the queue lives.
            Link::Rdma(q) => unsafe { q.register(arena.base(), arena.len()) },
        }
    }

    /// Commands that can still be submitted.
    pub fn free_slots(&self) -> usize {
        let free = match &self.link {
            Link::Tcp(q) => q.free_slots(),
            Link::Rdma(q) => q.free_slots(),
        };
        free.saturating_sub(self.waiting.len())
    }

    /// Why the queue stopped working, if it did.
    pub fn failed(&self) -> Option<&str> {
        match &self.link {
            Link::Tcp(q) => q.failed(),
            Link::Rdma(q) => q.failed(),
        }
    }

    /// Whether completions wait to be taken.
    pub fn has_done(&self) -> bool {
        let link = match &self.link {
            Link::Tcp(q) => q.has_done(),
            Link::Rdma(q) => q.has_done(),
        };
        link || !self.failed_waiting.is_empty()
    }

    /// Socket sends made (NVMe/TCP; an NVMe/RDMA queue posts a SEND per
    /// command).
    pub fn sends(&self) -> u64 {
        match &self.link {
            Link::Tcp(q) => q.sends(),
            Link::Rdma(_) => 0,
        }
    }

    /// Whether nothing is in flight.
    pub fn idle(&self) -> bool {
        let link = match &self.link {
            Link::Tcp(q) => q.idle(),
            Link::Rdma(q) => q.idle(),
        };
        link && self.waiting.is_empty() && self.failed_waiting.is_empty()
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
        let cmd = Submitted {
            sqe,
            buf,
            len,
            to_host,
            tag,
            retries: 0,
        };
        // SAFETY: the caller's guarantees are the queues' own.
        unsafe { self.submit_again(cmd) }
    }

    /// # Safety
    /// As [`IoQueue::submit`], for `cmd.buf`: a retried command's buffer is
    /// still its caller's, whose completion has not been taken.
    unsafe fn submit_again(&mut self, cmd: Submitted) -> bool {
        let Submitted {
            sqe,
            buf,
            len,
            to_host,
            tag,
            ..
        } = cmd;
        let cid = match &mut self.link {
            // SAFETY: the caller's guarantees are the queues' own.
            Link::Tcp(q) => unsafe { q.submit(sqe, buf, len, to_host, tag) },
            // SAFETY: as above.
            Link::Rdma(q) => unsafe { q.submit(sqe, buf, len, to_host, tag) },
        };
        let Some(cid) = cid else {
            return false;
        };
        let i = cid as usize;
        if self.submitted.len() <= i {
            self.submitted.resize(i + 1, None);
        }
        self.submitted[i] = Some(cmd);
        true
    }

    /// Completions gathered since the last call. A command that failed with
    /// a status the host may retry (NVMe Base 2.1, 4.2.3.1: DNR clear) is
    /// submitted again after the Command Retry Delay its completion selects
    /// (CRD, CRDT1..3), at most `MAX_RETRIES` times, unless the queue failed
    /// (the front-end then resubmits on a new queue) or the status is a path
    /// status (another path takes it).
    pub fn take_done(&mut self, out: &mut Vec<Done>) {
        out.append(&mut self.failed_waiting);
        match &mut self.link {
            Link::Tcp(q) => q.take_done(&mut self.done),
            Link::Rdma(q) => q.take_done(&mut self.done),
        }
        let live = self.failed().is_none();
        // Taken and put back: its room is reused, nothing is allocated per call.
        let mut done = std::mem::take(&mut self.done);
        for d in done.drain(..) {
            let cmd = self
                .submitted
                .get_mut(d.cqe.cid as usize)
                .and_then(Option::take)
                .filter(|c| c.tag == d.tag);
            let st = d.cqe.status();
            let retry = live
                && !st.is_success()
                && st.is_retryable()
                && st.sct != SCT_PATH
                && !dnr_of(d.cqe.status);
            match cmd {
                Some(mut c) if retry && c.retries < MAX_RETRIES => {
                    c.retries += 1;
                    let crd = crd_of(d.cqe.status) as usize;
                    let units = if crd == 0 { 0 } else { self.crdt[crd - 1] };
                    let at = Instant::now() + Duration::from_millis(units as u64 * 100);
                    tracing::debug!(tag = c.tag, status = %st, crd, attempt = c.retries, "retrying a command");
                    self.waiting.push((at, c));
                }
                _ => out.push(d),
            }
        }
        self.done = done;
    }

    /// Keeps the queue's operations in the ring: for NVMe/TCP a receive
    /// (user data `receive_ud`) and a send (`send_ud`), for NVMe/RDMA polls
    /// on the completion channel (`receive_ud`) and the CM channel (`send_ud`).
    pub fn pump(&mut self, sq: &mut Submissions, receive_ud: u64, send_ud: u64) {
        self.resubmit_due();
        match &mut self.link {
            Link::Tcp(q) => q.pump(sq, receive_ud, send_ud),
            Link::Rdma(q) => q.pump(sq, receive_ud, send_ud),
        }
    }

    /// Submits again the commands whose retry delay has passed.
    fn resubmit_due(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut i = 0;
        while i < self.waiting.len() {
            let (at, cmd) = self.waiting[i];
            // SAFETY: the command's caller has not taken its completion, so
            // its buffer is still valid and unchanged (`submit`'s contract).
            if at <= now && unsafe { self.submit_again(cmd) } {
                self.waiting.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Makes the queue rely on [`IoQueue::poll_direct`] every round rather
    /// than on an operation in the ring where the transport allows it
    /// (NVMe/RDMA's CQ; NVMe/TCP still needs its receive).
    pub fn set_busy_poll(&mut self, on: bool) {
        if let Link::Rdma(q) = &mut self.link {
            q.set_busy_poll(on);
        }
    }

    /// Takes what arrived without the ring (NVMe/RDMA completions, while
    /// the engine polls); returns whether anything did.
    pub fn poll_direct(&mut self) -> bool {
        match &mut self.link {
            Link::Rdma(q) => q.poll_cq(),
            Link::Tcp(_) => false,
        }
    }

    /// The receive operation of [`IoQueue::pump`] completed (NVMe/RDMA:
    /// the completion channel's poll).
    pub fn on_receive_done(&mut self, res: i32) {
        match &mut self.link {
            Link::Tcp(q) => q.on_recv(res),
            Link::Rdma(q) => q.on_cq_ready(),
        }
    }

    /// The send operation of [`IoQueue::pump`] completed (NVMe/RDMA: the
    /// CM channel's poll).
    pub fn on_send_done(&mut self, res: i32) {
        match &mut self.link {
            Link::Tcp(q) => q.on_send(res),
            Link::Rdma(q) => q.on_cm_ready(),
        }
    }

    /// Whether operations that point into the queue are still in the ring
    /// (NVMe/RDMA polls hold only descriptors, and a failed RDMA queue pair
    /// no longer reaches our memory).
    pub fn ops_in_flight(&self) -> bool {
        match &self.link {
            Link::Tcp(q) => q.ops_in_flight(),
            Link::Rdma(_) => false,
        }
    }

    /// Ends the queue: every command in flight completes with an error, and
    /// so does every command waiting for its retry.
    pub fn fail(&mut self, why: String) {
        match &mut self.link {
            Link::Tcp(q) => q.fail(why),
            Link::Rdma(q) => q.fail(why),
        }
        for (_, c) in self.waiting.drain(..) {
            let cqe = Cqe {
                cid: c.sqe.cid(),
                status: Status::TRANSIENT_TRANSPORT_ERROR.to_field(0),
                ..Default::default()
            };
            self.failed_waiting.push(Done { tag: c.tag, cqe });
        }
    }
}
