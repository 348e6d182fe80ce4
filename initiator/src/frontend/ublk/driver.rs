//! One ublk queue served on an engine thread: its io commands (FETCH_REQ,
//! COMMIT_AND_FETCH_REQ) are uring_cmds on the engine's own ring, next to
//! the NVMe queue's operations. Each tag owns an arena buffer that the
//! kernel copies request data into and out of, and that the NVMe transport
//! uses directly (over RDMA the target reads and writes it).

use super::descriptors::Descriptors;
use crate::host::block::{self, DSM_RANGE_LEN};
use crate::host::engine::{Cx, Driver};
use crate::host::{Data, Done, NamespaceInfo};
use libublk::sys;
use nix::unistd::gettid;
use rdmablk_common::mem::ArenaBuf;
use rdmablk_common::nvme::{nvm, Status};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;

/// Attempts of one request across transient errors and reconnects.
const MAX_ATTEMPTS: u32 = 1000;

/// What a queue's driver is given.
pub struct QueueSetup {
    /// The ublk char device (/dev/ublkcN).
    pub cdev: RawFd,
    pub q_id: u16,
    pub depth: u16,
    /// Largest request, and each tag's buffer size.
    pub max_io: usize,
    pub ns: NamespaceInfo,
    /// Told (queue id, thread id) once every tag's FETCH is queued.
    pub ready: Sender<(u16, i32)>,
    /// The association is given up: fail waiting I/O.
    pub give_up: Arc<AtomicBool>,
    /// The device is being stopped: I/O that waits for a lost queue fails
    /// (the stop waits for every request).
    pub stop: Arc<AtomicBool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// A FETCH or COMMIT_AND_FETCH is in the ring: waiting for a request.
    Fetching,
    /// A request waits for a free NVMe command slot.
    Queued,
    /// Its NVMe command is in flight.
    Nvme,
    /// The device is going away (the kernel aborted the fetch).
    Gone,
}

struct Tag {
    buf: Option<ArenaBuf>,
    state: State,
    /// The request: ublk op, byte offset, byte length, FUA.
    op: u32,
    offset: u64,
    len: usize,
    fua: bool,
    attempts: u32,
}

/// The ublk queue's state on its engine.
pub struct UblkDriver {
    s: QueueSetup,
    /// The queue's request descriptors, mapped read-only from the char device.
    iods: Descriptors,
    tags: Vec<Tag>,
    queued: VecDeque<u16>,
    started: bool,
    cmds_in_flight: usize,
}

impl UblkDriver {
    /// Maps the queue's request descriptors.
    pub fn new(s: QueueSetup) -> Result<UblkDriver, String> {
        let iods = Descriptors::map(s.cdev, s.q_id, s.depth)?;
        let tags = (0..s.depth)
            .map(|_| Tag {
                buf: None,
                state: State::Fetching,
                op: 0,
                offset: 0,
                len: 0,
                fua: false,
                attempts: 0,
            })
            .collect();
        Ok(UblkDriver {
            s,
            iods,
            tags,
            queued: VecDeque::new(),
            started: false,
            cmds_in_flight: 0,
        })
    }

    /// Queues FETCH_REQ (first time) or COMMIT_AND_FETCH_REQ with `result`.
    fn io_cmd(&mut self, tag: u16, fetch: bool, result: i32, cx: &mut Cx) {
        let t = &mut self.tags[tag as usize];
        let buf = t.buf.as_ref().expect("tags have buffers once started");
        let cmd = sys::ublksrv_io_cmd {
            q_id: self.s.q_id,
            tag,
            result,
            addr: 0,
        };
        let op = if fetch {
            sys::UBLK_U_IO_FETCH_REQ
        } else {
            sys::UBLK_U_IO_COMMIT_AND_FETCH_REQ
        };
        // The tag's buffer is allocated once for the queue's life and freed
        // only after the queue is stopped and its io commands completed.
        cx.ublk_io_cmd(self.s.cdev, op, cmd, buf, tag as u32);
        t.state = State::Fetching;
        self.cmds_in_flight += 1;
    }

    /// A request arrived for `tag`: read its descriptor and run it.
    fn on_request(&mut self, tag: u16, cx: &mut Cx) {
        let iod = self.iods.get(tag);
        let t = &mut self.tags[tag as usize];
        t.op = iod.op_flags & 0xff;
        t.fua = iod.op_flags & sys::UBLK_IO_F_FUA != 0;
        t.offset = iod.start_sector << 9;
        t.len = (iod.nr_sectors as usize) << 9;
        t.attempts = 0;
        let bs = self.s.ns.block_size as u64;
        let supported = matches!(
            t.op,
            sys::UBLK_IO_OP_READ
                | sys::UBLK_IO_OP_WRITE
                | sys::UBLK_IO_OP_FLUSH
                | sys::UBLK_IO_OP_DISCARD
                | sys::UBLK_IO_OP_WRITE_ZEROES
        );
        let aligned = t.op == sys::UBLK_IO_OP_FLUSH
            || t.offset.is_multiple_of(bs) && (t.len as u64).is_multiple_of(bs);
        if !supported || !aligned || t.len > self.s.max_io && t.op <= sys::UBLK_IO_OP_WRITE {
            tracing::warn!(
                op = t.op,
                offset = t.offset,
                len = t.len,
                "ublk request not served"
            );
            return self.io_cmd(tag, false, -libc::EINVAL, cx);
        }
        t.state = State::Queued;
        self.queued.push_back(tag);
    }

    /// Issues the NVMe commands of queued requests while slots are free.
    fn submit_queued(&mut self, cx: &mut Cx) {
        while cx.paths.free_slots() > 0 {
            let Some(tag) = self.queued.pop_front() else {
                return;
            };
            let ns = self.s.ns;
            let bs = ns.block_size as u64;
            let t = &mut self.tags[tag as usize];
            let buf = t.buf.as_ref().expect("tags have buffers once started");
            let (lba, blocks) = (t.offset / bs, t.len as u64 / bs);
            let (op, data, to_host) = match t.op {
                sys::UBLK_IO_OP_READ => (nvm::READ, cx.data(buf, 0, t.len), true),
                sys::UBLK_IO_OP_WRITE => (nvm::WRITE, cx.data(buf, 0, t.len), false),
                sys::UBLK_IO_OP_FLUSH => (nvm::FLUSH, Data::NONE, false),
                sys::UBLK_IO_OP_WRITE_ZEROES => (nvm::WRITE_ZEROES, Data::NONE, false),
                _ => {
                    let mut range = [0u8; DSM_RANGE_LEN];
                    block::dsm_range(&mut range, lba, blocks as u32);
                    cx.arena.write(buf, 0, &range);
                    (nvm::DSM, cx.data(buf, 0, DSM_RANGE_LEN), false)
                }
            };
            // FUA for writes; Write Zeroes never deallocates.
            let flag = t.fua && op == nvm::WRITE;
            let sqe = block::sqe(op, ns.nsid, lba, blocks, flag);
            // The tag's arena buffer is left alone until the command
            // completes (the tag is in the Nvme state until then).
            if cx.paths.submit(sqe, data, to_host, tag as u64) {
                t.state = State::Nvme;
                t.attempts += 1;
            } else {
                // The queue failed meanwhile: wait for its replacement.
                self.queued.push_front(tag);
                return;
            }
        }
    }

    /// Whether waiting I/O is failed rather than kept for a new queue.
    fn abandon(&self, cx: &Cx) -> bool {
        self.s.give_up.load(Ordering::Acquire)
            || self.s.stop.load(Ordering::Acquire) && cx.paths.failed().is_some()
    }

    fn fail_queued(&mut self, cx: &mut Cx) {
        while let Some(tag) = self.queued.pop_front() {
            self.io_cmd(tag, false, -libc::EIO, cx);
        }
    }
}

impl Driver for UblkDriver {
    fn pump(&mut self, cx: &mut Cx) -> bool {
        if !self.started {
            self.started = true;
            for tag in 0..self.s.depth {
                match cx.arena.alloc(self.s.max_io) {
                    Some(b) => self.tags[tag as usize].buf = Some(b),
                    None => {
                        tracing::error!("the arena cannot give every ublk tag a buffer");
                        return false;
                    }
                }
                self.io_cmd(tag, true, 0, cx);
            }
            let tid = gettid().as_raw();
            let _ = self.s.ready.send((self.s.q_id, tid));
        }
        if self.abandon(cx) {
            self.fail_queued(cx);
        }
        self.submit_queued(cx);
        !self.tags.iter().all(|t| t.state == State::Gone)
    }

    fn on_done(&mut self, done: Done, cx: &mut Cx) {
        let tag = done.tag as u16;
        let st = done.cqe.status();
        let t = &self.tags[tag as usize];
        if !st.is_success() {
            let transient =
                st == Status::TRANSIENT_TRANSPORT_ERROR || (st.sct == 0 && st.sc == 0x22);
            if transient && !self.abandon(cx) && t.attempts < MAX_ATTEMPTS {
                // Again once the queue is back (or at once on a live one).
                self.tags[tag as usize].state = State::Queued;
                self.queued.push_back(tag);
                return;
            }
            // A controller without Write Zeroes or Dataset Management: the
            // block layer falls back (zeroes written, discard turned off).
            let unsupported = st.sct == 0 && st.sc == Status::INVALID_OPCODE.sc;
            let errno = if unsupported && t.op > sys::UBLK_IO_OP_FLUSH {
                tracing::info!(
                    op = t.op,
                    "the controller does not support this command: {st}"
                );
                libc::EOPNOTSUPP
            } else {
                tracing::warn!(
                    op = t.op,
                    offset = t.offset,
                    len = t.len,
                    "NVMe command failed: {st}"
                );
                libc::EIO
            };
            return self.io_cmd(tag, false, -errno, cx);
        }
        let result = match t.op {
            sys::UBLK_IO_OP_READ | sys::UBLK_IO_OP_WRITE => t.len as i32,
            _ => 0,
        };
        self.io_cmd(tag, false, result, cx);
    }

    fn on_op(&mut self, token: u32, res: i32, cx: &mut Cx) {
        self.cmds_in_flight -= 1;
        let tag = token as u16;
        match res {
            r if r == sys::UBLK_IO_RES_OK as i32 => self.on_request(tag, cx),
            sys::UBLK_IO_RES_ABORT => self.tags[tag as usize].state = State::Gone,
            r => {
                tracing::error!(
                    queue = self.s.q_id,
                    tag,
                    "ublk io command failed: {}",
                    std::io::Error::from_raw_os_error(-r)
                );
                self.tags[tag as usize].state = State::Gone;
            }
        }
    }

    fn ops_in_flight(&self) -> usize {
        self.cmds_in_flight
    }
}
