//! The registered buffer arena: one prefaulted mapping per poller, carved by
//! a buddy allocator into 4 KiB-aligned buffers. Disk I/O (io_uring fixed
//! buffers) and network I/O use the same pages, so data is not copied
//! between them.

use std::collections::HashSet;
use std::io;

/// Smallest buffer, and the alignment of every buffer (O_DIRECT needs it).
pub const MIN_BUF: usize = 4096;
/// Largest single buffer.
pub const MAX_BUF: usize = 4 << 20;
const MIN_SHIFT: u32 = MIN_BUF.trailing_zeros();
const MAX_ORDER: usize = (MAX_BUF.trailing_zeros() - MIN_SHIFT) as usize;

/// A buffer taken from an [`Arena`]. It names a region; the arena owns the
/// memory. Give it back with [`Arena::free`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an arena buffer must be returned with Arena::free"]
pub struct ArenaBuf {
    offset: usize,
    order: u8,
}

impl ArenaBuf {
    /// Offset of the buffer from the start of the arena.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Capacity in bytes (a power of two, at least [`MIN_BUF`]).
    pub fn capacity(&self) -> usize {
        MIN_BUF << self.order
    }
}

/// A fixed-size memory region with a buddy allocator.
pub struct Arena {
    map: memmap2::MmapMut,
    free: Vec<HashSet<usize>>,
    in_use: usize,
    huge: bool,
}

impl Arena {
    /// Maps and prefaults `size` bytes (rounded down to [`MAX_BUF`] blocks, at
    /// least one), trying huge pages first when `hugetlb` is set.
    pub fn new(size: usize, hugetlb: bool) -> io::Result<Arena> {
        let size = (size / MAX_BUF).max(1) * MAX_BUF;
        let huge_map = if hugetlb {
            memmap2::MmapOptions::new()
                .len(size)
                .huge(Some(21))
                .populate()
                .map_anon()
                .ok()
        } else {
            None
        };
        let huge = huge_map.is_some();
        let map = match huge_map {
            Some(m) => m,
            None => memmap2::MmapOptions::new()
                .len(size)
                .populate()
                .map_anon()?,
        };
        let mut free = vec![HashSet::new(); MAX_ORDER + 1];
        free[MAX_ORDER] = (0..size).step_by(MAX_BUF).collect();
        Ok(Arena {
            map,
            free,
            in_use: 0,
            huge,
        })
    }

    /// Whether the mapping uses huge pages.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// Size of the arena in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Start address of the mapping, for registration with io_uring or a NIC.
    pub fn base(&self) -> *mut u8 {
        self.map.as_ptr() as *mut u8
    }

    /// Number of buffers handed out and not yet freed.
    pub fn buffers_in_use(&self) -> usize {
        self.in_use
    }

    /// A buffer of at least `len` bytes, or `None` when the arena is exhausted
    /// (or `len` exceeds [`MAX_BUF`]).
    pub fn alloc(&mut self, len: usize) -> Option<ArenaBuf> {
        if len > MAX_BUF {
            return None;
        }
        let want = order_for(len);
        let have = (want..=MAX_ORDER).find(|&o| !self.free[o].is_empty())?;
        let offset = *self.free[have].iter().next()?;
        self.free[have].remove(&offset);
        // Split down to the wanted order, freeing the upper halves.
        for o in (want..have).rev() {
            self.free[o].insert(offset + (MIN_BUF << o));
        }
        self.in_use += 1;
        Some(ArenaBuf {
            offset,
            order: want as u8,
        })
    }

    /// Returns a buffer, merging it with its free buddies.
    pub fn free(&mut self, buf: ArenaBuf) {
        let mut offset = buf.offset;
        let mut order = buf.order as usize;
        while order < MAX_ORDER {
            let buddy = offset ^ (MIN_BUF << order);
            if !self.free[order].remove(&buddy) {
                break;
            }
            offset = offset.min(buddy);
            order += 1;
        }
        self.free[order].insert(offset);
        self.in_use -= 1;
    }

    /// The first `len` bytes of a buffer.
    pub fn bytes(&self, buf: &ArenaBuf, len: usize) -> &[u8] {
        &self.map[buf.offset..buf.offset + len.min(buf.capacity())]
    }

    /// The first `len` bytes of a buffer, writable.
    pub fn bytes_mut(&mut self, buf: &ArenaBuf, len: usize) -> &mut [u8] {
        let end = buf.offset + len.min(buf.capacity());
        &mut self.map[buf.offset..end]
    }

    /// Address of byte `at` of a buffer, for I/O submitted to the kernel.
    pub fn addr(&self, buf: &ArenaBuf, at: usize) -> *mut u8 {
        assert!(at <= buf.capacity());
        self.base().wrapping_add(buf.offset + at)
    }
}

/// The capacity of the buffer [`Arena::alloc`] gives for `len` bytes.
pub fn capacity_for(len: usize) -> usize {
    MIN_BUF << order_for(len)
}

fn order_for(len: usize) -> usize {
    let blocks = len.max(1).div_ceil(MIN_BUF).next_power_of_two();
    blocks.trailing_zeros() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_coalesces_back_to_whole_blocks() {
        let mut a = Arena::new(8 << 20, false).unwrap();
        let bufs: Vec<_> = [1, 4096, 4097, 65536, 1 << 20, 3 << 20]
            .iter()
            .map(|&n| a.alloc(n).unwrap())
            .collect();
        for b in &bufs {
            assert_eq!(b.offset() % MIN_BUF, 0);
            assert_eq!(b.offset() % b.capacity(), 0);
        }
        assert_eq!(bufs[2].capacity(), 8192);
        assert_eq!(a.buffers_in_use(), 6);
        for b in bufs {
            a.free(b);
        }
        assert_eq!(a.buffers_in_use(), 0);
        assert_eq!(a.free[MAX_ORDER].len(), 2);
        assert!(a.free[..MAX_ORDER].iter().all(|s| s.is_empty()));
    }

    #[test]
    fn exhaustion_returns_none() {
        let mut a = Arena::new(MAX_BUF, false).unwrap();
        let big = a.alloc(MAX_BUF).unwrap();
        assert!(a.alloc(1).is_none());
        assert!(a.alloc(MAX_BUF + 1).is_none());
        a.free(big);
        let b = a.alloc(4096).unwrap();
        a.bytes_mut(&b, 4096).fill(7);
        assert_eq!(a.bytes(&b, 4096)[4095], 7);
        a.free(b);
    }
}
