//! Namespace backends: a file or block device (io_uring, O_DIRECT, fixed
//! buffers), memory, null, and a Ceph RBD image (librbd). A backend turns
//! an I/O request into either an immediate result or an operation for the
//! poller to start: an io_uring entry, or a librbd call whose completion
//! comes back through the poller's `Completions`.

mod file;
mod memory;
pub mod rbd;

pub use file::FileBackend;
pub use memory::MemoryBackend;
pub use rbd::RbdBackend;

use crate::base::completions::Completions;
use io_uring::squeue;
use rdmablk_common::nvme::Status;
use std::sync::Arc;

/// What a backend does with one request.
pub enum Access {
    /// Finished synchronously (memory, null, or refused).
    Done(Result<(), Status>),
    /// Start this operation; its completion finishes the request.
    Submit(BackendOp),
}

/// An operation a command waits for, started by the poller with the
/// command's token as user data: a backend's, or work off the poller.
pub enum BackendOp {
    /// An io_uring entry (files and block devices).
    Ring(squeue::Entry),
    /// A librbd asynchronous call.
    Rbd(rbd::ops::RbdOp),
    /// Work on the offload thread (DH-HMAC-CHAP's Diffie-Hellman).
    Offload(crate::base::offload::Job),
    /// A wait whose end another thread reports: a write gate's pass, a
    /// reservation state file written.
    Later(Later),
}

/// Something to wait for, told whom to tell: it records its end (0 or
/// -errno) with the token in the poller's `Completions`.
pub struct Later(Box<StartWait>);

/// How a [`Later`] starts: told the token and where to record its end.
type StartWait = dyn FnOnce(u64, &Arc<Completions>) + Send;

/// Whom to tell: a poller's completions and the token of the waiting command.
pub type Waker = (Arc<Completions>, u64);

impl Later {
    pub fn new(start: impl FnOnce(u64, &Arc<Completions>) + Send + 'static) -> Later {
        Later(Box::new(start))
    }

    /// Starts waiting: the end comes with `token` through `completions`.
    pub fn start(self, token: u64, completions: &Arc<Completions>) {
        (self.0)(token, completions)
    }
}

/// A data buffer inside the poller's registered arena.
#[derive(Clone, Copy, Debug)]
pub struct FixedBuf {
    pub ptr: *mut u8,
    pub len: usize,
    /// Index of the registered buffer (the arena) in the ring.
    pub index: u16,
}

/// The storage behind a namespace.
pub enum Backend {
    File(FileBackend),
    Memory(MemoryBackend),
    /// Boxed: it holds the open image and its locks.
    Rbd(Box<RbdBackend>),
    /// Discards writes, reads zeroes: for measuring the transport alone.
    Null,
}

impl Backend {
    /// Reads `buf.len` bytes at byte `offset` into `buf`.
    pub fn read(&self, offset: u64, buf: FixedBuf) -> Access {
        match self {
            Backend::File(f) => Access::Submit(BackendOp::Ring(f.read(offset, buf))),
            Backend::Rbd(r) => r.read(offset, buf),
            Backend::Memory(m) => Access::Done(m.read(offset, buf)),
            Backend::Null => {
                // SAFETY: `buf` is an arena buffer of at least `len` bytes that this
                // request owns exclusively until it completes.
                unsafe { std::ptr::write_bytes(buf.ptr, 0, buf.len) };
                Access::Done(Ok(()))
            }
        }
    }

    /// Writes `buf` at byte `offset`; `fua` makes it durable before
    /// completion (an RBD write is followed by a flush instead:
    /// [`Backend::flush_after_fua`]).
    pub fn write(&self, offset: u64, buf: FixedBuf, fua: bool) -> Access {
        match self {
            Backend::File(f) => Access::Submit(BackendOp::Ring(f.write(offset, buf, fua))),
            Backend::Rbd(r) => r.write(offset, buf),
            Backend::Memory(m) => Access::Done(m.write(offset, buf)),
            Backend::Null => Access::Done(Ok(())),
        }
    }

    /// Makes completed writes durable.
    pub fn flush(&self) -> Access {
        match self {
            Backend::File(f) => Access::Submit(BackendOp::Ring(f.flush())),
            Backend::Rbd(r) => r.flush(),
            Backend::Memory(_) | Backend::Null => Access::Done(Ok(())),
        }
    }

    /// Makes `len` bytes at `offset` read back as zeroes; `deallocate` allows
    /// freeing the space (hole punch / discard) rather than writing zeroes.
    pub fn zero(&self, offset: u64, len: u64, deallocate: bool) -> Access {
        match self {
            Backend::File(f) => Access::Submit(BackendOp::Ring(f.zero(offset, len, deallocate))),
            Backend::Rbd(r) => r.zero(offset, len, deallocate),
            Backend::Memory(m) => Access::Done(m.zero(offset, len)),
            Backend::Null => Access::Done(Ok(())),
        }
    }

    /// Whether a write with FUA needs a flush after it to be durable.
    pub fn flush_after_fua(&self) -> bool {
        matches!(self, Backend::Rbd(_))
    }

    /// Whether the namespace can take I/O: an RBD image once it is open;
    /// the others always.
    pub fn is_ready(&self) -> bool {
        match self {
            Backend::Rbd(r) => r.is_open(),
            Backend::File(_) | Backend::Memory(_) | Backend::Null => true,
        }
    }

    /// Bytes the backend can hold without being opened again: a memory
    /// namespace's reservation; no limit for the others.
    pub fn capacity(&self) -> u64 {
        match self {
            Backend::Memory(m) => m.capacity(),
            Backend::File(_) | Backend::Rbd(_) | Backend::Null => u64::MAX,
        }
    }

    /// Whether the backend was opened for writing.
    pub fn writable(&self) -> bool {
        match self {
            Backend::File(f) => f.writable(),
            Backend::Rbd(r) => r.writable(),
            Backend::Memory(_) | Backend::Null => true,
        }
    }

    /// The size of the storage now (a file may have been grown since it
    /// was opened, an image resized); memory and null backends have no
    /// size of their own, nor has an image not open yet.
    pub fn current_size(&self) -> std::io::Result<u64> {
        match self {
            Backend::File(f) => f.current_size(),
            Backend::Rbd(r) => r.current_size(),
            Backend::Memory(_) | Backend::Null => Ok(0),
        }
    }

    /// Whether writes may sit in a volatile cache until Flush.
    pub fn volatile_cache(&self) -> bool {
        matches!(self, Backend::File(_))
    }

    /// Makes everything written so far durable, blocking: used at shutdown.
    pub fn sync_all(&self) -> std::io::Result<()> {
        match self {
            Backend::File(f) => f.sync(),
            Backend::Rbd(r) => r.sync(),
            Backend::Memory(_) | Backend::Null => Ok(()),
        }
    }

    /// Lets go of what others wait for (an RBD image's watch and lock) at
    /// the end of shutdown, once the pollers ended: no I/O is in flight and
    /// none follows.
    pub fn close(&self) {
        if let Backend::Rbd(r) = self {
            r.close();
        }
    }

    /// Short description for logs.
    pub fn describe(&self) -> String {
        match self {
            Backend::File(f) => f.describe(),
            Backend::Rbd(r) => r.describe(),
            Backend::Memory(_) => "memory".into(),
            Backend::Null => "null".into(),
        }
    }

    /// Operations in flight that can no longer land: an RBD image's on a
    /// client the cluster blocklisted ([`RbdBackend::stranded_ops`]).
    pub fn stranded_ops(&self) -> usize {
        match self {
            Backend::Rbd(r) => r.stranded_ops(),
            _ => 0,
        }
    }
}
