//! An RBD image's I/O: a command's librbd call (`RbdOp`), started on its
//! poller and completed through the poller's `Completions`.

use super::ffi::{Aio, Finish, Image};
use super::{Health, RbdBackend};
use crate::backend::{Access, BackendOp, FixedBuf};
use crate::base::completions::Completions;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl RbdBackend {
    fn op(&self, aio: Aio, result: OnSuccess) -> Access {
        Access::Submit(BackendOp::Rbd(RbdOp {
            image: self.current(),
            health: self.health.clone(),
            aio,
            result,
        }))
    }

    pub fn read(&self, offset: u64, buf: FixedBuf) -> Access {
        let (buf, len) = (buf.ptr, buf.len);
        self.op(Aio::Read { offset, buf, len }, OnSuccess::Bytes)
    }

    pub fn write(&self, offset: u64, buf: FixedBuf) -> Access {
        let (buf, len) = (buf.ptr, buf.len);
        self.op(
            Aio::Write { offset, buf, len },
            OnSuccess::BytesOr(len as i32),
        )
    }

    /// Writes `data` at `offset` if the bytes there equal `cmp` (as long),
    /// atomically at the OSD; ends with -EILSEQ when they differ.
    pub fn compare_and_write(&self, offset: u64, cmp: FixedBuf, data: FixedBuf) -> Access {
        self.op(
            Aio::CompareAndWrite {
                offset,
                cmp: cmp.ptr,
                buf: data.ptr,
                len: cmp.len,
                mismatch: std::ptr::null_mut(),
            },
            OnSuccess::Zero,
        )
    }

    pub fn flush(&self) -> Access {
        self.op(Aio::Flush, OnSuccess::Zero)
    }

    /// Discards (deallocate) or writes zeroes; both read back as zeroes.
    pub fn zero(&self, offset: u64, len: u64, deallocate: bool) -> Access {
        let aio = if deallocate {
            Aio::Discard { offset, len }
        } else {
            Aio::WriteZeroes { offset, len }
        };
        self.op(aio, OnSuccess::Zero)
    }
}

/// One librbd call of a command, started by its queue with the command's
/// token (`RbdOp::start`).
pub struct RbdOp {
    /// None before the image opened (the namespace is inactive then) or
    /// after shutdown.
    image: Option<Arc<Image>>,
    health: Arc<Health>,
    aio: Aio,
    result: OnSuccess,
}

/// What a successful operation reports, in io_uring's convention, which the
/// command's completion expects: a read, the bytes librbd returned (fewer
/// past the end of an image that shrank, which the command then answers as
/// an error rather than send stale buffer bytes); a write, those or its
/// length; the others 0.
#[derive(Clone, Copy)]
enum OnSuccess {
    Bytes,
    BytesOr(i32),
    Zero,
}

impl RbdOp {
    /// Starts the call; its end reaches `completions` as (`token`, result):
    /// -ENOTCONN at once when there is no image.
    ///
    /// # Safety
    /// A read or write's arena buffer stays with the command until the
    /// completion was dispatched.
    pub unsafe fn start(self, token: u64, completions: &Arc<Completions>) {
        let Some(image) = self.image else {
            return completions.push(token, -libc::ENOTCONN);
        };
        image.in_flight.fetch_add(1, Ordering::AcqRel);
        completions.begin();
        let done = Box::new(Done {
            token,
            result: self.result,
            completions: completions.clone(),
            image: Some(image.clone()),
            health: self.health,
            mismatch: std::cell::UnsafeCell::new(0),
        });
        let mut aio = self.aio;
        if let Aio::CompareAndWrite { mismatch, .. } = &mut aio {
            // librbd writes it when the operation ends; `done` (on the
            // heap, moved only as a pointer) lives until then.
            *mismatch = done.mismatch.get();
        }
        // SAFETY: the buffers stay valid until completion (as the caller
        // promised), and `done` keeps the image from being closed until then
        // (an image is closed only by its last holder: see `reconnect`).
        unsafe { image.start(aio, done) };
        completions.handed_over();
    }
}

/// Where a librbd completion goes.
struct Done {
    token: u64,
    result: OnSuccess,
    completions: Arc<Completions>,
    /// Held until the operation ended.
    image: Option<Arc<Image>>,
    health: Arc<Health>,
    /// Where a compare and write that did not match says where (librbd
    /// writes it).
    mismatch: std::cell::UnsafeCell<u64>,
}

impl Finish for Done {
    fn finish(mut self: Box<Self>, rc: i64) {
        if rc == -(libc::ESHUTDOWN as i64) {
            if let Some(image) = &self.image {
                // librados' EBLOCKLISTED.
                self.health.blocklisted(image);
            }
        }
        // The image goes before the command can complete: its completion
        // may drop the namespace, and the last holder of an image must not
        // be a librbd thread (closing waits for them).
        if let Some(image) = self.image.take() {
            image.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        let bytes = || i32::try_from(rc).unwrap_or(i32::MAX);
        let res = match self.result {
            _ if rc < 0 => i32::try_from(rc).unwrap_or(-libc::EIO),
            OnSuccess::Bytes => bytes(),
            OnSuccess::BytesOr(len) if rc == 0 => len,
            OnSuccess::BytesOr(_) => bytes(),
            OnSuccess::Zero => 0,
        };
        self.completions.end(self.token, res);
    }
}
