//! An I/O command's work: the reservation rules it meets when it executes,
//! its pass through the namespace's write gate, its backend operations and
//! what their completions lead to (the rest of a short transfer, a FUA
//! flush, the other way of zeroing, a Compare's comparison and a fused
//! Compare and Write's write).

use super::decode::{self, IoKind};
use super::{Command, Entries, Progress, Step, Work};
use crate::backend::{Access, Backend, BackendOp, FixedBuf, Later};
use crate::nvme::controller::Controller;
use crate::service::reservation::AccessGroup;
use crate::service::write_gate::{Entry, Pass};
use rdmablk_common::mem::{Arena, ArenaBuf};
use rdmablk_common::nvme::Status;
use std::sync::Arc;

/// Largest Dataset Management data: 256 ranges of 16 bytes.
const MAX_DSM_DATA: usize = 256 * 16;
/// Bytes compared at a time (the arena is device memory: copied out).
const COMPARE_CHUNK: usize = 4096;

/// librbd compares and writes within one 512-byte sector at most (and
/// refuses more with EINVAL).
const OSD_COMPARE_MAX: u64 = 512;

/// Whether a fused Compare and Write of `len` bytes at `offset` is one of
/// librbd's compare-and-writes, atomic at the OSD (and so across gateways);
/// larger ones take the write gate, atomic within this daemon.
fn osd_compare(backend: &Backend, offset: u64, len: u64) -> bool {
    matches!(backend, Backend::Rbd(_)) && offset % OSD_COMPARE_MAX + len <= OSD_COMPARE_MAX
}

impl Command {
    /// Executes an I/O command of `ctrl`'s host: the reservation rules
    /// first (NVMe Base 2.1, 8.1.22), checked now rather than at arrival
    /// so that a command whose data came after a preemption meets them.
    pub(super) fn start_io(&mut self, arena: &mut Arena, ctrl: &Arc<Controller>) -> Progress {
        let Work::Io(req) = &self.work else {
            unreachable!("start_io on a non-I/O command")
        };
        let ns = &req.ns;
        let fused = self.partner_buf.is_some();
        if let Some(r) = &ns.reservations {
            let host = &ctrl.hostid;
            if r.aborted_since(host, req.aborts_seen) {
                self.status = Status::ABORTED_PREEMPT;
                return Progress::Complete;
            }
            // A fused Compare and Write also writes.
            let access = match req.kind.access_group() {
                Some(_) if fused => Some(AccessGroup::Write),
                group => group,
            };
            if access.is_some_and(|a| !r.admits(host, a)) {
                self.status = Status::RESERVATION_CONFLICT;
                return Progress::Complete;
            }
        }
        let entry = match req.kind {
            IoKind::Reservation(op) => return self.start_reservation(op, arena, ctrl),
            IoKind::Write { .. }
            | IoKind::WriteZeroes { .. }
            | IoKind::Dsm { deallocate: true } => {
                Some(ns.gate.enter_write(req.poller, req.written()))
            }
            // librbd's compare-and-write is atomic at the OSD: it passes as
            // a write (which a Preempt and Abort waits for).
            IoKind::Compare if fused && osd_compare(&ns.backend, req.offset, req.len) => {
                Some(ns.gate.enter_write(req.poller, req.written()))
            }
            IoKind::Compare if fused => Some(ns.gate.enter_exclusive(req.written())),
            _ => None,
        };
        match entry {
            Some(Entry::Wait(id)) => {
                let ns = ns.clone();
                self.step = Step::Gate(id);
                self.ops_in_flight = 1;
                let mut entries = Entries::new();
                entries.push(BackendOp::Later(Later::new(move |token, completions| {
                    ns.gate.wait(id, token, completions)
                })));
                Progress::Waiting(entries)
            }
            Some(Entry::Pass(p)) => {
                self.gate = Some(p);
                self.operations(arena)
            }
            None => self.operations(arena),
        }
    }

    /// Gives back the command's write gate pass, or the wait for one.
    pub fn leave_gate(&mut self) {
        let Work::Io(req) = &self.work else {
            return;
        };
        if let Some(p) = self.gate.take() {
            req.ns.gate.leave(p);
        }
        if let Step::Gate(id) | Step::Drain { id, .. } = self.step {
            self.step = Step::Run;
            req.ns.gate.leave(Pass::Held(id));
        }
    }

    /// The command's backend operations, once it may run.
    fn operations(&mut self, arena: &mut Arena) -> Progress {
        let Work::Io(req) = &self.work else {
            unreachable!("operations of a non-I/O command")
        };
        let (ns, offset, len) = (req.ns.clone(), req.offset, req.len);
        // One operation for everything but Dataset Management: no heap on
        // the I/O path.
        let mut entries = Entries::new();
        let mut take = |a: Access, status: &mut Status| match a {
            Access::Done(Ok(())) => {}
            Access::Done(Err(st)) => *status = st,
            Access::Submit(e) => entries.push(e),
        };
        match req.kind {
            IoKind::Read | IoKind::Write { .. } => take(self.transfer(arena), &mut self.status),
            IoKind::Flush => take(ns.backend.flush(), &mut self.status),
            IoKind::WriteZeroes { deallocate } => {
                take(ns.backend.zero(offset, len, deallocate), &mut self.status)
            }
            IoKind::Dsm { deallocate: false } => {}
            IoKind::Dsm { deallocate: true } => {
                match decode::dsm_ranges(&ns, self.copy_data(arena, &mut [0u8; MAX_DSM_DATA])) {
                    Ok(ranges) => {
                        for (o, l) in ranges {
                            take(ns.backend.zero(o, l, true), &mut self.status);
                        }
                    }
                    Err(st) => self.status = st,
                }
            }
            IoKind::Compare => match (&ns.backend, &self.partner_buf) {
                (Backend::Rbd(r), Some(write)) if osd_compare(&ns.backend, offset, len) => {
                    self.step = Step::RbdCompareAndWrite;
                    let cmp = self.fixed(arena, self.buf.as_ref(), 0, len as usize);
                    let data = self.fixed(arena, Some(write), 0, len as usize);
                    take(r.compare_and_write(offset, cmp, data), &mut self.status)
                }
                _ => {
                    self.step = Step::CompareRead;
                    take(self.transfer(arena), &mut self.status)
                }
            },
            IoKind::Reservation(_) => {
                unreachable!("reservation commands run in `start_reservation`")
            }
        }
        self.ops_in_flight = entries.len() as u32;
        if entries.is_empty() {
            // All done at once (memory, null): what follows, at once too.
            let more = self.after_transfer(arena);
            self.ops_in_flight = more.len() as u32;
            if more.is_empty() {
                return Progress::Complete;
            }
            return Progress::Waiting(more);
        }
        Progress::Waiting(entries)
    }

    /// `len` bytes of `buf` (the command's own, or its partner's) from byte
    /// `from`, for the backend.
    fn fixed(&self, arena: &Arena, buf: Option<&ArenaBuf>, from: usize, len: usize) -> FixedBuf {
        let buf = buf.expect("an I/O command with data has a buffer");
        FixedBuf {
            ptr: arena.addr(buf, from),
            len,
            index: rdmablk_common::ring::ARENA_BUF_INDEX,
        }
    }

    /// The read or write of what is left of the command's transfer (after
    /// `done_bytes`): its data, what a Compare reads (the second half of its
    /// buffer), or the write of a fused Compare and Write (its partner's
    /// data).
    fn transfer(&self, arena: &Arena) -> Access {
        let Work::Io(req) = &self.work else {
            unreachable!("transfer of a non-I/O command")
        };
        let (done, len) = (self.done_bytes, req.len as usize);
        let at = req.offset + done as u64;
        let backend = &req.ns.backend;
        match (req.kind, self.step) {
            (IoKind::Read, _) => {
                backend.read(at, self.fixed(arena, self.buf.as_ref(), done, len - done))
            }
            (IoKind::Write { fua }, _) => backend.write(
                at,
                self.fixed(arena, self.buf.as_ref(), done, len - done),
                fua,
            ),
            (IoKind::Compare, Step::CompareRead) => backend.read(
                at,
                self.fixed(arena, self.buf.as_ref(), len + done, len - done),
            ),
            (IoKind::Compare, Step::FusedWrite) => backend.write(
                at,
                self.fixed(arena, self.partner_buf.as_ref(), done, len - done),
                self.fused_fua,
            ),
            _ => unreachable!("no transfer for {:?} at {:?}", req.kind, self.step),
        }
    }

    /// What follows once a transfer is complete: a Compare compares, and a
    /// fused one whose data matched writes. Operations to start, if any.
    fn after_transfer(&mut self, arena: &mut Arena) -> Entries {
        let mut more = Entries::new();
        match self.step {
            Step::CompareRead if self.status.is_success() => {
                if !self.matches(arena) {
                    // NVM Command Set 2.1, 3.3.1: Compare Failure, and the
                    // write of a fused operation is not done.
                    self.status = Status::COMPARE_FAILURE;
                    return more;
                }
                if self.partner_buf.is_none() {
                    return more;
                }
                self.step = Step::FusedWrite;
                self.done_bytes = 0;
                match self.transfer(arena) {
                    Access::Submit(op) => more.push(op),
                    Access::Done(Ok(())) => {}
                    Access::Done(Err(st)) => self.fused_write_status = st,
                }
            }
            _ => {}
        }
        more
    }

    /// Whether the data a Compare received (first half of its buffer)
    /// equals what it read (second half).
    fn matches(&self, arena: &Arena) -> bool {
        let (Some(buf), Work::Io(req)) = (&self.buf, &self.work) else {
            return false;
        };
        let len = req.len as usize;
        let (mut a, mut b) = ([0u8; COMPARE_CHUNK], [0u8; COMPARE_CHUNK]);
        (0..len).step_by(COMPARE_CHUNK).all(|at| {
            let n = COMPARE_CHUNK.min(len - at);
            arena.read(buf, at, &mut a[..n]);
            arena.read(buf, len + at, &mut b[..n]);
            a[..n] == b[..n]
        })
    }

    /// Handles a backend completion (`res` as io_uring reports it): more
    /// operations to start, if any; the command is complete when none is
    /// returned and `ops_in_flight` is zero. `acre` says whether the host
    /// enabled Advanced Command Retry.
    pub fn on_backend_done(
        &mut self,
        res: i32,
        arena: &mut Arena,
        acre: impl FnOnce() -> bool,
    ) -> Entries {
        self.ops_in_flight -= 1;
        let more = self.next(res, arena, acre);
        self.ops_in_flight += more.len() as u32;
        more
    }

    fn next(&mut self, res: i32, arena: &mut Arena, acre: impl FnOnce() -> bool) -> Entries {
        let one = |a: Access, status: &mut Status| {
            let mut e = Entries::new();
            match a {
                Access::Submit(op) => e.push(op),
                Access::Done(Ok(())) => {}
                Access::Done(Err(st)) => *status = st,
            }
            e
        };
        match self.step {
            Step::Gate(id) => {
                self.step = Step::Run;
                self.gate = Some(Pass::Held(id));
                return match self.operations(arena) {
                    Progress::Waiting(e) => {
                        // `operations` counted them; `on_backend_done` adds.
                        self.ops_in_flight -= e.len() as u32;
                        e
                    }
                    _ => Entries::new(),
                };
            }
            Step::Drain { .. } | Step::Persist | Step::Shared => return self.reservation_done(res),
            _ => {}
        }
        let Work::Io(req) = &self.work else {
            unreachable!("backend completion for a non-I/O command")
        };
        let transfers = matches!(
            req.kind,
            IoKind::Read | IoKind::Write { .. } | IoKind::Compare
        );
        if self.step == Step::RbdCompareAndWrite && res == -libc::EILSEQ {
            self.status = Status::COMPARE_FAILURE;
            return Entries::new();
        }
        // Force Unit Access on a backend that needs a flush for it (RBD),
        // once the write is whole: the flush that follows.
        let fua = match (req.kind, self.step) {
            (IoKind::Write { fua }, _) => fua,
            (IoKind::Compare, Step::FusedWrite | Step::RbdCompareAndWrite) => self.fused_fua,
            _ => false,
        };
        let flush_for_fua =
            |cmd: &Command| fua && res >= 0 && req.ns.backend.flush_after_fua() && !cmd.fua_flushed;
        if res < 0 {
            let errno = -res;
            if let (libc::EOPNOTSUPP, IoKind::WriteZeroes { deallocate }) = (errno, req.kind) {
                if !self.zeroing_fallback {
                    // The other way of zeroing: a hole where ZERO_RANGE is
                    // missing (some file systems), ZERO_RANGE where a hole
                    // cannot be punched (block devices without discard).
                    self.zeroing_fallback = true;
                    let a = req.ns.backend.zero(req.offset, req.len, !deallocate);
                    return one(a, &mut self.status);
                }
            }
            let status = self.failure(errno, acre);
            if self.step == Step::FusedWrite {
                self.fused_write_status = status;
            } else if status != Status::SUCCESS {
                self.status = status;
            }
            return Entries::new();
        }
        if transfers && self.step != Step::RbdCompareAndWrite {
            self.done_bytes += res as usize;
            if self.done_bytes < req.len as usize {
                if res == 0 {
                    tracing::error!(
                        offset = req.offset,
                        "backend returned end of file inside the namespace"
                    );
                    self.status = Status::INTERNAL_ERROR;
                    return Entries::new();
                }
                // Short transfer: continue where it stopped.
                return one(self.transfer(arena), &mut self.status);
            }
            if flush_for_fua(self) {
                self.fua_flushed = true;
                return one(req.ns.backend.flush(), &mut self.status);
            }
            return self.after_transfer(arena);
        }
        if self.step == Step::RbdCompareAndWrite && flush_for_fua(self) {
            self.fua_flushed = true;
            return one(req.ns.backend.flush(), &mut self.status);
        }
        Entries::new()
    }

    /// The status of a backend operation that failed with `errno`.
    fn failure(&self, errno: i32, acre: impl FnOnce() -> bool) -> Status {
        let Work::Io(req) = &self.work else {
            unreachable!("backend failure of a non-I/O command")
        };
        if errno == libc::EOPNOTSUPP && matches!(req.kind, IoKind::Dsm { .. }) {
            // Deallocation is advisory: the blocks simply stay allocated.
            tracing::debug!("deallocate not supported by the backend; ignored");
            return Status::SUCCESS;
        }
        if errno == libc::ETIMEDOUT
            || matches!(errno, libc::ESHUTDOWN | libc::ENOTCONN)
                && matches!(req.ns.backend, Backend::Rbd(_))
        {
            // The backend (a cluster) did not answer in time, or (RBD)
            // refused a client it blocklisted, which the backend replaces,
            // saying so once: a status the host retries (NVMe Base 2.1,
            // 4.2.3.1, Generic Command Status Values). Command Interrupted
            // (21h) only once the host enabled ACRE, as the specification
            // allows it only then (with the controller's retry delay);
            // Namespace Not Ready (82h) before.
            let status = if acre() {
                Status::COMMAND_INTERRUPTED
            } else {
                Status::NAMESPACE_NOT_READY
            };
            if errno == libc::ETIMEDOUT {
                tracing::warn!(
                    opcode = self.sqe.opcode(),
                    offset = req.offset,
                    len = req.len,
                    backend = %req.ns.backend.describe(),
                    "backend I/O timed out; answered {status} (the host may retry)"
                );
            }
            return status;
        }
        tracing::error!(
            opcode = self.sqe.opcode(),
            offset = req.offset,
            len = req.len,
            "backend I/O failed: {}",
            std::io::Error::from_raw_os_error(errno)
        );
        Status::INTERNAL_ERROR
    }
}
