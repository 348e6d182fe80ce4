//! A namespace held in anonymous memory, shared by all pollers.

use super::FixedBuf;
use rdmablk_common::nvme::Status;

/// Anonymous memory, zero at start, lost at exit.
pub struct MemoryBackend {
    map: memmap2::MmapRaw,
}

impl MemoryBackend {
    /// Maps `reserve` bytes (at least `size`) lazily: pages appear on first
    /// write, so the namespace can grow to `reserve` without moving.
    pub fn new(size: u64, reserve: u64) -> std::io::Result<Self> {
        let len = usize::try_from(size.max(reserve))
            .map_err(|_| std::io::Error::other("memory namespace too large"))?;
        // Address space only: the reservation beyond `size` is not charged
        // against memory until written (MAP_NORESERVE).
        let map = memmap2::MmapOptions::new()
            .len(len)
            .no_reserve_swap()
            .map_anon()?
            .into();
        Ok(MemoryBackend { map })
    }

    /// Bytes mapped: how far the namespace can grow.
    pub fn capacity(&self) -> u64 {
        self.map.len() as u64
    }

    fn check(&self, offset: u64, len: usize) -> Result<usize, Status> {
        let off = usize::try_from(offset).map_err(|_| Status::LBA_OUT_OF_RANGE)?;
        match off.checked_add(len) {
            Some(end) if end <= self.map.len() => Ok(off),
            _ => Err(Status::LBA_OUT_OF_RANGE),
        }
    }

    pub fn read(&self, offset: u64, buf: FixedBuf) -> Result<(), Status> {
        let off = self.check(offset, buf.len)?;
        // SAFETY: the range was checked to lie inside the mapping, and `buf` is an
        // arena buffer of `len` bytes owned by this request. Concurrent writers to
        // the same range race as they would on a disk: the host orders its I/O.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(off), buf.ptr, buf.len) };
        Ok(())
    }

    pub fn write(&self, offset: u64, buf: FixedBuf) -> Result<(), Status> {
        let off = self.check(offset, buf.len)?;
        // SAFETY: as in `read`, with the copy going the other way.
        unsafe { std::ptr::copy_nonoverlapping(buf.ptr, self.map.as_mut_ptr().add(off), buf.len) };
        Ok(())
    }

    /// Zeroes a range: whole pages are given back to the kernel (they read as
    /// zero afterwards), partial pages at the edges are cleared.
    pub fn zero(&self, offset: u64, len: u64) -> Result<(), Status> {
        let len = usize::try_from(len).map_err(|_| Status::LBA_OUT_OF_RANGE)?;
        let off = self.check(offset, len)?;
        let page = 4096;
        let (start, end) = (off, off + len);
        let (inner_start, inner_end) = (start.next_multiple_of(page), end / page * page);
        let base = self.map.as_mut_ptr();
        if inner_start < inner_end {
            // SAFETY: [start, end) lies inside the mapping (checked above).
            unsafe {
                std::ptr::write_bytes(base.add(start), 0, inner_start - start);
                std::ptr::write_bytes(base.add(inner_end), 0, end - inner_end);
                libc::madvise(
                    base.add(inner_start).cast(),
                    inner_end - inner_start,
                    libc::MADV_DONTNEED,
                );
            }
        } else {
            // SAFETY: [start, end) lies inside the mapping (checked above).
            unsafe { std::ptr::write_bytes(base.add(start), 0, len) };
        }
        Ok(())
    }
}
