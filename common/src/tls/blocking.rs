//! A blocking socket whose bytes go through TLS records: for the host's
//! blocking queues (admin, discovery, and I/O queues until their Connect,
//! when [`TlsSocket::into_parts`] hands its session to the stream).

use super::engine::{Engine, TlsError};
use super::protect::{Opened, Protection, HEADER, MAX_PLAIN};
use super::Session;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::ops::Range;

/// Ciphertext read from the socket at a time.
const CHUNK: usize = 16 << 10;

/// A connected socket whose TLS handshake is done.
pub struct TlsSocket {
    sock: TcpStream,
    prot: Protection,
    cipher: String,
    /// Bytes received: `inbuf[plain]` opened data not yet read, then
    /// `inbuf[next..]` not yet opened.
    inbuf: Vec<u8>,
    plain: Range<usize>,
    next: usize,
    out: Vec<u8>,
}

fn invalid(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("TLS {e}"))
}

impl TlsSocket {
    /// The socket of a connection whose handshake `engine` did.
    pub fn new(sock: TcpStream, engine: &Engine) -> Result<TlsSocket, TlsError> {
        let session = Session::after_handshake(engine)?;
        Ok(TlsSocket {
            sock,
            prot: session.prot,
            cipher: session.cipher,
            inbuf: Vec::new(),
            plain: 0..0,
            next: 0,
            out: Vec::new(),
        })
    }

    /// The socket (for its options and addresses).
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// The negotiated cipher suite.
    pub fn cipher(&self) -> &str {
        &self.cipher
    }

    /// Whether bytes read from the socket wait here.
    pub fn buffered(&self) -> bool {
        !self.plain.is_empty() || self.next < self.inbuf.len()
    }

    /// The socket and its TLS session, with whatever was received and not
    /// yet read, for the asynchronous data path.
    pub fn into_parts(self) -> (TcpStream, Session) {
        let session = Session {
            prot: self.prot,
            cipher: self.cipher,
            plain: self.inbuf[self.plain].to_vec(),
            unopened: self.inbuf[self.next..].to_vec(),
        };
        (self.sock, session)
    }

    /// Opens the next whole record; false when none is here.
    fn open_next(&mut self) -> std::io::Result<Option<Opened>> {
        let waiting = &self.inbuf[self.next..];
        let len = match Protection::record_len(waiting).map_err(invalid)? {
            Some(len) if len <= waiting.len() => len,
            _ => return Ok(None),
        };
        let at = self.next;
        self.next += len;
        let opened = self
            .prot
            .open(&mut self.inbuf[at..at + len])
            .map_err(invalid)?;
        if let Opened::Data(n) = opened {
            self.plain = at + HEADER..at + HEADER + n;
        }
        // A KeyUpdate's answer goes out now.
        self.flush()?;
        Ok(Some(opened))
    }
}

impl Read for TlsSocket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if !self.plain.is_empty() {
                let n = buf.len().min(self.plain.len());
                buf[..n].copy_from_slice(&self.inbuf[self.plain.start..self.plain.start + n]);
                self.plain.start += n;
                return Ok(n);
            }
            match self.open_next()? {
                Some(Opened::Closed) => return Ok(0),
                Some(_) => continue,
                None => {}
            }
            // Keep only what is not opened yet, then read more.
            self.inbuf.drain(..self.next);
            self.next = 0;
            self.plain = 0..0;
            let have = self.inbuf.len();
            self.inbuf.resize(have + CHUNK, 0);
            let n = self.sock.read(&mut self.inbuf[have..]);
            self.inbuf.truncate(have + *n.as_ref().unwrap_or(&0));
            if n? == 0 {
                return Ok(0);
            }
        }
    }
}

impl Write for TlsSocket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for chunk in buf.chunks(MAX_PLAIN) {
            self.prot.seal(&mut self.out, chunk.len(), |dst| {
                dst.extend_from_slice(chunk)
            });
        }
        self.flush()?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.prot.pending_output(&mut self.out);
        let r = self.sock.write_all(&self.out);
        self.out.clear();
        r
    }
}
