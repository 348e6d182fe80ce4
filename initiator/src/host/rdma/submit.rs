//! Sending commands: capsules with their data in-capsule or behind a key
//! that reaches just the command's buffer, and blocking runs of one command.

use super::{wr_id, wr_kind, Inflight, Key, RdmaQueue, RemoteAccess};
use crate::host::HostError;
use rdmablk_common::nvme::{Cqe, Sgl, Sqe};
use rdmablk_common::rdma::{access, next_rkey, Mr, SendOp, SendWr, Sge};
use std::time::{Duration, Instant};

/// The tag of the command [`RdmaQueue::exec_blocking`] runs.
pub const EXEC_TAG: u64 = 0;

impl RdmaQueue {
    /// Submits a command; see `IoQueue::submit`. Returns its command id, or
    /// `None` when no slot is free (or the queue failed).
    ///
    /// # Safety
    /// `buf` must lie in memory given to [`RdmaQueue::register`] and stay
    /// valid (unchanged for writes) until the command's completion is taken.
    pub unsafe fn submit(
        &mut self,
        mut sqe: Sqe,
        buf: *mut u8,
        len: usize,
        to_host: bool,
        tag: u64,
    ) -> Option<u16> {
        let cid = self.slots.claim()?;
        sqe.set_cid(cid);
        let region = match len {
            0 => None,
            _ => match self.regions.iter().position(|r| r.contains(buf, len)) {
                Some(i) => Some(i),
                None => {
                    self.slots.unclaim(cid);
                    self.fail("an I/O buffer lies outside the registered memory".into());
                    return None;
                }
            },
        };
        let inline = !to_host && len > 0 && len <= self.limits.in_capsule;
        // What the target may do with a keyed buffer: write into it for a
        // transfer to the host, read it for one to the controller.
        let rights = if to_host {
            access::REMOTE_WRITE
        } else {
            access::REMOTE_READ
        };
        let key = match region {
            Some(_) if inline => None,
            None => None,
            Some(_) if self.remote == RemoteAccess::Windows => Some(Key::Window {
                rkey: next_rkey(self.windows[cid as usize].rkey()),
            }),
            Some(_) => {
                // SAFETY: the caller keeps the buffer valid until the
                // command completes; the registration is dropped (and its
                // key gone) before that.
                match unsafe { Mr::register(&self.pd, buf, len, access::LOCAL_WRITE | rights) } {
                    Ok(mr) => Some(Key::Registration(mr)),
                    Err(e) => {
                        self.slots.unclaim(cid);
                        self.fail(format!("registering a command's buffer: {e}"));
                        return None;
                    }
                }
            }
        };
        let sgl = match (&key, region) {
            // NVMe/RDMA says "no data" with a zero-length keyed descriptor.
            (_, None) => Sgl::Keyed {
                addr: 0,
                len: 0,
                key: 0,
                invalidate: false,
            },
            (None, Some(_)) => Sgl::InCapsule {
                offset: 0,
                len: len as u32,
            },
            (Some(Key::Window { rkey }), Some(_)) => Sgl::Keyed {
                addr: buf as u64,
                len: len as u32,
                key: *rkey,
                // Subtype Fh: the target's SEND with Invalidate revokes it.
                invalidate: true,
            },
            // A registration's key cannot be invalidated remotely: it goes
            // with the deregistration.
            (Some(Key::Registration(mr)), Some(_)) => Sgl::Keyed {
                addr: buf as u64,
                len: len as u32,
                key: mr.rkey(),
                invalidate: false,
            },
        };
        sqe.set_sgl(&sgl);
        self.capsules.mem[cid as usize].copy_from_slice(&sqe.0);
        let mut sges: smallvec::SmallVec<[Sge; 2]> =
            smallvec::smallvec![self.capsules.sge(cid as usize)];
        if let (true, Some(r)) = (inline, region) {
            sges.push(Sge {
                addr: buf,
                len: len as u32,
                lkey: self.regions[r].lkey(),
            });
        }
        let mut wrs: smallvec::SmallVec<[SendWr; 2]> = smallvec::SmallVec::new();
        if let (Some(Key::Window { rkey }), Some(r)) = (&key, region) {
            // Unsignaled: only a failure completes; the SEND behind it on
            // the same send queue sees the window bound.
            wrs.push(SendWr {
                wr_id: wr_id(wr_kind::BIND, cid),
                op: SendOp::BindWindow {
                    window: &self.windows[cid as usize],
                    rkey: *rkey,
                    region: &self.regions[r],
                    addr: buf,
                    len: len as u32,
                    access: rights,
                },
                sges: &[],
                signaled: false,
                inline: false,
            });
        }
        wrs.push(SendWr {
            wr_id: wr_id(wr_kind::SEND, cid),
            op: SendOp::Send { invalidate: None },
            sges: &sges,
            signaled: true,
            inline: false,
        });
        // SAFETY: the QP is alive; the capsule slot and the caller's buffer
        // (registered, guaranteed valid by the caller) stay untouched until
        // the SEND completes, which the command waits for; the window is
        // the command slot's own, unbound (its last key was revoked before
        // the slot was freed), and bound to the caller's buffer only.
        let posted = unsafe { rdmablk_common::rdma::verbs::post_send(self.id.qp(), &wrs) };
        drop(wrs);
        if let Err(e) = posted {
            self.slots.unclaim(cid);
            self.fail(format!("posting a command: {e}"));
            return None;
        }
        let cmd = Inflight {
            tag,
            sent: false,
            cqe: None,
            key,
        };
        self.slots.start(cid, cmd);
        Some(cid)
    }

    /// Runs one command to completion, blocking (admin queue, Connect).
    /// Completions of other commands (an Asynchronous Event Request's) stay
    /// in `done`.
    ///
    /// # Safety
    /// As [`RdmaQueue::submit`]; the buffer is free again when this returns
    /// (the command completed, or the queue failed and its QP is in error).
    pub unsafe fn exec_blocking(
        &mut self,
        sqe: Sqe,
        buf: *mut u8,
        len: usize,
        to_host: bool,
        timeout: Duration,
    ) -> Result<Cqe, HostError> {
        // SAFETY: the caller's guarantees.
        if unsafe { self.submit(sqe, buf, len, to_host, EXEC_TAG) }.is_none() {
            return Err(HostError::Protocol(
                self.slots.failed().unwrap_or("no free command slot").into(),
            ));
        }
        let deadline = Instant::now() + timeout;
        loop {
            self.on_cq_ready();
            self.on_cm_ready();
            let done = self.slots.take_done_of(EXEC_TAG);
            if let Some(why) = self.slots.failed() {
                return Err(HostError::Protocol(why.into()));
            }
            if let Some(d) = done {
                return Ok(d.cqe);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.fail(format!("no answer from {} within {timeout:?}", self.addr));
                continue;
            }
            let mut fds = [
                libc::pollfd {
                    fd: self.cq.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.cm.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, left.as_millis().clamp(1, 1000) as i32) };
        }
    }
}
