//! A ublk queue's request descriptors: the read-only mapping of the char
//! device where the kernel describes each tag's request.

use libublk::sys;
use nix::unistd::{sysconf, SysconfVar};
use std::os::fd::RawFd;

fn page_round(n: usize) -> usize {
    let page = sysconf(SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(0)
        .max(4096) as usize;
    n.next_multiple_of(page)
}

/// The descriptors of one queue's tags, mapped from its char device.
pub(super) struct Descriptors {
    ptr: *const sys::ublksrv_io_desc,
    len: usize,
    depth: u16,
}

// SAFETY: the mapping is only read, by the engine thread that owns the
// driver; it moves to that thread once, before use.
unsafe impl Send for Descriptors {}

impl Descriptors {
    /// Maps the descriptors of the `depth` tags of queue `q_id` of `cdev`.
    pub(super) fn map(cdev: RawFd, q_id: u16, depth: u16) -> Result<Descriptors, String> {
        let desc = std::mem::size_of::<sys::ublksrv_io_desc>();
        let len = page_round(depth as usize * desc);
        let offset = sys::UBLKSRV_CMD_BUF_OFFSET as usize
            + q_id as usize * page_round(sys::UBLK_MAX_QUEUE_DEPTH as usize * desc);
        // SAFETY: a read-only shared mapping of the char device at the
        // offset the ublk driver defines for this queue; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                cdev,
                offset as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "mapping ublk queue {q_id}'s descriptors: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Descriptors {
            ptr: p as *const sys::ublksrv_io_desc,
            len,
            depth,
        })
    }

    /// The descriptor of `tag`, as the kernel last wrote it (before
    /// completing the tag's fetch).
    ///
    /// # Panics
    /// When `tag` is not below the queue's depth.
    pub(super) fn get(&self, tag: u16) -> sys::ublksrv_io_desc {
        assert!(tag < self.depth, "ublk tag {tag} past the queue's depth");
        // SAFETY: `tag < depth`, so the descriptor lies in the mapping, which
        // lives as long as `self`; the kernel writes it, so it is read
        // volatile, by value.
        unsafe { std::ptr::read_volatile(self.ptr.add(tag as usize)) }
    }
}

impl Drop for Descriptors {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in `map`, once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}
