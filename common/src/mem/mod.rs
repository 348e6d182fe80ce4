//! The registered buffer arena: one prefaulted mapping per poller, carved by
//! a buddy allocator into 4 KiB-aligned buffers. Disk I/O (io_uring fixed
//! buffers) and network I/O use the same pages, so data is not copied
//! between them. Allocation and freeing take constant time: each order's
//! free blocks are a doubly linked list threaded through index arrays, so a
//! free buddy is unlinked without a search.
//!
//! The kernel (io_uring) and RDMA NICs read and write arena memory at any
//! time, outside Rust's knowledge. A Rust reference (`&[u8]`, `&mut [u8]`)
//! into such memory would promise the compiler that the bytes do not change
//! behind it (or that nobody else looks at them), which a device breaks. So
//! this module never forms one, not even transiently: the mapping is held
//! as a [`memmap2::MmapRaw`] (no `Deref` to a slice), I/O is submitted with
//! raw addresses ([`Arena::addr`]), and Rust code moves bytes in and out
//! only by copying ([`Arena::write`], [`Arena::read`], [`Arena::fill`],
//! [`Arena::crc32c`]), all through one audited raw-pointer routine,
//! `Arena::transfer`.

use std::io;
use std::ptr;

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

/// What `Arena::transfer` does to a range of arena bytes.
enum Transfer<'a> {
    /// Copy these bytes into the arena.
    In(&'a [u8]),
    /// Copy arena bytes out into this slice.
    Out(&'a mut [u8]),
    /// Set this many arena bytes to a value.
    Fill(u8, usize),
}

impl Transfer<'_> {
    /// Arena bytes touched.
    fn len(&self) -> usize {
        match self {
            Transfer::In(src) => src.len(),
            Transfer::Out(dst) => dst.len(),
            Transfer::Fill(_, len) => *len,
        }
    }
}

/// Bytes of the stack chunk [`Arena::crc32c`] copies through.
const CRC_CHUNK: usize = 4096;

/// A fixed-size memory region with a buddy allocator.
pub struct Arena {
    /// Raw, not `MmapMut`: an `MmapMut` is used as a slice (even its
    /// `as_ptr` goes through `Deref`), which would form a reference to the
    /// whole arena.
    map: memmap2::MmapRaw,
    /// Free blocks of each order (block size `MIN_BUF << order`).
    free: Vec<FreeList>,
    in_use: usize,
    /// Bytes of the buffers in use (their whole blocks).
    bytes_in_use: usize,
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
        let map = memmap2::MmapRaw::from(match huge_map {
            Some(m) => m,
            None => memmap2::MmapOptions::new()
                .len(size)
                .populate()
                .map_anon()?,
        });
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
            bytes_in_use: 0,
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
        self.map.len() == 0
    }

    /// Start address of the mapping, for registration with io_uring or a NIC.
    /// It comes straight from `mmap` (no reference in between), so it may be
    /// written through.
    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    /// Number of buffers handed out and not yet freed.
    pub fn buffers_in_use(&self) -> usize {
        self.in_use
    }

    /// Bytes of the buffers handed out and not yet freed.
    pub fn bytes_in_use(&self) -> usize {
        self.bytes_in_use
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
        self.bytes_in_use += MIN_BUF << want;
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
        self.bytes_in_use -= MIN_BUF << buf.order;
    }

    /// Copies `src` into `buf` from its byte `at` on.
    ///
    /// # Panics
    /// When `at + src.len()` exceeds the buffer's capacity.
    pub fn write(&mut self, buf: &ArenaBuf, at: usize, src: &[u8]) {
        // SAFETY: `&mut self`: no other Rust code reads or writes the arena
        // during the copy (see `transfer`).
        unsafe { self.transfer(buf, at, Transfer::In(src)) }
    }

    /// Copies `dst.len()` bytes of `buf` from its byte `at` on into `dst`.
    ///
    /// # Panics
    /// When `at + dst.len()` exceeds the buffer's capacity.
    pub fn read(&self, buf: &ArenaBuf, at: usize, dst: &mut [u8]) {
        // SAFETY: only reads the arena, which `&self` allows (see `transfer`).
        unsafe { self.transfer(buf, at, Transfer::Out(dst)) }
    }

    /// Sets `len` bytes of `buf` from its byte `at` on to `byte`.
    ///
    /// # Panics
    /// When `at + len` exceeds the buffer's capacity.
    pub fn fill(&mut self, buf: &ArenaBuf, at: usize, len: usize, byte: u8) {
        // SAFETY: `&mut self`, as in `write`.
        unsafe { self.transfer(buf, at, Transfer::Fill(byte, len)) }
    }

    /// CRC32C of `len` bytes of `buf` from its byte `at` on (an NVMe/TCP
    /// data digest is its little-endian bytes). The bytes are copied through
    /// a stack chunk, so no slice of the arena is formed.
    ///
    /// # Panics
    /// When `at + len` exceeds the buffer's capacity.
    pub fn crc32c(&self, buf: &ArenaBuf, at: usize, len: usize) -> u32 {
        let offset = self.check(buf, at, len);
        // SAFETY: `offset + len` lies inside the mapping (`check`), which
        // stays mapped while `self` lives; the pointer comes from `mmap`.
        unsafe { crc32c_raw(self.base().add(offset), len) }
    }

    /// Panics unless bytes `at..at + len` of `buf` lie inside both the
    /// buffer and this arena's mapping. Returns the offset of byte `at` from
    /// the start of the mapping.
    fn check(&self, buf: &ArenaBuf, at: usize, len: usize) -> usize {
        let end = at.checked_add(len);
        assert!(
            end.is_some_and(|end| end <= buf.capacity()),
            "arena access of {len} bytes at {at} past the {}-byte buffer",
            buf.capacity()
        );
        // Holds for buffers of this arena; a buffer of another (larger)
        // arena must not reach past this mapping.
        assert!(
            buf.offset + buf.capacity() <= self.map.len(),
            "buffer at {} does not belong to this {}-byte arena",
            buf.offset,
            self.map.len()
        );
        buf.offset + at
    }

    /// The one routine that touches arena memory from Rust: copies between
    /// bytes `at..at + t.len()` of `buf` and ordinary memory, or fills them.
    ///
    /// # Safety
    /// When `t` writes the arena (`In`, `Fill`), the caller holds the arena
    /// exclusively (`&mut Arena`), so that this copy does not race with any
    /// other Rust access to arena memory. (Every access goes through this
    /// routine, and reads need `&Arena`.) Nothing else is required: bounds
    /// are checked here.
    unsafe fn transfer(&self, buf: &ArenaBuf, at: usize, t: Transfer<'_>) {
        let len = t.len();
        let offset = self.check(buf, at, len);
        if len == 0 {
            return;
        }
        // SAFETY: `offset + len <= self.map.len()` (`check`), and the
        // mapping is one allocated object of that length, so the pointer
        // stays inside it.
        let arena = unsafe { self.base().add(offset) };
        // SAFETY: (all three arms)
        // - Validity of the arena side: `arena..arena + len` lies inside the
        //   mapping (`check`), which stays mapped, readable and writable
        //   while `self` lives (it is unmapped only when the Arena drops).
        //   `base` comes from `mmap` itself, not from a reference, so the
        //   pointer may be written through. Any byte is a valid `u8`, so
        //   alignment and initialisation are no concern (the mapping is
        //   zero-filled anonymous memory from the start).
        // - Validity of the other side: it is a Rust slice of exactly `len`
        //   bytes, shared for `In` (read only) and exclusive for `Out`
        //   (written only).
        // - No overlap: this module never forms a reference into the
        //   mapping, so a Rust slice lies outside it (one could only be made
        //   from `base`/`addr` by other `unsafe` code, which would itself
        //   break the arena's rule and answer for it).
        // - No Rust-level data race: writers hold `&mut Arena` (this
        //   function's contract), readers `&Arena`.
        // - Devices: the kernel or a NIC may write these bytes during the
        //   copy when the caller copies a buffer with I/O in flight. No
        //   reference asserts anything about them, so the compiler assumes
        //   nothing beyond this one copy: the outcome is only which bytes
        //   are read or survive (the caller's protocol orders I/O and
        //   copies), the same stance rust-vmm's vm-memory takes for guest
        //   memory.
        unsafe {
            match t {
                Transfer::In(src) => ptr::copy_nonoverlapping(src.as_ptr(), arena, len),
                Transfer::Out(dst) => ptr::copy_nonoverlapping(arena, dst.as_mut_ptr(), len),
                Transfer::Fill(byte, _) => ptr::write_bytes(arena, byte, len),
            }
        }
    }

    /// Address of byte `at` of a buffer, for I/O submitted to the kernel.
    pub fn addr(&self, buf: &ArenaBuf, at: usize) -> *mut u8 {
        assert!(at <= buf.capacity());
        self.base().wrapping_add(buf.offset + at)
    }
}

/// CRC32C of `len` bytes at `ptr` in memory a device or the kernel may
/// write (an arena, a caller's I/O buffer): copied through a stack chunk,
/// so no Rust reference into that memory is ever formed.
///
/// # Safety
/// `ptr..ptr + len` is valid for reads during the call.
pub unsafe fn crc32c_raw(ptr: *const u8, len: usize) -> u32 {
    let mut chunk = [0u8; CRC_CHUNK];
    let mut crc = 0;
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CRC_CHUNK);
        // SAFETY: `done + n <= len`, so the source lies in the range the
        // caller vouches for; `chunk` is ours and holds `n` bytes; the two
        // cannot overlap (one is on this stack frame). Bytes a device writes
        // meanwhile only change which bytes are summed, as in `transfer`.
        unsafe { ptr::copy_nonoverlapping(ptr.add(done), chunk.as_mut_ptr(), n) };
        crc = crc32c::crc32c_append(crc, &chunk[..n]);
        done += n;
    }
    crc
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
        a.fill(&b, 0, 4096, 7);
        let mut last = [0u8; 1];
        a.read(&b, 4095, &mut last);
        assert_eq!(last, [7]);
        a.free(b);
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn write_read_round_trip() {
        let mut a = Arena::new(MAX_BUF, false).unwrap();
        let b = a.alloc(3 * MIN_BUF).unwrap();
        let c = a.alloc(MIN_BUF).unwrap();
        assert_eq!(b.capacity(), 4 * MIN_BUF);
        a.fill(&c, 0, MIN_BUF, 0xee);
        let data = pattern(10_000, 3);
        a.write(&b, 777, &data);
        let mut back = vec![0u8; data.len()];
        a.read(&b, 777, &mut back);
        assert_eq!(back, data);
        // Up to the last byte of the buffer, and empty copies at its end.
        a.write(&b, b.capacity() - 3, b"xyz");
        let mut tail = [0u8; 3];
        a.read(&b, b.capacity() - 3, &mut tail);
        assert_eq!(&tail, b"xyz");
        a.write(&b, b.capacity(), &[]);
        a.read(&b, b.capacity(), &mut []);
        // The neighbouring buffer is untouched.
        let mut other = vec![0u8; MIN_BUF];
        a.read(&c, 0, &mut other);
        assert!(other.iter().all(|&x| x == 0xee));
        a.free(b);
        a.free(c);
    }

    #[test]
    fn fill_sets_only_the_range() {
        let mut a = Arena::new(MAX_BUF, false).unwrap();
        let b = a.alloc(MIN_BUF).unwrap();
        a.fill(&b, 0, MIN_BUF, 1);
        a.fill(&b, 100, 50, 0);
        let mut out = vec![0u8; MIN_BUF];
        a.read(&b, 0, &mut out);
        for (i, &x) in out.iter().enumerate() {
            assert_eq!(x, u8::from(!(100..150).contains(&i)), "byte {i}");
        }
        a.free(b);
    }

    #[test]
    fn crc32c_matches_the_bytes() {
        let mut a = Arena::new(MAX_BUF, false).unwrap();
        let b = a.alloc(64 << 10).unwrap();
        let data = pattern(b.capacity(), 9);
        a.write(&b, 0, &data);
        // Lengths below, at and across the copy chunk, at odd offsets.
        for (at, len) in [
            (0, 0),
            (0, 1),
            (5, 100),
            (0, CRC_CHUNK),
            (3, CRC_CHUNK + 1),
            (1000, 3 * CRC_CHUNK + 17),
            (0, b.capacity()),
        ] {
            assert_eq!(
                a.crc32c(&b, at, len),
                crc32c::crc32c(&data[at..at + len]),
                "at {at} len {len}"
            );
        }
        a.free(b);
    }

    #[test]
    #[should_panic(expected = "past the 4096-byte buffer")]
    fn write_past_capacity_panics() {
        let mut a = Arena::new(MAX_BUF, false).unwrap();
        let b = a.alloc(MIN_BUF).unwrap();
        a.write(&b, MIN_BUF - 1, &[1, 2]);
    }

    #[test]
    #[should_panic(expected = "past the 4096-byte buffer")]
    fn read_past_capacity_panics() {
        let mut a = Arena::new(MAX_BUF, false).unwrap();
        let b = a.alloc(MIN_BUF).unwrap();
        a.read(&b, MIN_BUF + 1, &mut []);
    }

    #[test]
    #[should_panic(expected = "past the 4096-byte buffer")]
    fn fill_with_overflowing_range_panics() {
        let mut a = Arena::new(MAX_BUF, false).unwrap();
        let b = a.alloc(MIN_BUF).unwrap();
        a.fill(&b, 1, usize::MAX, 0);
    }

    #[test]
    #[should_panic(expected = "past the 4096-byte buffer")]
    fn crc32c_past_capacity_panics() {
        let mut a = Arena::new(MAX_BUF, false).unwrap();
        let b = a.alloc(MIN_BUF).unwrap();
        a.crc32c(&b, 0, MIN_BUF + 1);
    }

    #[test]
    #[should_panic(expected = "does not belong to this")]
    fn buffer_of_a_larger_arena_panics() {
        let mut big = Arena::new(2 * MAX_BUF, false).unwrap();
        let (x, y) = (big.alloc(MAX_BUF).unwrap(), big.alloc(MAX_BUF).unwrap());
        let upper = if x.offset() > y.offset() { x } else { y };
        assert_eq!(upper.offset(), MAX_BUF);
        let small = Arena::new(MAX_BUF, false).unwrap();
        small.read(&upper, 0, &mut [0u8; 1]);
    }
}
