//! TLS records under an NVMe/TCP stream, in user space: the socket's
//! receives land in a ciphertext buffer and are decrypted straight into
//! where the stream's PDUs go (the receive buffer or a data PDU's place);
//! the PDUs queued for sending are encrypted into one ciphertext buffer,
//! sent by one `send`. The stream's callers see no difference: tokens come
//! back once the ciphertext that carries their PDUs is on the wire.

use super::engine::{Engine, Plain, TlsError};
use crate::tcp::stream::{Inbound, Outbound, Received};

/// Ciphertext received per socket receive.
const CIPHER_IN: usize = 64 << 10;
/// Plaintext encrypted per send, at most (one message's worth of PDUs may
/// take several sends).
const PLAIN_PER_SEND: usize = 256 << 10;
/// The largest TLS record's plaintext: what one encryption takes.
const RECORD_PLAIN: usize = 16 << 10;

/// What the receive in flight is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvKind {
    /// A socket receive into the ciphertext buffer.
    Socket,
    /// No I/O: records already buffered are decrypted when it completes.
    Buffered,
}

/// The TLS record layer of one connection.
pub struct Records {
    engine: Engine,
    cipher_in: Box<[u8]>,
    /// Ciphertext being sent, and how much of it is on the wire.
    cipher_out: Vec<u8>,
    out_at: usize,
    /// Plaintext of queued PDUs that `cipher_out` carries: handed to the
    /// outbound queue as sent once all of `cipher_out` is.
    plain_in_flight: usize,
    /// Small PDUs gathered into whole records before encryption.
    staging: Vec<u8>,
    recv: Option<RecvKind>,
    send_busy: bool,
    /// Records may wait decrypted or whole in the engine: decrypt them
    /// before reading the socket again.
    backlog: bool,
    /// Encryption failed: the next send completion reports it.
    failed: Option<TlsError>,
    /// The cipher suite, for status.
    cipher: String,
}

impl Records {
    /// The record layer of an engine whose handshake is done.
    pub fn new(engine: Engine) -> Records {
        let cipher = engine.cipher();
        Records {
            engine,
            cipher_in: vec![0u8; CIPHER_IN].into_boxed_slice(),
            cipher_out: Vec::new(),
            out_at: 0,
            plain_in_flight: 0,
            staging: Vec::with_capacity(RECORD_PLAIN),
            recv: None,
            send_busy: false,
            // Bytes may have come with the last handshake record.
            backlog: true,
            failed: None,
            cipher,
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

    /// The receive to post next: `Buffered` when records wait in the
    /// engine, else a socket receive into `(ptr, len)`. `None` while one is
    /// in flight, or when the stream has no room for plaintext (the caller
    /// asks again once it handled what it has).
    pub fn next_recv(&mut self, inbound: &mut Inbound) -> Option<(RecvKind, *mut u8, usize)> {
        if self.recv.is_some() || !inbound.has_room() {
            return None;
        }
        let kind = if self.backlog {
            RecvKind::Buffered
        } else {
            RecvKind::Socket
        };
        self.recv = Some(kind);
        Some((kind, self.cipher_in.as_mut_ptr(), self.cipher_in.len()))
    }

    /// Takes the result of the receive [`Records::next_recv`] built and
    /// decrypts what it can into `inbound`.
    pub fn received(&mut self, res: i32, inbound: &mut Inbound) -> Received {
        let kind = self.recv.take().expect("a receive was in flight");
        if kind == RecvKind::Socket {
            match res {
                0 => return Received::Closed,
                r if r < 0 => return Received::Failed(std::io::Error::from_raw_os_error(-r)),
                r => self.engine.feed(&self.cipher_in[..r as usize]),
            }
        }
        loop {
            let Some((ptr, len)) = inbound.next_recv() else {
                self.backlog = true;
                return Received::Bytes;
            };
            // SAFETY: `next_recv` gave `len` bytes the stream may write and
            // nothing else uses (the receiver's promise), reserved until
            // `received` or `unreserve`.
            let plain = unsafe { self.engine.read_raw(ptr, len) };
            match plain {
                Ok(Plain::Bytes(n)) => {
                    inbound.received(n as i32);
                }
                Ok(Plain::WantInput) => {
                    inbound.unreserve();
                    self.backlog = false;
                    return Received::Bytes;
                }
                Ok(Plain::Closed) => {
                    inbound.unreserve();
                    return Received::Closed;
                }
                Err(e) => {
                    inbound.unreserve();
                    return Received::Failed(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("TLS {e}"),
                    ));
                }
            }
        }
    }

    /// The bytes to send next, encrypting queued PDUs when the ciphertext
    /// sent before is all out. `None` while a send is in flight or when
    /// nothing waits.
    pub fn next_send(&mut self, outbound: &mut Outbound) -> Option<(*const u8, usize)> {
        if self.send_busy {
            return None;
        }
        if self.out_at == self.cipher_out.len() {
            self.cipher_out.clear();
            self.out_at = 0;
            if self.plain_in_flight == 0 {
                if let Err(e) = self.encrypt(outbound) {
                    self.failed = Some(e);
                }
            }
            self.engine.take_output(&mut self.cipher_out);
        }
        if self.failed.is_none() && self.out_at == self.cipher_out.len() {
            return None;
        }
        self.send_busy = true;
        let rest = &self.cipher_out[self.out_at..];
        Some((rest.as_ptr(), rest.len()))
    }

    /// Encrypts the PDUs queued, up to [`PLAIN_PER_SEND`] bytes.
    fn encrypt(&mut self, outbound: &mut Outbound) -> Result<(), TlsError> {
        let Some(msg) = outbound.next_send() else {
            return Ok(());
        };
        // SAFETY: the outbound queue's message: its iovecs point at the
        // queued PDUs' bytes, valid and unchanged while it is in flight
        // (until `outbound.sent`).
        let iovs = unsafe { std::slice::from_raw_parts((*msg).msg_iov, (*msg).msg_iovlen) };
        let mut taken = 0;
        for v in iovs {
            if taken >= PLAIN_PER_SEND {
                break;
            }
            let n = v.iov_len.min(PLAIN_PER_SEND - taken);
            // SAFETY: as above.
            let mut bytes = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, n) };
            taken += n;
            while !bytes.is_empty() {
                if self.staging.is_empty() && bytes.len() >= RECORD_PLAIN {
                    let (whole, rest) = bytes.split_at(bytes.len() / RECORD_PLAIN * RECORD_PLAIN);
                    self.engine.write(whole)?;
                    bytes = rest;
                    continue;
                }
                let room = RECORD_PLAIN - self.staging.len();
                let (part, rest) = bytes.split_at(bytes.len().min(room));
                self.staging.extend_from_slice(part);
                bytes = rest;
                if self.staging.len() == RECORD_PLAIN {
                    self.flush_staging()?;
                }
            }
        }
        self.flush_staging()?;
        self.plain_in_flight = taken;
        Ok(())
    }

    fn flush_staging(&mut self) -> Result<(), TlsError> {
        let r = self.engine.write(&self.staging);
        self.staging.clear();
        r
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
        if let Some(e) = self.failed.take() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("TLS {e}"),
            ));
        }
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
