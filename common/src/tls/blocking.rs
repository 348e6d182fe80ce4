//! A blocking socket whose bytes go through TLS: for the host's blocking
//! queues (admin, discovery, and I/O queues until their Connect).

use super::engine::{Engine, Plain, TlsError};
use std::io::{Read, Write};
use std::net::TcpStream;

/// Ciphertext read from the socket at a time.
const CHUNK: usize = 16 << 10;

/// A connected socket and the TLS engine whose handshake is done.
pub struct TlsSocket {
    sock: TcpStream,
    engine: Engine,
    buf: Box<[u8]>,
    out: Vec<u8>,
}

fn invalid(e: TlsError) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("TLS {e}"))
}

impl TlsSocket {
    pub fn new(sock: TcpStream, engine: Engine) -> TlsSocket {
        TlsSocket {
            sock,
            engine,
            buf: vec![0u8; CHUNK].into_boxed_slice(),
            out: Vec::new(),
        }
    }

    /// The socket (for its options and addresses).
    pub fn socket(&self) -> &TcpStream {
        &self.sock
    }

    /// Whether bytes read from the socket wait in the engine.
    pub fn buffered(&self) -> bool {
        self.engine.buffered()
    }

    /// The socket and the engine, for the asynchronous data path.
    pub fn into_parts(self) -> (TcpStream, Engine) {
        (self.sock, self.engine)
    }
}

impl Read for TlsSocket {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.engine.read(buf).map_err(invalid)? {
                Plain::Bytes(n) => return Ok(n),
                Plain::Closed => return Ok(0),
                Plain::WantInput => {
                    let n = self.sock.read(&mut self.buf)?;
                    if n == 0 {
                        return Ok(0);
                    }
                    self.engine.feed(&self.buf[..n]);
                    // Whatever the engine answers (a KeyUpdate's) goes out.
                    self.flush()?;
                }
            }
        }
    }
}

impl Write for TlsSocket {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.engine.write(buf).map_err(invalid)?;
        self.flush()?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.engine.take_output(&mut self.out);
        let r = self.sock.write_all(&self.out);
        self.out.clear();
        r
    }
}
