//! The stream's two buffers: a receive buffer that PDUs are parsed from in
//! place, and a send queue that gathers PDU headers, payloads (borrowed from
//! a buffer arena) and digests into one `sendmsg`. Neither does I/O itself.

use std::collections::VecDeque;

/// A receive buffer: bytes arrive at the tail, PDUs are consumed at the head.
///
/// Its memory is an anonymous mapping of its own, not the heap: pages are
/// taken as bytes first land in them (a connection that only ever sees small
/// PDUs uses one page, as the buffer restarts at its head once drained) and
/// go back to the system when the buffer is dropped.
pub struct RxBuf {
    buf: Option<memmap2::MmapMut>,
    head: usize,
    tail: usize,
}

impl RxBuf {
    /// A buffer of `capacity` bytes; it must hold the largest PDU accepted.
    pub fn new(capacity: usize) -> std::io::Result<Self> {
        Ok(RxBuf {
            buf: Some(memmap2::MmapMut::map_anon(capacity)?),
            head: 0,
            tail: 0,
        })
    }

    /// A buffer of no capacity (a placeholder while the real one is lent out).
    pub fn empty() -> Self {
        RxBuf {
            buf: None,
            head: 0,
            tail: 0,
        }
    }

    /// Bytes the buffer holds at most.
    pub fn capacity(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }

    fn bytes(&mut self) -> &mut [u8] {
        self.buf.as_deref_mut().unwrap_or_default()
    }

    /// Where the next receive may write, compacting first when needed; an
    /// empty slice means the buffer is full of unconsumed bytes.
    pub fn spare(&mut self) -> &mut [u8] {
        let (head, tail, cap) = (self.head, self.tail, self.capacity());
        if head == tail {
            self.head = 0;
            self.tail = 0;
        } else if tail == cap {
            self.bytes().copy_within(head..tail, 0);
            self.tail -= head;
            self.head = 0;
        }
        let tail = self.tail;
        &mut self.bytes()[tail..]
    }

    /// Records that a receive wrote `n` bytes into [`RxBuf::spare`].
    pub fn filled(&mut self, n: usize) {
        self.tail = (self.tail + n).min(self.capacity());
    }

    /// The bytes received and not yet consumed.
    pub fn pending(&self) -> &[u8] {
        self.buf
            .as_deref()
            .map_or(&[][..], |b| &b[self.head..self.tail])
    }

    /// Drops `n` bytes from the front.
    pub fn consume(&mut self, n: usize) {
        self.head = (self.head + n).min(self.tail);
    }
}

/// One PDU waiting to be sent.
///
/// Pointer stability: `message` hands the kernel pointers into `head`'s heap
/// buffer (header and digest) and to `body`. The item itself may move while
/// a send is in flight (the deque grows when PDUs are pushed meanwhile), but
/// moving a `Vec` moves only its pointer, length and capacity, not the heap
/// buffer; and `head` is never changed (so never reallocated) between being
/// queued and being popped by `advance`, which happens only after the bytes
/// were sent.
struct TxItem {
    /// The PDU's leading bytes (`head_len` of them), then its data digest
    /// when it has one: the digest is sent after the body.
    head: Vec<u8>,
    head_len: usize,
    body: *const u8,
    body_len: usize,
    token: Option<u64>,
}

impl TxItem {
    fn len(&self) -> usize {
        // `head` holds the digest (if any) after the leading bytes.
        self.head.len() + self.body_len
    }
}

/// PDUs gathered into one sendmsg at most.
const MAX_BATCH: usize = 32;
/// Capacity of a new head vector.
const HEAD_CAPACITY: usize = 256;
/// Recycled head vectors kept at most.
const POOL_MAX: usize = 256;
/// Head vectors that grew beyond this are freed rather than recycled, so the
/// pool does not pin memory for a rare large PDU.
const POOL_MAX_CAPACITY: usize = 16 << 10;

/// PDUs queued for sending, in order.
///
/// In the steady state queuing allocates nothing: heads are taken from
/// [`TxQueue::buf`], which recycles the heads of PDUs already sent, and a
/// data digest travels in its PDU's head vector.
pub struct TxQueue {
    items: VecDeque<TxItem>,
    /// Bytes of the front item already sent.
    sent: usize,
    iov: Vec<libc::iovec>,
    msg: Box<libc::msghdr>,
    /// Cleared head vectors of sent PDUs, for [`TxQueue::buf`].
    pool: Vec<Vec<u8>>,
}

// SAFETY: the raw pointers are payload addresses in memory the owner keeps
// valid until the item is sent, pointers into the items' own head vectors,
// and the msghdr's pointer into `iov`; nothing is tied to the creating
// thread.
unsafe impl Send for TxQueue {}

impl Default for TxQueue {
    fn default() -> Self {
        TxQueue {
            items: VecDeque::new(),
            sent: 0,
            iov: Vec::with_capacity(MAX_BATCH * 3),
            // SAFETY: msghdr is plain old data; all zeroes is an empty header.
            msg: Box::new(unsafe { std::mem::zeroed() }),
            pool: Vec::new(),
        }
    }
}

impl TxQueue {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// An empty vector to encode a PDU's head into and hand to
    /// [`TxQueue::push`] / [`TxQueue::push_with_body`]: the head of a PDU
    /// already sent when there is one (no allocation), else a new vector with
    /// room for 256 bytes.
    pub fn buf(&mut self) -> Vec<u8> {
        self.pool
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(HEAD_CAPACITY))
    }

    /// Queues a PDU that is all in `head`. `token` is handed back by
    /// [`TxQueue::advance`] once the PDU is on the wire.
    pub fn push(&mut self, head: Vec<u8>, token: Option<u64>) {
        self.push_with_body(head, std::ptr::null(), 0, None, token);
    }

    /// Queues a PDU whose payload (`body_len` bytes at `body`) is sent from
    /// where it lies, followed by `digest` when given.
    ///
    /// The caller keeps the payload alive and unchanged until the token of
    /// this PDU, or of a later one, comes back from [`TxQueue::advance`].
    ///
    /// The digest is stored after the header bytes in `head`'s own heap
    /// buffer (grown here, before anything points at it), which stays where
    /// it is while the PDU is queued: see `TxItem`.
    pub fn push_with_body(
        &mut self,
        mut head: Vec<u8>,
        body: *const u8,
        body_len: usize,
        digest: Option<[u8; 4]>,
        token: Option<u64>,
    ) {
        let head_len = head.len();
        if let Some(d) = digest {
            // May reallocate: nothing points into `head` before `message`.
            head.extend_from_slice(&d);
        }
        self.items.push_back(TxItem {
            head,
            head_len,
            body,
            body_len,
            token,
        });
    }

    /// Builds the message header for the next sendmsg over the queued PDUs.
    ///
    /// The header and the iovecs it points to stay valid, and every address
    /// in them stays valid and unchanged, until the next call of `message` or
    /// [`TxQueue::advance`] (or the queue drops): pushing more PDUs meanwhile
    /// does not disturb them (it touches neither the iovec array nor the
    /// head vectors of queued PDUs), so PDUs may be queued while a send is in
    /// flight.
    pub fn message(&mut self) -> *const libc::msghdr {
        self.iov.clear();
        let mut skip = self.sent;
        for item in self.items.iter().take(MAX_BATCH) {
            let (head, digest) = item.head.split_at(item.head_len);
            for (ptr, len) in [
                (head.as_ptr(), head.len()),
                (item.body, item.body_len),
                (digest.as_ptr(), digest.len()),
            ] {
                if len <= skip {
                    skip -= len;
                    continue;
                }
                self.iov.push(libc::iovec {
                    iov_base: ptr.wrapping_add(skip) as *mut libc::c_void,
                    iov_len: len - skip,
                });
                skip = 0;
            }
        }
        // At most MAX_BATCH * 3 entries: `iov` never reallocates, so the
        // pointer below stays put.
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len();
        &*self.msg
    }

    /// Records that `n` bytes were sent; tokens of the PDUs now fully sent
    /// are appended to `done`, and their heads go back to the pool of
    /// [`TxQueue::buf`].
    pub fn advance(&mut self, n: usize, done: &mut Vec<u64>) {
        let mut n = n + self.sent;
        while let Some(front) = self.items.front() {
            let len = front.len();
            if n < len {
                break;
            }
            n -= len;
            let Some(item) = self.items.pop_front() else {
                break;
            };
            if let Some(t) = item.token {
                done.push(t);
            }
            self.recycle(item.head);
        }
        self.sent = n;
    }

    fn recycle(&mut self, mut head: Vec<u8>) {
        if self.pool.len() < POOL_MAX && head.capacity() <= POOL_MAX_CAPACITY {
            head.clear();
            self.pool.push(head);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rx_compacts_only_when_full() {
        let mut rx = RxBuf::new(8).unwrap();
        rx.spare()[..8].copy_from_slice(b"abcdefgh");
        rx.filled(8);
        rx.consume(6);
        assert_eq!(rx.pending(), b"gh");
        assert_eq!(rx.spare().len(), 6);
        assert_eq!(rx.pending(), b"gh");
        rx.consume(2);
        assert_eq!(rx.spare().len(), 8);
    }

    #[test]
    fn tx_gathers_and_reports_sent_tokens() {
        let body = [7u8; 10];
        let mut tx = TxQueue::default();
        tx.push(vec![1, 2, 3], None);
        tx.push_with_body(vec![4], body.as_ptr(), body.len(), Some([9; 4]), Some(42));
        // SAFETY: the header points into the queue's own iovec array.
        let iovlen = unsafe { (*tx.message()).msg_iovlen };
        assert_eq!(iovlen, 4);
        let mut done = Vec::new();
        tx.advance(5, &mut done);
        assert!(done.is_empty());
        // SAFETY: as above.
        let first = unsafe { *(*tx.message()).msg_iov };
        assert_eq!(first.iov_len, 9); // one byte of the body sent
        tx.advance(13, &mut done);
        assert_eq!(done, vec![42]);
        assert!(tx.is_empty());
    }

    /// The bytes an iovec points at.
    fn iov_bytes(v: &libc::iovec) -> Vec<u8> {
        // SAFETY: the tests only look at iovecs of a message whose memory
        // (queue heads and the test's own bodies) is still alive.
        unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) }.to_vec()
    }

    /// The iovecs of the message header.
    fn iovs(msg: *const libc::msghdr) -> Vec<libc::iovec> {
        // SAFETY: `msg` comes from `TxQueue::message`, and the queue has not
        // been advanced or asked for another message since.
        unsafe { std::slice::from_raw_parts((*msg).msg_iov, (*msg).msg_iovlen) }.to_vec()
    }

    #[test]
    fn tx_recycles_heads_of_sent_pdus() {
        let mut tx = TxQueue::default();
        let fresh = tx.buf();
        assert!(fresh.is_empty());
        assert_eq!(fresh.capacity(), HEAD_CAPACITY);
        let mut a = fresh;
        a.extend_from_slice(b"first");
        let a_ptr = a.as_ptr();
        let mut b = tx.buf();
        b.extend_from_slice(b"second");
        let b_ptr = b.as_ptr();
        tx.push(a, Some(1));
        tx.push_with_body(b, std::ptr::null(), 0, Some([1, 2, 3, 4]), Some(2));
        let mut done = Vec::new();
        tx.advance(5, &mut done);
        assert_eq!(done, vec![1]);
        // The first head is back, empty, with its heap buffer.
        let again = tx.buf();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), a_ptr);
        // The second is still queued: the pool is empty again.
        let other = tx.buf();
        assert_ne!(other.as_ptr(), b_ptr);
        tx.advance(10, &mut done);
        assert_eq!(done, vec![1, 2]);
        let recycled = tx.buf();
        assert_eq!(recycled.as_ptr(), b_ptr);
        // A head that grew large is not kept.
        tx.push(vec![0; POOL_MAX_CAPACITY + 1], None);
        tx.advance(POOL_MAX_CAPACITY + 1, &mut done);
        assert!(tx.pool.is_empty());
    }

    #[test]
    fn tx_pool_is_bounded() {
        let mut tx = TxQueue::default();
        for _ in 0..POOL_MAX + 10 {
            let mut h = tx.buf();
            h.push(0);
            tx.push(h, None);
        }
        // Fresh vectors were made for all of them; all are sent.
        tx.advance(POOL_MAX + 10, &mut Vec::new());
        assert!(tx.is_empty());
        assert_eq!(tx.pool.len(), POOL_MAX);
    }

    #[test]
    fn tx_digest_survives_the_deque_growing_under_a_message() {
        let body = [5u8; 100];
        let mut tx = TxQueue::default();
        let mut head = tx.buf();
        head.extend_from_slice(&[0xaa; 24]);
        // A full head: the digest makes it grow before anything points at it.
        head.resize(HEAD_CAPACITY, 0xbb);
        tx.push_with_body(head, body.as_ptr(), body.len(), Some(*b"dgst"), Some(7));
        let msg = tx.message();
        let before = iovs(msg);
        assert_eq!(before.len(), 3);
        assert_eq!(iov_bytes(&before[0]).len(), HEAD_CAPACITY);
        assert_eq!(iov_bytes(&before[2]), b"dgst");
        // Queue many more PDUs while that send is "in flight": the deque
        // reallocates several times and moves the first item.
        for i in 0..1000u32 {
            let mut h = tx.buf();
            h.extend_from_slice(&i.to_le_bytes());
            tx.push_with_body(h, body.as_ptr(), 1, Some((!i).to_le_bytes()), None);
        }
        let after = iovs(msg);
        assert_eq!(after.len(), 3, "the outstanding message is unchanged");
        assert_eq!(after[2].iov_base, before[2].iov_base);
        assert_eq!(iov_bytes(&after[2]), b"dgst");
        assert_eq!(iov_bytes(&after[0]), {
            let mut h = vec![0xaa; 24];
            h.resize(HEAD_CAPACITY, 0xbb);
            h
        });
        assert_eq!(iov_bytes(&after[1]), body);
        // Sending it and the next PDU: the digest of that one follows its body.
        let mut done = Vec::new();
        tx.advance(HEAD_CAPACITY + body.len() + 4, &mut done);
        assert_eq!(done, vec![7]);
        let next = iovs(tx.message());
        assert_eq!(iov_bytes(&next[0]), 0u32.to_le_bytes());
        assert_eq!(iov_bytes(&next[1]), [5]);
        assert_eq!(iov_bytes(&next[2]), (!0u32).to_le_bytes());
        assert_eq!(next.len(), MAX_BATCH * 3);
        tx.advance(9 * 1000, &mut done);
        assert!(tx.is_empty());
    }
}
