//! Byte-stream plumbing shared by both ends of an NVMe/TCP connection: a
//! receive buffer that PDUs are parsed from in place, and a send queue that
//! gathers PDU headers, payloads (borrowed from a buffer arena) and digests
//! into one `sendmsg`. Neither does I/O itself: the caller's io_uring does.

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
struct TxItem {
    head: Vec<u8>,
    body: *const u8,
    body_len: usize,
    /// Boxed: a send in flight points at it while the deque may reallocate.
    digest: Option<Box<[u8; 4]>>,
    token: Option<u64>,
}

impl TxItem {
    fn len(&self) -> usize {
        self.head.len() + self.body_len + if self.digest.is_some() { 4 } else { 0 }
    }
}

/// PDUs gathered into one sendmsg at most.
const MAX_BATCH: usize = 32;

/// PDUs queued for sending, in order.
pub struct TxQueue {
    items: VecDeque<TxItem>,
    /// Bytes of the front item already sent.
    sent: usize,
    iov: Vec<libc::iovec>,
    msg: Box<libc::msghdr>,
}

// SAFETY: the raw pointers are payload addresses in memory the owner keeps
// valid until the item is sent, and the msghdr points into `iov`; nothing is
// tied to the creating thread.
unsafe impl Send for TxQueue {}

impl Default for TxQueue {
    fn default() -> Self {
        TxQueue {
            items: VecDeque::new(),
            sent: 0,
            iov: Vec::with_capacity(MAX_BATCH * 3),
            // SAFETY: msghdr is plain old data; all zeroes is an empty header.
            msg: Box::new(unsafe { std::mem::zeroed() }),
        }
    }
}

impl TxQueue {
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
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
    pub fn push_with_body(
        &mut self,
        head: Vec<u8>,
        body: *const u8,
        body_len: usize,
        digest: Option<[u8; 4]>,
        token: Option<u64>,
    ) {
        self.items.push_back(TxItem {
            head,
            body,
            body_len,
            digest: digest.map(Box::new),
            token,
        });
    }

    /// Builds the message header for the next sendmsg over the queued PDUs.
    /// The pointer is valid until the queue is next changed.
    pub fn message(&mut self) -> *const libc::msghdr {
        self.iov.clear();
        let mut skip = self.sent;
        for item in self.items.iter().take(MAX_BATCH) {
            let digest = item
                .digest
                .as_ref()
                .map_or(std::ptr::null(), |d| d.as_ptr());
            let digest_len = if item.digest.is_some() { 4 } else { 0 };
            for (ptr, len) in [
                (item.head.as_ptr(), item.head.len()),
                (item.body, item.body_len),
                (digest, digest_len),
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
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len();
        &*self.msg
    }

    /// Records that `n` bytes were sent; tokens of the PDUs now fully sent
    /// are appended to `done`.
    pub fn advance(&mut self, n: usize, done: &mut Vec<u64>) {
        let mut n = n + self.sent;
        while let Some(front) = self.items.front() {
            let len = front.len();
            if n < len {
                break;
            }
            n -= len;
            if let Some(t) = self.items.pop_front().and_then(|i| i.token) {
                done.push(t);
            }
        }
        self.sent = n;
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
}
