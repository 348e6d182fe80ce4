//! An I/O queue over either transport, as the engines drive it; commands
//! that fail with a status the host may retry are submitted again here,
//! after the delay the controller asks for, before the front-end sees them
//! (path statuses excepted: those go to another path, `paths`).

use super::rdma::RdmaQueue;
use super::tcp::TcpQueue;
use super::HostError;
use rdmablk_common::mem::{Arena, ArenaBuf};
use rdmablk_common::ring::Submissions;
use std::marker::PhantomData;

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

/// The data of a command: bytes of the engine's arena, or none. Made by
/// [`Cx::data`](super::engine::Cx::data) from the arena the engine lends its
/// driver, and valid no longer than that loan (`'a`), so a driver cannot
/// name memory other than its engine's arena. The arena outlives the
/// engine's queues (the engine drops its paths first, and `Cx` does not let
/// a driver replace it), so a queue may read or write these bytes until the
/// command completes. A driver that reuses a buffer before then gets wrong
/// bytes, never freed memory: the arena forms no Rust reference into its
/// mapping (`rdmablk_common::mem`).
#[derive(Clone, Copy)]
pub struct Data<'a> {
    ptr: *mut u8,
    len: usize,
    arena: PhantomData<&'a Arena>,
}

impl<'a> Data<'a> {
    /// No data (Flush, Write Zeroes).
    pub const NONE: Data<'static> = Data {
        ptr: std::ptr::null_mut(),
        len: 0,
        arena: PhantomData,
    };

    /// Where the bytes start (null for none).
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// How many bytes.
    pub fn size(&self) -> usize {
        self.len
    }

    /// Bytes `at..at + len` of `buf`, a buffer of `arena`, which the
    /// caller ([`Cx`](super::engine::Cx)) lends for `'a`.
    ///
    /// # Panics
    /// When the range is not inside `buf`, or `buf` not inside `arena`.
    pub(super) fn in_arena(arena: &Arena, buf: &ArenaBuf, at: usize, len: usize) -> Data<'a> {
        assert!(
            at.checked_add(len).is_some_and(|end| end <= buf.capacity())
                && buf.offset() + buf.capacity() <= arena.len(),
            "command data of {len} bytes at {at} outside its {}-byte arena buffer",
            buf.capacity()
        );
        Data {
            ptr: arena.addr(buf, at),
            len,
            arena: PhantomData,
        }
    }
}

/// A command as the host keeps it until its completion: what submitting it
/// again takes. [`Paths`](super::Paths) keeps one per driver command, with
/// the driver's tag; the queue it goes to keeps a copy tagged with the
/// paths' slot.
#[derive(Clone, Copy)]
pub(super) struct Cmd {
    pub sqe: Sqe,
    /// Its data, in the engine's arena (see [`Data`]).
    ptr: *mut u8,
    len: usize,
    /// Whether the data moves to the host (a read).
    pub to_host: bool,
    pub tag: u64,
    /// Times it was sent again: retries in a queue, reroutes in the paths.
    pub again: u8,
}

impl Cmd {
    /// Command `sqe` moving `data` (to the host when `to_host`), tagged `tag`.
    pub fn new(sqe: Sqe, data: Data<'_>, to_host: bool, tag: u64) -> Cmd {
        Cmd {
            sqe,
            ptr: data.ptr,
            len: data.len,
            to_host,
            tag,
            again: 0,
        }
    }

    /// The same command, tagged `tag`, not yet sent again.
    pub fn retagged(self, tag: u64) -> Cmd {
        Cmd {
            tag,
            again: 0,
            ..self
        }
    }
}

/// One I/O queue.
pub struct IoQueue {
    link: Link,
    /// Commands in flight, by command id.
    submitted: Vec<Option<Cmd>>,
    /// Commands to submit again, and when.
    waiting: Vec<(Instant, Cmd)>,
    /// Command Retry Delay Times 1 to 3 of the controller, 100 ms units.
    crdt: [u16; 3],
    /// Scratch for completions of the link.
    done: Vec<Done>,
}

// SAFETY: the raw buffer pointers point into the engine's arena (see
// `Data`), which the engine, and so this queue, may use from any thread;
// nothing is tied to the creating thread.
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

    /// Whether completions wait to be taken (a failed queue's commands
    /// waiting for their retry among them).
    pub fn has_done(&self) -> bool {
        let link = match &self.link {
            Link::Tcp(q) => q.has_done(),
            Link::Rdma(q) => q.has_done(),
        };
        link || (self.failed().is_some() && !self.waiting.is_empty())
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
        link && self.waiting.is_empty()
    }

    /// Submits `cmd`. Returns false when no slot is free.
    pub(super) fn submit(&mut self, cmd: Cmd) -> bool {
        let Cmd {
            sqe,
            ptr,
            len,
            to_host,
            tag,
            ..
        } = cmd;
        let cid = match &mut self.link {
            // SAFETY: `ptr..ptr + len` lies in the engine's arena, made so by
            // `Data`; the arena outlives the queue (`register_arena`'s
            // contract, which the engine keeps) and, for NVMe/RDMA, is the
            // one registered with it.
            Link::Tcp(q) => unsafe { q.submit(sqe, ptr, len, to_host, tag) },
            // SAFETY: as above.
            Link::Rdma(q) => unsafe { q.submit(sqe, ptr, len, to_host, tag) },
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
        if self.failed().is_some() {
            // No retry can be sent on a failed link (failed by `fail`, or on
            // its own when the target closed the connection): the commands
            // waiting for one complete with a transient transport error,
            // and another path or queue takes them.
            out.extend(self.waiting.drain(..).map(|(_, c)| Done {
                tag: c.tag,
                cqe: Cqe {
                    cid: c.sqe.cid(),
                    status: Status::TRANSIENT_TRANSPORT_ERROR.to_field(0),
                    ..Default::default()
                },
            }));
        }
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
                Some(mut c) if retry && c.again < MAX_RETRIES => {
                    c.again += 1;
                    let crd = crd_of(d.cqe.status) as usize;
                    let units = if crd == 0 { 0 } else { self.crdt[crd - 1] };
                    let at = Instant::now() + Duration::from_millis(units as u64 * 100);
                    tracing::debug!(tag = c.tag, status = %st, crd, attempt = c.again, "retrying a command");
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
            if at <= now && self.submit(cmd) {
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
    /// so does every command waiting for its retry (at the next
    /// [`IoQueue::take_done`]).
    pub fn fail(&mut self, why: String) {
        match &mut self.link {
            Link::Tcp(q) => q.fail(why),
            Link::Rdma(q) => q.fail(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_lies_in_its_arena_buffer() {
        let mut arena = Arena::new(4 << 20, false).expect("an arena");
        let buf = arena.alloc(8192).expect("a buffer");
        let d = Data::in_arena(&arena, &buf, 4096, 4096);
        assert_eq!(d.ptr(), arena.addr(&buf, 4096));
        assert_eq!(d.size(), 4096);
        let past = std::panic::catch_unwind(|| Data::in_arena(&arena, &buf, 4096, 4097).size());
        assert!(past.is_err(), "a range past the buffer is refused");
        arena.free(buf);
    }
}
