//! The io_uring every I/O thread runs on (the target's pollers, the host's
//! engines): a ring with a buffer arena registered as fixed buffer 0, the
//! operations waiting to be pushed, and an eventfd other threads wake it with.

use crate::mem::Arena;
use io_uring::{opcode, squeue, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// Index of the arena among the ring's registered buffers.
pub const ARENA_BUF_INDEX: u16 = 0;

/// An io_uring operation a ring's user submits: its opcode and its name
/// for the error that says the kernel lacks it.
#[derive(Clone, Copy, Debug)]
pub struct Op(pub u8, pub &'static str);

/// The operations every ring here uses (waking, ticks, cancelling).
pub const COMMON_OPS: [Op; 3] = [
    Op(opcode::PollAdd::CODE, "POLL_ADD"),
    Op(opcode::Timeout::CODE, "TIMEOUT"),
    Op(opcode::AsyncCancel::CODE, "ASYNC_CANCEL"),
];

/// A ring and its registered arena.
pub struct Ring {
    // Field order matters: the ring (and its registration) goes before the
    // arena it points into.
    ring: IoUring,
    /// Data buffers, registered with the ring.
    pub arena: Arena,
    /// Operations to push at the next submit: queued only through
    /// [`Submissions::push`].
    pending: Vec<squeue::Entry>,
    /// Completions' task work runs only when we ask for completions
    /// (DEFER_TASKRUN); the ring was created disabled, for the thread that
    /// first submits.
    deferred: bool,
    /// Whether that thread has enabled it.
    enabled: bool,
}

impl Ring {
    /// A ring of `entries` and an arena of `arena_bytes`, registered. The
    /// kernel must not drop completions (IORING_FEAT_NODROP) and must know
    /// [`COMMON_OPS`] and `ops`: a clear error says what is missing, at
    /// start rather than at the first I/O.
    pub fn new(entries: u32, arena_bytes: usize, ops: &[Op]) -> io::Result<Ring> {
        let (ring, deferred) = build(entries)?;
        check_kernel(&ring, ops)?;
        let arena = Arena::new(arena_bytes, true)?;
        let iov = libc::iovec {
            iov_base: arena.base().cast(),
            iov_len: arena.len(),
        };
        // SAFETY: the iovec describes the arena's mapping, which lives in the
        // same Ring and is dropped after the ring and its registration.
        unsafe { ring.submitter().register_buffers(&[iov]) }.map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("registering a {arena_bytes}-byte buffer arena with io_uring: {e}"),
            )
        })?;
        Ok(Ring {
            ring,
            arena,
            pending: Vec::new(),
            deferred,
            enabled: !deferred,
        })
    }

    /// Where operations are queued for the next submit.
    #[inline]
    pub fn submissions(&mut self) -> Submissions<'_> {
        Submissions(&mut self.pending)
    }

    /// The arena and [`Ring::submissions`] at once, for code that fills
    /// buffers and queues the operations that use them.
    #[inline]
    pub fn arena_and_submissions(&mut self) -> (&mut Arena, Submissions<'_>) {
        (&mut self.arena, Submissions(&mut self.pending))
    }

    /// Pushes the pending operations and waits for at least one completion
    /// (an interrupted wait returns early).
    ///
    /// # Safety
    /// Every pending operation's memory (buffers, message headers, timespecs)
    /// must stay valid and in place until its completion is reaped: what
    /// each caller of [`Submissions::push`] argued, which holds as long as
    /// the memory's owners are not dropped or moved meanwhile.
    pub unsafe fn submit_and_wait(&mut self) -> io::Result<()> {
        // SAFETY: the caller's guarantee, as for this function.
        unsafe { self.submit_and_wait_for(1) }
    }

    /// Pushes the pending operations and posts the completions that are
    /// ready, without waiting (busy polling). With nothing to push and no
    /// deferred completion waiting, this makes no system call.
    ///
    /// # Safety
    /// As [`Ring::submit_and_wait`].
    pub unsafe fn submit(&mut self) -> io::Result<()> {
        if self.deferred && self.enabled && self.pending.is_empty() {
            let sq = self.ring.submission();
            if !sq.taskrun() && !sq.cq_overflow() {
                return Ok(());
            }
        }
        // SAFETY: the caller's guarantee, as for this function.
        unsafe { self.submit_and_wait_for(0) }
    }

    /// # Safety
    /// As [`Ring::submit_and_wait`].
    unsafe fn submit_and_wait_for(&mut self, want: usize) -> io::Result<()> {
        if !self.enabled {
            // The calling thread becomes the ring's only submitter.
            self.ring.submitter().register_enable_rings()?;
            self.enabled = true;
        }
        for e in self.pending.drain(..) {
            // SAFETY: the caller keeps the operation's memory valid (above).
            while unsafe { self.ring.submission().push(&e) }.is_err() {
                self.ring.submit()?;
            }
        }
        match self.ring.submit_and_wait(want) {
            Err(e) if !matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Moves the completions that arrived into `out` as (user data, result).
    pub fn reap(&mut self, out: &mut Vec<(u64, i32)>) {
        out.extend(self.ring.completion().map(|c| (c.user_data(), c.result())));
    }
}

/// Operations to push to a ring at its next submit. Queueing one is unsafe:
/// the kernel reads and writes what it points to until its completion is
/// reaped, so each caller argues, where it queues, that the memory stays
/// valid and in place until then.
pub struct Submissions<'a>(&'a mut Vec<squeue::Entry>);

impl<'a> Submissions<'a> {
    /// Operations to be appended to `pending`: a ring's are lent by
    /// [`Ring::submissions`]; a test without a ring collects them here.
    #[inline]
    pub fn new(pending: &'a mut Vec<squeue::Entry>) -> Self {
        Submissions(pending)
    }

    /// Queues `e`.
    ///
    /// # Safety
    /// Every buffer, iovec, message header or timespec `e` points to stays
    /// valid and in place until the completion carrying `e`'s user data has
    /// been reaped.
    #[inline]
    pub unsafe fn push(&mut self, e: squeue::Entry) {
        self.0.push(e);
    }
}

/// A ring for one thread: completions' task work runs when that thread
/// asks for completions (DEFER_TASKRUN) rather than interrupting it, so a
/// peer on loopback whose data completes our receive does not pay for an
/// inter-processor interrupt, and a burst of completions wakes us once.
/// The ring starts disabled, so that the thread that creates it need not be
/// the one that runs it. Kernels before 6.1 get a plain ring. Returns the
/// ring and whether it defers task work (and starts disabled).
fn build(entries: u32) -> io::Result<(IoUring, bool)> {
    let single = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .setup_r_disabled()
        .build(entries);
    match single {
        Ok(ring) => Ok((ring, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            Ok((IoUring::builder().build(entries)?, false))
        }
        Err(e) => Err(e),
    }
}

/// Checks what the ring's users rely on: completions are never dropped
/// when the completion queue is full, and every operation is supported.
fn check_kernel(ring: &IoUring, ops: &[Op]) -> io::Result<()> {
    let unsupported = |what: String| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            format!("this kernel's io_uring lacks {what}; Linux 6.0 or later is needed"),
        )
    };
    if !ring.params().is_feature_nodrop() {
        return Err(unsupported("IORING_FEAT_NODROP".into()));
    }
    let mut probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| io::Error::new(e.kind(), format!("probing io_uring operations: {e}")))?;
    let missing: Vec<&str> = COMMON_OPS
        .iter()
        .chain(ops)
        .filter(|op| !probe.is_supported(op.0))
        .map(|op| op.1)
        .collect();
    if !missing.is_empty() {
        return Err(unsupported(format!(
            "IORING_OP_{}",
            missing.join(", IORING_OP_")
        )));
    }
    Ok(())
}

/// An eventfd that wakes a ring: a poll on it completes when another thread
/// calls [`Wakeup::wake`].
#[derive(Clone)]
pub struct Wakeup(Arc<OwnedFd>);

impl Wakeup {
    pub fn new() -> io::Result<Wakeup> {
        // SAFETY: eventfd returns a new descriptor, or -1.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        Ok(Wakeup(Arc::new(unsafe { OwnedFd::from_raw_fd(raw) })))
    }

    pub fn wake(&self) {
        // Fails only if the counter would overflow, which draining prevents.
        // SAFETY: writes 8 bytes from a valid buffer to our own descriptor.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), 1u64.to_ne_bytes().as_ptr().cast(), 8) };
    }

    /// Resets the counter after a wake-up (the descriptor is readable then).
    pub fn drain(&self) {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a valid buffer from our own descriptor.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
    }

    /// The poll operation to queue; re-queue it after each completion.
    pub fn poll(&self, user_data: u64) -> squeue::Entry {
        opcode::PollAdd::new(types::Fd(self.0.as_raw_fd()), libc::POLLIN as u32)
            .build()
            .user_data(user_data)
    }
}
