//! What an engine keeps for its driver's socket I/O (NBD clients): receive
//! buffers and send queues it owns, which the driver names by handle. While
//! a receive or a send is in the ring, what it points to stays with the
//! engine: the driver reaches only the bytes a receive does not write, and
//! can queue more to send but not rebuild the message being sent; a handle
//! given back meanwhile is freed once the operation completes.

use rdmablk_common::tcp::stream::TxQueue;

/// A receive buffer the engine keeps for a driver.
#[derive(Debug)]
#[must_use = "give it back with Cx::rx_close"]
pub struct RxId(u32);

/// A send queue the engine keeps for a driver.
#[derive(Debug)]
#[must_use = "give it back with Cx::tx_close"]
pub struct TxId(u32);

impl RxId {
    /// Its index among the engine's receive buffers.
    pub(super) fn index(&self) -> u32 {
        self.0
    }
}

impl TxId {
    /// Its index among the engine's send queues.
    pub(super) fn index(&self) -> u32 {
        self.0
    }
}

struct Rx {
    buf: Box<[u8]>,
    /// A receive into `buf[at..]` is in the ring.
    busy: Option<usize>,
    /// Given back: freed once not busy.
    closed: bool,
}

struct Tx {
    queue: TxQueue,
    /// A send of the queue's message is in the ring.
    busy: bool,
    closed: bool,
}

/// A slab whose entries are freed once given back and idle.
struct Slab<T> {
    items: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            items: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    fn insert(&mut self, t: T) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.items[i as usize] = Some(t);
                i
            }
            None => {
                // Operations carry the index in 24 bits.
                assert!(self.items.len() < 1 << 24, "too many driver buffers");
                self.items.push(Some(t));
                self.items.len() as u32 - 1
            }
        }
    }

    fn get(&mut self, i: u32) -> &mut T {
        self.items[i as usize].as_mut().expect("a live handle")
    }

    fn remove(&mut self, i: u32) {
        self.items[i as usize] = None;
        self.free.push(i);
    }
}

/// The receive buffers and send queues of an engine's driver.
#[derive(Default)]
pub(super) struct DriverIo {
    rx: Slab<Rx>,
    tx: Slab<Tx>,
}

impl DriverIo {
    /// A new receive buffer of `len` zero bytes.
    pub fn rx_open(&mut self, len: usize) -> RxId {
        RxId(self.rx.insert(Rx {
            buf: vec![0; len].into_boxed_slice(),
            busy: None,
            closed: false,
        }))
    }

    /// The bytes of `id` the driver may use: all of them, or those before
    /// the receive in flight.
    pub fn rx(&mut self, id: &RxId) -> &mut [u8] {
        let rx = self.rx.get(id.0);
        let end = rx.busy.unwrap_or(rx.buf.len());
        &mut rx.buf[..end]
    }

    /// Marks a receive into `id` from byte `at` as in the ring; where it
    /// writes, and how many bytes at most.
    ///
    /// # Panics
    /// When a receive into `id` is already in flight, or `at` is past its end.
    pub fn rx_start(&mut self, id: &RxId, at: usize) -> (*mut u8, usize) {
        let rx = self.rx.get(id.0);
        assert!(rx.busy.is_none(), "one receive at a time into a buffer");
        let tail = &mut rx.buf[at..];
        rx.busy = Some(at);
        (tail.as_mut_ptr(), tail.len())
    }

    /// The receive into buffer `i` completed.
    pub fn rx_end(&mut self, i: u32) {
        let rx = self.rx.get(i);
        rx.busy = None;
        if rx.closed {
            self.rx.remove(i);
        }
    }

    /// Gives `id` back: freed now, or once its receive completes.
    pub fn rx_close(&mut self, id: RxId) {
        let rx = self.rx.get(id.0);
        rx.closed = true;
        if rx.busy.is_none() {
            self.rx.remove(id.0);
        }
    }

    /// A new, empty send queue.
    pub fn tx_open(&mut self) -> TxId {
        TxId(self.tx.insert(Tx {
            queue: TxQueue::default(),
            busy: false,
            closed: false,
        }))
    }

    /// The queue of `id`, to queue more on (which a send in flight allows:
    /// see [`TxQueue::message`]).
    pub fn tx(&mut self, id: &TxId) -> &mut TxQueue {
        &mut self.tx.get(id.0).queue
    }

    /// Records that the send of `id` moved `n` bytes: see [`TxQueue::advance`].
    ///
    /// # Panics
    /// When a send of `id` is in flight.
    pub fn tx_advance(&mut self, id: &TxId, n: usize, done: &mut Vec<u64>) {
        let tx = self.tx.get(id.0);
        assert!(!tx.busy, "a queue advances once its send completed");
        tx.queue.advance(n, done);
    }

    /// Marks a send of `id`'s queue as in the ring; its message header.
    ///
    /// # Panics
    /// When a send of `id` is already in flight.
    pub fn tx_start(&mut self, id: &TxId) -> *const libc::msghdr {
        let tx = self.tx.get(id.0);
        assert!(!tx.busy, "one send at a time of a queue");
        tx.busy = true;
        tx.queue.message()
    }

    /// The send of queue `i` completed.
    pub fn tx_end(&mut self, i: u32) {
        let tx = self.tx.get(i);
        tx.busy = false;
        if tx.closed {
            self.tx.remove(i);
        }
    }

    /// Gives `id` back: freed now, or once its send completes.
    pub fn tx_close(&mut self, id: TxId) {
        let tx = self.tx.get(id.0);
        tx.closed = true;
        if !tx.busy {
            self.tx.remove(id.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receive_in_flight_hides_the_bytes_it_writes() {
        let mut io = DriverIo::default();
        let id = io.rx_open(64);
        io.rx(&id)[..4].copy_from_slice(b"abcd");
        let (_, len) = io.rx_start(&id, 4);
        assert_eq!(len, 60);
        assert_eq!(io.rx(&id), b"abcd");
        io.rx_end(id.index());
        assert_eq!(io.rx(&id).len(), 64);
        io.rx_close(id);
    }

    #[test]
    fn a_buffer_given_back_in_flight_is_freed_at_its_completion() {
        let mut io = DriverIo::default();
        let id = io.rx_open(16);
        let i = id.index();
        let _ = io.rx_start(&id, 0);
        io.rx_close(id);
        // Still the engine's: a new buffer does not take its place.
        assert_ne!(io.rx_open(16).index(), i);
        io.rx_end(i);
        let again = io.rx_open(16);
        assert_eq!(again.index(), i);
        io.rx_close(again);
    }

    #[test]
    #[should_panic(expected = "once its send completed")]
    fn a_queue_does_not_advance_while_sent() {
        let mut io = DriverIo::default();
        let id = io.tx_open();
        io.tx(&id).push(vec![1, 2, 3], Some(7));
        let _ = io.tx_start(&id);
        io.tx_advance(&id, 3, &mut Vec::new());
    }
}
