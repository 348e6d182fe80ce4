//! The receiving half of a stream: PDUs decoded in place from the receive
//! buffer and handed to the side's [`Receiver`]; data PDUs (C2HData on a
//! host, H2CData on a controller) go to the memory their command names,
//! and a large one is received straight there, past the receive buffer.

use super::buffers::RxBuf;
use super::Received;
use crate::mem::crc32c_raw;
use crate::tcp::{self, Digests, Header, Pdu, PduError, Transfer};

/// Which end of the connection receives: it says which data PDU carries
/// data to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Receives C2HData.
    Host,
    /// Receives H2CData.
    Controller,
}

impl Role {
    /// The transfer of a data PDU that carries data to this end.
    fn incoming(self, h: &Header) -> Option<Transfer> {
        match (self, h) {
            (Role::Host, Header::C2HData(t)) | (Role::Controller, Header::H2CData(t)) => Some(*t),
            _ => None,
        }
    }
}

/// Sizes a receiving end accepts.
#[derive(Clone, Copy, Debug)]
pub struct InboundLimits {
    /// Receive buffer size: room for the largest PDU handled in it, and more.
    pub buffer: usize,
    /// Largest PDU accepted (PLEN), data PDUs included.
    pub max_pdu: usize,
    /// Largest PDU other than a data PDU: one announcing more is refused
    /// from its header, as it could never be received whole.
    pub max_other: usize,
    /// Data PDUs carrying at least this many bytes are received straight
    /// into their place.
    pub direct_min: usize,
}

/// What a [`Receiver`] did with a PDU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Consumed,
    /// Leave it at the head of the buffer and offer it again later (no room
    /// to take it yet); the stream stops handling PDUs until then.
    Stall,
}

/// Why receiving stopped: a malformed PDU, or the receiver refused one.
#[derive(Debug)]
pub enum Stop<E> {
    Malformed(PduError),
    Refused(E),
}

impl<E> From<E> for Stop<E> {
    fn from(e: E) -> Stop<E> {
        Stop::Refused(e)
    }
}

/// Data of a data PDU now in its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The PDU's transfer: its command, and offset and length of the data.
    pub transfer: Transfer,
    /// The PDU's common header flags (LAST_PDU, SUCCESS).
    pub flags: u8,
    /// False when the data digest did not match.
    pub digest_ok: bool,
}

/// One end's handling of the PDUs it receives.
///
/// # Safety
/// [`Receiver::place`] returns the address of `len` bytes the stream may
/// write, which nothing else reads or writes, and which stay valid until
/// [`Receiver::placed`] is called for that PDU or the receiver's connection
/// is torn down with no receive of its stream in flight.
pub unsafe trait Receiver {
    type Error;
    /// The digests PDUs carry now.
    fn digests(&self) -> Digests;
    /// Whether the connection still takes PDUs.
    fn receiving(&self) -> bool;
    /// Checks a data PDU's transfer (`len` bytes of data) against its
    /// command; returns where its data goes.
    fn place(&mut self, t: &Transfer, len: usize) -> Result<*mut u8, Self::Error>;
    /// The data of a PDU whose place [`Receiver::place`] gave is all there.
    fn placed(&mut self, p: Placed) -> Result<(), Self::Error>;
    /// Any PDU other than a data PDU for this end.
    fn pdu(&mut self, pdu: &Pdu<'_>) -> Result<Flow, Self::Error>;
}

/// A data PDU being received straight into its place.
struct Direct {
    transfer: Transfer,
    flags: u8,
    /// Its place, and how many of its bytes are there.
    start: *mut u8,
    done: usize,
    digest: bool,
}

impl Direct {
    fn left(&self) -> usize {
        self.transfer.len as usize - self.done
    }
}

/// The PDUs arriving on a stream.
pub struct Inbound {
    rx: RxBuf,
    role: Role,
    limits: InboundLimits,
    direct: Option<Direct>,
    busy: bool,
    /// The receive in flight writes into a data PDU's place.
    busy_direct: bool,
}

// SAFETY: the raw pointer is a data PDU's place, which the receiver keeps
// valid for the stream wherever it runs; nothing is tied to a thread.
unsafe impl Send for Inbound {}

impl Default for Inbound {
    /// A placeholder with no buffer, while the real one is being handled.
    fn default() -> Self {
        Inbound {
            rx: RxBuf::empty(),
            role: Role::Host,
            limits: InboundLimits {
                buffer: 0,
                max_pdu: 0,
                max_other: 0,
                direct_min: 0,
            },
            direct: None,
            busy: false,
            busy_direct: false,
        }
    }
}

impl Inbound {
    /// The receiving half of `role`'s end, within `limits`.
    pub fn new(role: Role, limits: InboundLimits) -> std::io::Result<Inbound> {
        Ok(Inbound {
            rx: RxBuf::new(limits.buffer)?,
            role,
            limits,
            direct: None,
            busy: false,
            busy_direct: false,
        })
    }

    /// The bytes received and not yet handled: after a [`Stop`], the
    /// offending PDU starts there.
    pub fn pending(&self) -> &[u8] {
        self.rx.pending()
    }

    /// Whether a receive is in flight.
    pub fn busy(&self) -> bool {
        self.busy
    }

    /// Whether the receive in flight writes into a data PDU's place.
    pub fn busy_in_place(&self) -> bool {
        self.busy && self.busy_direct
    }

    /// Forgets the data PDU being placed (its connection failed): later
    /// receives go to the buffer.
    pub fn abandon_placement(&mut self) {
        self.direct = None;
    }

    /// Where the next receive writes: into the data PDU being placed, else
    /// the receive buffer's free room.
    fn next_place(&mut self) -> (*mut u8, usize, bool) {
        match &self.direct {
            Some(d) if d.left() > 0 => (d.start.wrapping_add(d.done), d.left(), true),
            _ => {
                let spare = self.rx.spare();
                (spare.as_mut_ptr(), spare.len(), false)
            }
        }
    }

    /// Whether a receive could be posted now: none is in flight and there
    /// is room for what it brings.
    pub(crate) fn has_room(&mut self) -> bool {
        !self.busy && self.next_place().1 > 0
    }

    /// Where the next receive writes, marking it in flight.
    pub(crate) fn next_recv(&mut self) -> Option<(*mut u8, usize)> {
        if self.busy {
            return None;
        }
        let (ptr, len, direct) = self.next_place();
        if len == 0 {
            return None;
        }
        self.busy = true;
        self.busy_direct = direct;
        Some((ptr, len))
    }

    /// A receive ended with `res`.
    pub(crate) fn received(&mut self, res: i32) -> Received {
        self.busy = false;
        let direct = std::mem::take(&mut self.busy_direct);
        match res {
            0 => Received::Closed,
            r if r < 0 => Received::Failed(std::io::Error::from_raw_os_error(-r)),
            r => {
                match self.direct.as_mut().filter(|_| direct) {
                    Some(d) => d.done += r as usize,
                    None => self.rx.filled(r as usize),
                }
                Received::Bytes
            }
        }
    }

    /// Hands the PDUs received so far to `r`, as far as they can go now.
    pub fn process<R: Receiver>(&mut self, r: &mut R) -> Result<(), Stop<R::Error>> {
        while r.receiving() {
            if self.direct.is_some() {
                if self.finish_direct(r)? {
                    continue;
                }
                return Ok(());
            }
            let digests = r.digests();
            let decoded = tcp::decode(self.rx.pending(), digests, self.limits.max_pdu);
            let Some((pdu, n)) = decoded.map_err(Stop::Malformed)? else {
                return self.start_direct(r, digests);
            };
            let flow = match self.role.incoming(&pdu.header) {
                Some(t) => {
                    let dst = r.place(&t, pdu.data.len())?;
                    // SAFETY: `place` gave `pdu.data.len()` writable bytes
                    // at `dst` that nothing else uses (the trait's
                    // contract); the receive buffer is memory of its own.
                    unsafe {
                        std::ptr::copy_nonoverlapping(pdu.data.as_ptr(), dst, pdu.data.len())
                    };
                    r.placed(Placed {
                        transfer: t,
                        flags: pdu.flags,
                        digest_ok: pdu.data_digest_ok,
                    })?;
                    Flow::Consumed
                }
                None => r.pdu(&pdu)?,
            };
            match flow {
                Flow::Consumed => self.rx.consume(n),
                Flow::Stall => return Ok(()),
            }
        }
        Ok(())
    }

    /// Once a data PDU's header is in and its data is large and not all
    /// here, starts receiving the data straight into its place. Refuses a
    /// PDU of another type larger than any this end takes.
    fn start_direct<R: Receiver>(
        &mut self,
        r: &mut R,
        digests: Digests,
    ) -> Result<(), Stop<R::Error>> {
        let pending = self.rx.pending();
        let framing = tcp::decode_framing(pending, digests, self.limits.max_pdu);
        let Some(f) = framing.map_err(Stop::Malformed)? else {
            return Ok(());
        };
        let Some(t) = self.role.incoming(&f.header) else {
            if f.plen > self.limits.max_other {
                return Err(Stop::Malformed(PduError::InvalidField {
                    offset: 4,
                    what: "PLEN is larger than any PDU of its type this end accepts",
                }));
            }
            return Ok(());
        };
        if f.data_len < self.limits.direct_min || pending.len() >= f.plen {
            return Ok(());
        }
        if pending.len() < f.data_at {
            return Ok(()); // the header's padding is still to come
        }
        let start = r.place(&t, f.data_len)?;
        let have = (pending.len() - f.data_at).min(f.data_len);
        // SAFETY: `place` gave `f.data_len` writable bytes at `start` that
        // nothing else uses; the receive buffer is memory of its own.
        unsafe { std::ptr::copy_nonoverlapping(pending[f.data_at..].as_ptr(), start, have) };
        self.rx.consume(f.data_at + have);
        self.direct = Some(Direct {
            transfer: t,
            flags: f.flags,
            start,
            done: have,
            digest: f.data_digest,
        });
        Ok(())
    }

    /// Moves received bytes of the data PDU being placed into place and,
    /// once all is there (with its digest), tells the receiver. Returns true
    /// then.
    fn finish_direct<R: Receiver>(&mut self, r: &mut R) -> Result<bool, Stop<R::Error>> {
        let d = self.direct.as_mut().expect("a data PDU is being placed");
        if d.left() > 0 {
            let pending = self.rx.pending();
            let n = pending.len().min(d.left());
            // SAFETY: the place has `d.left()` writable bytes from
            // `d.start + d.done` (`place`'s contract); the receive buffer is
            // memory of its own.
            unsafe {
                std::ptr::copy_nonoverlapping(pending.as_ptr(), d.start.wrapping_add(d.done), n)
            };
            d.done += n;
            self.rx.consume(n);
            if d.left() > 0 {
                return Ok(false);
            }
        }
        let mut digest_ok = true;
        if d.digest {
            let pending = self.rx.pending();
            if pending.len() < tcp::DIGEST_LEN {
                return Ok(false);
            }
            let want = u32::from_le_bytes(pending[..4].try_into().expect("4 bytes"));
            // SAFETY: the whole place was written above and stays valid
            // until `placed` (`place`'s contract).
            digest_ok = unsafe { crc32c_raw(d.start, d.done) } == want;
            self.rx.consume(tcp::DIGEST_LEN);
        }
        let d = self.direct.take().expect("checked above");
        r.placed(Placed {
            transfer: d.transfer,
            flags: d.flags,
            digest_ok,
        })?;
        Ok(true)
    }
}
