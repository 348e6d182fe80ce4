//! The TLS handshake on a blocking socket, within a deadline. The peer's
//! records are read one at a time, so that no byte past the handshake's
//! last record leaves the socket: what follows is the NVMe/TCP stream's.

use super::engine::{Engine, Progress, TlsError};
use super::protect::{
    APPLICATION_DATA, CHANGE_CIPHER_SPEC, HANDSHAKE, HEADER as RECORD_HEADER, MAX_RECORD,
};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error("no TLS handshake within its deadline")]
    Timeout,
    #[error("the peer closed the connection during the TLS handshake")]
    Closed,
    /// Closed before sending a byte: a port probe, most likely.
    #[error("the peer closed the connection without starting a TLS handshake")]
    Abandoned,
    #[error("the peer sent a plaintext NVMe/TCP PDU where TLS was required")]
    Plaintext,
    #[error("the peer sent no TLS record (first byte {0:#04x})")]
    NotTls(u8),
    #[error("a TLS record of {0} bytes is larger than TLS 1.3 allows")]
    Oversized(usize),
    #[error("TLS {0}")]
    Tls(#[from] TlsError),
    #[error("socket: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for HandshakeError {
    fn from(e: std::io::Error) -> Self {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                HandshakeError::Timeout
            }
            std::io::ErrorKind::UnexpectedEof => HandshakeError::Closed,
            _ => HandshakeError::Io(e),
        }
    }
}

/// Runs `engine`'s handshake over `sock` until done or `deadline`. The
/// socket's timeouts are cleared on return.
pub fn run(sock: &TcpStream, engine: &mut Engine, deadline: Instant) -> Result<(), HandshakeError> {
    let r = drive(sock, engine, deadline);
    let _ = sock.set_read_timeout(None);
    let _ = sock.set_write_timeout(None);
    r
}

fn drive(
    mut sock: &TcpStream,
    engine: &mut Engine,
    deadline: Instant,
) -> Result<(), HandshakeError> {
    let mut out = Vec::new();
    let mut record = Vec::with_capacity(MAX_RECORD);
    let mut first = true;
    loop {
        let progress = engine.handshake();
        // Send what the engine has, an alert on failure included.
        engine.take_output(&mut out);
        if !out.is_empty() {
            sock.set_write_timeout(Some(remaining(deadline)?))?;
            let sent = sock.write_all(&out);
            out.clear();
            if progress.is_ok() {
                sent?;
            }
        }
        match progress? {
            Progress::Done => return Ok(()),
            Progress::WantInput => {
                read_record(sock, &mut record, deadline, first)?;
                first = false;
                engine.feed(&record);
            }
        }
    }
}

/// Reads one whole record into `record`.
fn read_record(
    mut sock: &TcpStream,
    record: &mut Vec<u8>,
    deadline: Instant,
    first: bool,
) -> Result<(), HandshakeError> {
    record.clear();
    record.resize(RECORD_HEADER, 0);
    match read_exact(&mut sock, record, deadline) {
        Err(HandshakeError::Closed) if first => return Err(HandshakeError::Abandoned),
        r => r?,
    }
    let kind = record[0];
    if first && !(CHANGE_CIPHER_SPEC..=APPLICATION_DATA).contains(&kind) {
        // An NVMe/TCP PDU starts with its type, 0 (ICReq) to 9 (R2T).
        return Err(if kind <= 9 {
            HandshakeError::Plaintext
        } else {
            HandshakeError::NotTls(kind)
        });
    }
    let len = u16::from_be_bytes([record[3], record[4]]) as usize;
    if RECORD_HEADER + len > MAX_RECORD {
        return Err(HandshakeError::Oversized(len));
    }
    record.resize(RECORD_HEADER + len, 0);
    read_exact(&mut sock, &mut record[RECORD_HEADER..], deadline)
}

fn read_exact(
    sock: &mut &TcpStream,
    mut buf: &mut [u8],
    deadline: Instant,
) -> Result<(), HandshakeError> {
    while !buf.is_empty() {
        sock.set_read_timeout(Some(remaining(deadline)?))?;
        match sock.read(buf) {
            Ok(0) => return Err(HandshakeError::Closed),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn remaining(deadline: Instant) -> Result<std::time::Duration, HandshakeError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(HandshakeError::Timeout);
    }
    Ok(left)
}

/// The first byte the peer sends, without taking it: 22 (a TLS handshake
/// record) or an NVMe/TCP PDU type (0, ICReq). For listeners that take
/// both.
pub fn first_byte(sock: &TcpStream, deadline: Instant) -> Result<u8, HandshakeError> {
    let mut b = [0u8; 1];
    let r = loop {
        sock.set_read_timeout(Some(remaining(deadline)?))?;
        match sock.peek(&mut b) {
            Ok(0) => break Err(HandshakeError::Abandoned),
            Ok(_) => break Ok(b[0]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e.into()),
        }
    };
    let _ = sock.set_read_timeout(None);
    r
}

/// Whether a first byte starts a TLS handshake.
pub fn starts_tls(first: u8) -> bool {
    first == HANDSHAKE
}
