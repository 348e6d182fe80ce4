//! TLS records under an NVMe/TCP stream, in user space: the socket's
//! receives land in a ciphertext buffer, where each record is opened in
//! place and its data copied to where the stream's PDUs go (the receive
//! buffer or a data PDU's place); the PDUs queued for sending are sealed
//! into one ciphertext buffer, sent by one `send`. The stream's callers see
//! no difference: tokens come back once the ciphertext that carries their
//! PDUs is on the wire.

use super::{Inbound, Outbound, Received};
use crate::tls::protect::{Opened, Protection, HEADER, MAX_PLAIN, MAX_RECORD, OVERHEAD};
use crate::tls::Session;
use std::ops::Range;

/// Ciphertext buffer of the receiving side: room for several records.
const CIPHER_IN: usize = 64 << 10;
/// Plaintext sealed per send, at most (one message's worth of PDUs may take
/// several sends).
const PLAIN_PER_SEND: usize = 256 << 10;

/// What the receive in flight is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvKind {
    /// A socket receive into the ciphertext buffer.
    Socket,
    /// No I/O: what is already buffered is handed over when it completes.
    Buffered,
}

/// The TLS record layer of one connection.
pub struct Records {
    prot: Protection,
    cipher_in: Box<[u8]>,
    /// Opened data not yet handed to the stream, in `cipher_in`.
    plain: Range<usize>,
    /// `cipher_in[next..filled]`: received bytes not yet opened.
    next: usize,
    filled: usize,
    /// Ciphertext being sent, and how much of it is on the wire.
    cipher_out: Vec<u8>,
    out_at: usize,
    /// Plaintext of queued PDUs that `cipher_out` carries: handed to the
    /// outbound queue as sent once all of `cipher_out` is.
    plain_in_flight: usize,
    recv: Option<RecvKind>,
    send_busy: bool,
    /// The cipher suite, for status.
    cipher: String,
}

fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("TLS {e}"))
}

impl Records {
    /// The record layer of a connection's TLS `session`.
    pub fn new(session: Session) -> Records {
        let (plain, unopened) = (&session.plain, &session.unopened);
        let held = plain.len() + unopened.len();
        let mut cipher_in = vec![0u8; CIPHER_IN.max(held + MAX_RECORD)].into_boxed_slice();
        cipher_in[..plain.len()].copy_from_slice(plain);
        cipher_in[plain.len()..held].copy_from_slice(unopened);
        Records {
            prot: session.prot,
            cipher_in,
            plain: 0..plain.len(),
            next: plain.len(),
            filled: held,
            cipher_out: Vec::new(),
            out_at: 0,
            plain_in_flight: 0,
            recv: None,
            send_busy: false,
            cipher: session.cipher,
        }
    }

    /// The negotiated cipher suite.
    pub fn cipher(&self) -> &str {
        &self.cipher
    }

    /// Whether a receive or a send is in flight.
    pub fn busy(&self) -> (bool, bool) {
        (self.recv.is_some(), self.send_busy)
    }

    /// Whether a whole record waits unopened.
    fn record_waits(&self) -> bool {
        matches!(Protection::record_len(&self.cipher_in[self.next..self.filled]),
            Ok(Some(len)) if self.next + len <= self.filled)
            || Protection::record_len(&self.cipher_in[self.next..self.filled]).is_err()
    }

    /// The receive to post next: `Buffered` when data or whole records
    /// wait, else a socket receive into `(ptr, len)`. `None` while one is
    /// in flight, or when the stream has no room for data (the caller asks
    /// again once it handled what it has).
    pub fn next_recv(&mut self, inbound: &mut Inbound) -> Option<(RecvKind, *mut u8, usize)> {
        if self.recv.is_some() || !inbound.has_room() {
            return None;
        }
        if !self.plain.is_empty() || self.record_waits() {
            self.recv = Some(RecvKind::Buffered);
            return Some((RecvKind::Buffered, std::ptr::null_mut(), 0));
        }
        // Only a part of a record is here: move it to the front.
        self.cipher_in.copy_within(self.next..self.filled, 0);
        self.filled -= self.next;
        self.next = 0;
        self.plain = 0..0;
        self.recv = Some(RecvKind::Socket);
        let room = &mut self.cipher_in[self.filled..];
        Some((RecvKind::Socket, room.as_mut_ptr(), room.len()))
    }

    /// Takes the result of the receive [`Records::next_recv`] built, opens
    /// the whole records and hands their data to `inbound` as far as it
    /// has room.
    pub fn received(&mut self, res: i32, inbound: &mut Inbound) -> Received {
        let kind = self.recv.take().expect("a receive was in flight");
        if kind == RecvKind::Socket {
            match res {
                0 => return Received::Closed,
                r if r < 0 => return Received::Failed(std::io::Error::from_raw_os_error(-r)),
                r => self.filled += r as usize,
            }
        }
        loop {
            while !self.plain.is_empty() {
                let Some((ptr, len)) = inbound.next_recv() else {
                    return Received::Bytes;
                };
                let n = len.min(self.plain.len());
                // SAFETY: `next_recv` gave `len` bytes the stream may write
                // and nothing else uses (the receiver's promise); `n` bytes
                // of the buffer's opened data go there.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.cipher_in[self.plain.start..].as_ptr(),
                        ptr,
                        n,
                    )
                };
                inbound.received(n as i32);
                self.plain.start += n;
            }
            let waiting = &self.cipher_in[self.next..self.filled];
            let len = match Protection::record_len(waiting) {
                Ok(Some(len)) if len <= waiting.len() => len,
                Ok(_) => return Received::Bytes,
                Err(e) => return Received::Failed(invalid(e)),
            };
            let at = self.next;
            self.next += len;
            match self.prot.open(&mut self.cipher_in[at..at + len]) {
                Ok(Opened::Data(n)) => self.plain = at + HEADER..at + HEADER + n,
                Ok(Opened::Nothing) => {}
                Ok(Opened::Closed) => return Received::Closed,
                Err(e) => return Received::Failed(invalid(e)),
            }
        }
    }

    /// The bytes to send next, sealing queued PDUs when the ciphertext sent
    /// before is all out. `None` while a send is in flight or when nothing
    /// waits.
    pub fn next_send(&mut self, outbound: &mut Outbound) -> Option<(*const u8, usize)> {
        if self.send_busy {
            return None;
        }
        if self.out_at == self.cipher_out.len() {
            self.cipher_out.clear();
            self.out_at = 0;
            self.prot.pending_output(&mut self.cipher_out);
            if self.plain_in_flight == 0 {
                self.seal(outbound);
            }
        }
        if self.out_at == self.cipher_out.len() {
            return None;
        }
        self.send_busy = true;
        let rest = &self.cipher_out[self.out_at..];
        Some((rest.as_ptr(), rest.len()))
    }

    /// Seals the PDUs queued, up to [`PLAIN_PER_SEND`] bytes, into records
    /// of [`MAX_PLAIN`] bytes (the last one shorter).
    fn seal(&mut self, outbound: &mut Outbound) {
        let Some(msg) = outbound.next_send() else {
            return;
        };
        // SAFETY: the outbound queue's message: its iovecs point at the
        // queued PDUs' bytes, valid and unchanged while it is in flight
        // (until `outbound.sent`).
        let iovs = unsafe { std::slice::from_raw_parts((*msg).msg_iov, (*msg).msg_iovlen) };
        let total: usize = iovs
            .iter()
            .map(|v| v.iov_len)
            .sum::<usize>()
            .min(PLAIN_PER_SEND);
        self.cipher_out
            .reserve(total + total.div_ceil(MAX_PLAIN) * OVERHEAD);
        let (mut iov, mut skip) = (0, 0);
        let mut left = total;
        while left > 0 {
            let len = left.min(MAX_PLAIN);
            self.prot.seal(&mut self.cipher_out, len, |out| {
                let mut want = len;
                while want > 0 {
                    let v = &iovs[iov];
                    let n = (v.iov_len - skip).min(want);
                    // SAFETY: as above; `skip + n` is within the iovec.
                    let src = unsafe {
                        std::slice::from_raw_parts((v.iov_base as *const u8).add(skip), n)
                    };
                    out.extend_from_slice(src);
                    want -= n;
                    skip += n;
                    if skip == v.iov_len {
                        (iov, skip) = (iov + 1, 0);
                    }
                }
            });
            left -= len;
        }
        self.plain_in_flight = total;
    }

    /// Takes the result of the send [`Records::next_send`] built: the tokens
    /// of PDUs now wholly on the wire go to `done`. Returns the ciphertext
    /// bytes sent.
    pub fn sent(
        &mut self,
        res: i32,
        outbound: &mut Outbound,
        done: &mut Vec<u64>,
    ) -> std::io::Result<usize> {
        self.send_busy = false;
        if res < 0 {
            return Err(std::io::Error::from_raw_os_error(-res));
        }
        self.out_at += res as usize;
        if self.out_at == self.cipher_out.len() && self.plain_in_flight > 0 {
            let plain = std::mem::take(&mut self.plain_in_flight);
            outbound.sent(plain as i32, done)?;
        }
        Ok(res as usize)
    }
}

#[cfg(test)]
mod tests;
