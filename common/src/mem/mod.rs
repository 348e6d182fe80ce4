//! The registered buffer arena: one prefaulted mapping per poller, carved by
//! a buddy allocator into 4 KiB-aligned buffers. Disk I/O (io_uring fixed
//! buffers) and network I/O use the same pages, so data is not copied
//! between them. Allocation and freeing take constant time: each order's
//! free blocks are a doubly linked list threaded through index arrays, so a
//! free buddy is unlinked without a search.

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

/// No block: the end of a free list.
const NIL: u32 = u32::MAX;

/// The free blocks of one order, by index (offset / block size).
struct FreeList {
    head: u32,
    next: Vec<u32>,
    prev: Vec<u32>,
    free: Vec<bool>,
    len: usize,
}

impl FreeList {
    /// A list for `blocks` blocks, none free.
    fn new(blocks: usize) -> FreeList {
        FreeList {
            head: NIL,
            next: vec![NIL; blocks],
            prev: vec![NIL; blocks],
            free: vec![false; blocks],
            len: 0,
        }
    }

    fn contains(&self, i: usize) -> bool {
        self.free[i]
    }

    fn push(&mut self, i: usize) {
        debug_assert!(!self.free[i], "block freed twice");
        self.free[i] = true;
        self.prev[i] = NIL;
        self.next[i] = self.head;
        if self.head != NIL {
            self.prev[self.head as usize] = i as u32;
        }
        self.head = i as u32;
        self.len += 1;
    }

    fn remove(&mut self, i: usize) {
        debug_assert!(self.free[i], "unlinking a block that is not free");
        let (p, n) = (self.prev[i], self.next[i]);
        match p {
            NIL => self.head = n,
            p => self.next[p as usize] = n,
        }
        if n != NIL {
            self.prev[n as usize] = p;
        }
        self.free[i] = false;
        self.len -= 1;
    }

    fn pop(&mut self) -> Option<usize> {
        let i = (self.head != NIL).then_some(self.head as usize)?;
        self.remove(i);
        Some(i)
    }
}

/// A fixed-size memory region with a buddy allocator.
pub struct Arena {
    map: memmap2::MmapMut,
    /// Free blocks of each order (block size `MIN_BUF << order`).
    free: Vec<FreeList>,
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
        let mut free: Vec<FreeList> = (0..=MAX_ORDER)
            .map(|o| FreeList::new(size / (MIN_BUF << o)))
            .collect();
        for i in 0..size / MAX_BUF {
            free[MAX_ORDER].push(i);
        }
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
        let have = (want..=MAX_ORDER).find(|&o| self.free[o].len > 0)?;
        let offset = self.free[have].pop()? * (MIN_BUF << have);
        // Split down to the wanted order, freeing the upper halves.
        for o in (want..have).rev() {
            let upper = offset + (MIN_BUF << o);
            self.free[o].push(upper / (MIN_BUF << o));
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
            let size = MIN_BUF << order;
            let buddy = (offset ^ size) / size;
            if !self.free[order].contains(buddy) {
                break;
            }
            self.free[order].remove(buddy);
            offset &= !size;
            order += 1;
        }
        self.free[order].push(offset / (MIN_BUF << order));
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
        assert_eq!(a.free[MAX_ORDER].len, 2);
        assert!(a.free[..MAX_ORDER].iter().all(|s| s.len == 0));
    }

    #[test]
    fn random_alloc_and_free_never_overlap_and_coalesce() {
        let mut a = Arena::new(16 << 20, false).unwrap();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut live: Vec<ArenaBuf> = Vec::new();
        for _ in 0..20_000 {
            if rand() % 3 != 0 || live.is_empty() {
                let len = (1 + (rand() % (1 << 20)) as usize) >> (rand() % 10);
                if let Some(b) = a.alloc(len) {
                    assert!(b.capacity() >= len);
                    for o in &live {
                        let (s, e) = (o.offset(), o.offset() + o.capacity());
                        assert!(b.offset() + b.capacity() <= s || b.offset() >= e);
                    }
                    live.push(b);
                }
            } else {
                let i = (rand() as usize) % live.len();
                a.free(live.swap_remove(i));
            }
        }
        for b in live {
            a.free(b);
        }
        assert_eq!(a.buffers_in_use(), 0);
        assert_eq!(a.free[MAX_ORDER].len, 4, "everything merged back");
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
