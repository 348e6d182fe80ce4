//! Namespace backends: a file or block device (io_uring, O_DIRECT, fixed
//! buffers), memory, and null. A backend turns an I/O request into either an
//! immediate result or an io_uring operation for the poller to submit.

mod file;
mod memory;

pub use file::FileBackend;
pub use memory::MemoryBackend;

use io_uring::squeue;
use rdmablk_common::nvme::Status;

/// What a backend does with one request.
pub enum Access {
    /// Finished synchronously (memory, null, or refused).
    Done(Result<(), Status>),
    /// Submit this to the poller's ring; the completion finishes the request.
    Submit(squeue::Entry),
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
    /// Discards writes, reads zeroes: for measuring the transport alone.
    Null,
}

impl Backend {
    /// Reads `buf.len` bytes at byte `offset` into `buf`.
    pub fn read(&self, offset: u64, buf: FixedBuf) -> Access {
        match self {
            Backend::File(f) => Access::Submit(f.read(offset, buf)),
            Backend::Memory(m) => Access::Done(m.read(offset, buf)),
            Backend::Null => {
                // SAFETY: `buf` is an arena buffer of at least `len` bytes that this
                // request owns exclusively until it completes.
                unsafe { std::ptr::write_bytes(buf.ptr, 0, buf.len) };
                Access::Done(Ok(()))
            }
        }
    }

    /// Writes `buf` at byte `offset`; `fua` makes it durable before completion.
    pub fn write(&self, offset: u64, buf: FixedBuf, fua: bool) -> Access {
        match self {
            Backend::File(f) => Access::Submit(f.write(offset, buf, fua)),
            Backend::Memory(m) => Access::Done(m.write(offset, buf)),
            Backend::Null => Access::Done(Ok(())),
        }
    }

    /// Makes completed writes durable.
    pub fn flush(&self) -> Access {
        match self {
            Backend::File(f) => Access::Submit(f.flush()),
            Backend::Memory(_) | Backend::Null => Access::Done(Ok(())),
        }
    }

    /// Makes `len` bytes at `offset` read back as zeroes; `deallocate` allows
    /// freeing the space (hole punch / discard) rather than writing zeroes.
    pub fn zero(&self, offset: u64, len: u64, deallocate: bool) -> Access {
        match self {
            Backend::File(f) => Access::Submit(f.zero(offset, len, deallocate)),
            Backend::Memory(m) => Access::Done(m.zero(offset, len)),
            Backend::Null => Access::Done(Ok(())),
        }
    }

    /// Bytes the backend can hold without being opened again: a memory
    /// namespace's reservation; no limit for the others.
    pub fn capacity(&self) -> u64 {
        match self {
            Backend::Memory(m) => m.capacity(),
            Backend::File(_) | Backend::Null => u64::MAX,
        }
    }

    /// Whether the backend was opened for writing.
    pub fn writable(&self) -> bool {
        match self {
            Backend::File(f) => f.writable(),
            Backend::Memory(_) | Backend::Null => true,
        }
    }

    /// The size of the storage now (a file may have been grown since it
    /// was opened); memory and null backends have no size of their own.
    pub fn current_size(&self) -> std::io::Result<u64> {
        match self {
            Backend::File(f) => f.current_size(),
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
            Backend::Memory(_) | Backend::Null => Ok(()),
        }
    }

    /// Short description for logs.
    pub fn describe(&self) -> String {
        match self {
            Backend::File(f) => f.describe(),
            Backend::Memory(_) => "memory".into(),
            Backend::Null => "null".into(),
        }
    }
}
