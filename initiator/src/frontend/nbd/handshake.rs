//! NBD handshake, server side: fixed newstyle negotiation over a blocking stream.
//!
//! Serves one export under two names: "" (the default export) and its own name.
//! Every length the client sends is bounded before anything is allocated, and
//! the number of options per session is capped. The caller bounds time
//! (the export's greeter replays it over non-blocking sockets, within one
//! deadline).

use std::io::{self, Read, Write};

use thiserror::Error;

use super::proto::{flags, truncate_str, MAX_STRING_LEN};

/// `NBDMAGIC`, first field of the server greeting.
const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`, second field of the greeting and first field of every option.
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

// Handshake flags sent by the server.
const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
const FLAG_NO_ZEROES: u16 = 1 << 1;
// Client flags.
pub const C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const C_NO_ZEROES: u32 = 1 << 1;

// Option types (`NBD_OPT_*`).
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option reply types (`NBD_REP_*`); errors have bit 31 set.
const REP_ACK: u32 = 1;
const REP_SERVER: u32 = 2;
const REP_INFO: u32 = 3;
const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
const REP_ERR_POLICY: u32 = (1 << 31) + 2;
const REP_ERR_INVALID: u32 = (1 << 31) + 3;
const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

// Information types (`NBD_INFO_*`) of `NBD_REP_INFO` replies.
const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Largest option payload we read into memory. The longest legitimate one we
/// parse is `NBD_OPT_INFO`/`NBD_OPT_GO`: 4 + a name of at most 4096 bytes + 2 +
/// 2 per information request, which this covers with room to spare.
const MAX_OPTION_DATA: u32 = 8 << 10;
/// Largest oversized option payload we read and drop to answer
/// `NBD_REP_ERR_TOO_BIG`; anything bigger is treated as denial of service.
const MAX_OPTION_DISCARD: u32 = 1 << 20;
/// Options accepted before the client must choose an export.
const MAX_OPTIONS: usize = 256;
/// Zero padding after the `NBD_OPT_EXPORT_NAME` reply unless `NO_ZEROES`.
const EXPORT_NAME_PADDING: usize = 124;

/// The one export this server offers.
#[derive(Debug, Clone)]
pub struct Export {
    /// Name the export answers to besides "" (the NQN). At most 4096 bytes.
    pub name: String,
    /// Human-readable description, for `NBD_INFO_DESCRIPTION` and `NBD_OPT_LIST`.
    pub description: String,
    /// Size in bytes; a multiple of `min_block`.
    pub size: u64,
    /// Minimum block size: a power of two, at most 64 KiB (512 here).
    pub min_block: u32,
    /// Preferred block size: a power of two, at least `max(min_block, 512)`.
    pub preferred_block: u32,
    /// Largest request accepted in one piece: a multiple of `min_block`.
    pub max_block: u32,
    /// Advertise `NBD_FLAG_READ_ONLY`.
    pub read_only: bool,
    /// Transmission flags beyond `HAS_FLAGS` and `READ_ONLY` (`flags::SEND_*`,
    /// `CAN_MULTI_CONN`, ...), for features the transmission loop implements.
    pub flags: u16,
}

/// What the client and server agreed on for the transmission phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// Reads must be answered with structured replies.
    pub structured_replies: bool,
    /// Transmission flags sent to the client (pass them to `proto::validate`).
    pub transmission_flags: u16,
}

/// How the handshake ended without error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The client chose the export: the transmission phase starts now.
    Serve(Negotiated),
    /// The client aborted or left between options (e.g. after listing).
    Closed,
}

/// Why the handshake failed; the connection must be closed.
#[derive(Debug, Error)]
pub enum HandshakeError {
    /// The socket failed, timed out or closed in the middle of a message.
    #[error("NBD handshake i/o: {0}")]
    Io(#[from] io::Error),
    /// The client broke the protocol; the message says how.
    #[error("NBD client broke the handshake: {0}")]
    Protocol(String),
}

/// Runs the server side of the fixed newstyle handshake on `s`.
///
/// Returns `Serve` once the client chose the export with `NBD_OPT_GO` or
/// `NBD_OPT_EXPORT_NAME`: the next bytes on `s` are transmission requests.
/// Reads never go past the option that ends negotiation, so the socket can be
/// handed to the transmission loop as is (do not wrap it in a read buffer).
/// Each batch of replies is written whole, then flushed.
pub fn serve_handshake<S: Read + Write>(
    s: &mut S,
    export: &Export,
) -> Result<Outcome, HandshakeError> {
    negotiate(s, export, true)
}

/// [`serve_handshake`] for a client the export may or may not take:
/// unless `admitted` (the export serves as many clients as it may),
/// `NBD_OPT_INFO` and `NBD_OPT_GO` are answered `NBD_REP_ERR_POLICY` with a
/// message, and `NBD_OPT_EXPORT_NAME`, which has no error reply, ends the
/// connection.
pub fn negotiate<S: Read + Write>(
    s: &mut S,
    export: &Export,
    admitted: bool,
) -> Result<Outcome, HandshakeError> {
    let mut greeting = Vec::with_capacity(18);
    greeting.extend_from_slice(&NBDMAGIC.to_be_bytes());
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&greeting)?;
    s.flush()?;

    let mut cf = [0u8; 4];
    if !read_or_eof(s, &mut cf)? {
        return Ok(Outcome::Closed);
    }
    let client_flags = u32::from_be_bytes(cf);
    if client_flags & !(C_FIXED_NEWSTYLE | C_NO_ZEROES) != 0 {
        return Err(protocol(format!(
            "client flags {client_flags:#x} set bits the server did not advertise"
        )));
    }
    if client_flags & C_FIXED_NEWSTYLE == 0 {
        return Err(protocol(
            "client did not set NBD_FLAG_C_FIXED_NEWSTYLE; only fixed newstyle is served",
        ));
    }

    let mut session = Session {
        export,
        no_zeroes: client_flags & C_NO_ZEROES != 0,
        structured: false,
        admitted,
    };
    for _ in 0..MAX_OPTIONS {
        let mut hdr = [0u8; 16];
        if !read_or_eof(s, &mut hdr)? {
            return Ok(Outcome::Closed);
        }
        let magic = u64::from_be_bytes(hdr[0..8].try_into().expect("8 bytes"));
        if magic != IHAVEOPT {
            return Err(protocol(format!(
                "option header starts with {magic:#018x}, not IHAVEOPT"
            )));
        }
        let opt = u32::from_be_bytes(hdr[8..12].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(hdr[12..16].try_into().expect("4 bytes"));

        let mut out = Vec::new();
        if len > MAX_OPTION_DATA {
            if opt == OPT_EXPORT_NAME || len > MAX_OPTION_DISCARD {
                return Err(protocol(format!(
                    "option {opt} carries {len} bytes of data, far beyond any valid option"
                )));
            }
            discard(s, len)?;
            let msg = format!("option data of {len} bytes exceeds {MAX_OPTION_DATA}");
            push_reply(&mut out, opt, REP_ERR_TOO_BIG, msg.as_bytes());
            s.write_all(&out)?;
            s.flush()?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        s.read_exact(&mut data)?;

        let step = session.handle(opt, &data, &mut out)?;
        if step == Some(Outcome::Closed) {
            // The client may drop the connection without waiting for the ACK
            // to NBD_OPT_ABORT; that is not an error.
            let _ = s.write_all(&out).and_then(|()| s.flush());
            return Ok(Outcome::Closed);
        }
        s.write_all(&out)?;
        s.flush()?;
        if let Some(outcome) = step {
            return Ok(outcome);
        }
    }
    Err(protocol(format!(
        "client sent {MAX_OPTIONS} options without choosing an export"
    )))
}

/// Negotiation state between options.
struct Session<'a> {
    export: &'a Export,
    no_zeroes: bool,
    structured: bool,
    /// The export has room for this client.
    admitted: bool,
}

impl Session<'_> {
    /// Answers one option into `out`; `Some` ends the negotiation.
    fn handle(
        &mut self,
        opt: u32,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<Option<Outcome>, HandshakeError> {
        match opt {
            OPT_EXPORT_NAME if !self.admitted => {
                return Err(protocol(
                    "the export serves as many clients as it may; NBD_OPT_EXPORT_NAME has no way to say so",
                ));
            }
            OPT_EXPORT_NAME => {
                if !self.names_export(data) {
                    return Err(protocol(format!(
                        "NBD_OPT_EXPORT_NAME chose unknown export {}",
                        show_name(data)
                    )));
                }
                let tflags = self.transmission_flags();
                out.extend_from_slice(&self.export.size.to_be_bytes());
                out.extend_from_slice(&tflags.to_be_bytes());
                if !self.no_zeroes {
                    out.extend_from_slice(&[0u8; EXPORT_NAME_PADDING]);
                }
                return Ok(Some(self.serve(tflags)));
            }
            OPT_ABORT => {
                push_reply(out, opt, REP_ACK, &[]);
                return Ok(Some(Outcome::Closed));
            }
            OPT_LIST if !data.is_empty() => invalid(out, opt, "NBD_OPT_LIST takes no data"),
            OPT_LIST => {
                let name = self.export.name.as_bytes();
                let desc = truncate_str(&self.export.description, MAX_STRING_LEN).as_bytes();
                let mut server = Vec::with_capacity(4 + name.len() + desc.len());
                server.extend_from_slice(&(name.len() as u32).to_be_bytes());
                server.extend_from_slice(name);
                server.extend_from_slice(desc);
                push_reply(out, opt, REP_SERVER, &server);
                push_reply(out, opt, REP_ACK, &[]);
            }
            OPT_STARTTLS if !data.is_empty() => {
                invalid(out, opt, "NBD_OPT_STARTTLS takes no data");
            }
            OPT_STARTTLS => {
                push_reply(
                    out,
                    opt,
                    REP_ERR_POLICY,
                    b"TLS is not offered by this server",
                );
            }
            OPT_INFO | OPT_GO => return Ok(self.info_or_go(opt, data, out)),
            OPT_STRUCTURED_REPLY if !data.is_empty() => {
                invalid(out, opt, "NBD_OPT_STRUCTURED_REPLY takes no data");
            }
            OPT_STRUCTURED_REPLY => {
                self.structured = true;
                push_reply(out, opt, REP_ACK, &[]);
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT if !self.structured => invalid(
                out,
                opt,
                "negotiate NBD_OPT_STRUCTURED_REPLY before metadata contexts",
            ),
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                if parse_meta_context(data).is_some() {
                    // No metadata context is supported: none listed, none selected.
                    push_reply(out, opt, REP_ACK, &[]);
                } else {
                    invalid(out, opt, "malformed metadata context request");
                }
            }
            _ => {
                let msg = format!("option {opt} is not supported");
                push_reply(out, opt, REP_ERR_UNSUP, msg.as_bytes());
            }
        }
        Ok(None)
    }

    /// `NBD_OPT_INFO` / `NBD_OPT_GO`: describe the export; GO also ends negotiation.
    fn info_or_go(&self, opt: u32, data: &[u8], out: &mut Vec<u8>) -> Option<Outcome> {
        let Some((name, requests)) = parse_info_request(data) else {
            invalid(out, opt, "malformed NBD_OPT_INFO/NBD_OPT_GO request");
            return None;
        };
        if !self.names_export(name) {
            let msg = format!(
                "unknown export {}; this server exports \"\" and {:?}",
                show_name(name),
                truncate_str(&self.export.name, 256)
            );
            push_reply(out, opt, REP_ERR_UNKNOWN, msg.as_bytes());
            return None;
        }
        if !self.admitted {
            let msg =
                "the export serves as many clients as it may (--nbd-max-clients); try again later";
            push_reply(out, opt, REP_ERR_POLICY, msg.as_bytes());
            return None;
        }
        let tflags = self.transmission_flags();
        let e = self.export;

        let mut info = Vec::with_capacity(14);
        info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        info.extend_from_slice(&e.size.to_be_bytes());
        info.extend_from_slice(&tflags.to_be_bytes());
        push_reply(out, opt, REP_INFO, &info);

        // Always sent: the server relies on the client honouring these limits.
        info.clear();
        info.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        for v in [e.min_block, e.preferred_block, e.max_block] {
            info.extend_from_slice(&v.to_be_bytes());
        }
        push_reply(out, opt, REP_INFO, &info);

        for (kind, text) in [(INFO_NAME, &e.name), (INFO_DESCRIPTION, &e.description)] {
            if requests.contains(&kind) {
                let text = truncate_str(text, MAX_STRING_LEN).as_bytes();
                let mut item = Vec::with_capacity(2 + text.len());
                item.extend_from_slice(&kind.to_be_bytes());
                item.extend_from_slice(text);
                push_reply(out, opt, REP_INFO, &item);
            }
        }
        push_reply(out, opt, REP_ACK, &[]);
        (opt == OPT_GO).then(|| self.serve(tflags))
    }

    /// Whether `name` selects our export: "" or its own name.
    fn names_export(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.export.name.as_bytes()
    }

    /// Transmission flags for the current negotiation state.
    fn transmission_flags(&self) -> u16 {
        let mut f = flags::HAS_FLAGS | self.export.flags;
        if self.export.read_only {
            f |= flags::READ_ONLY;
        }
        // The protocol forbids these without their prerequisite.
        if !self.structured {
            f &= !flags::SEND_DF;
        }
        if f & flags::SEND_WRITE_ZEROES == 0 {
            f &= !flags::SEND_FAST_ZERO;
        }
        f
    }

    fn serve(&self, transmission_flags: u16) -> Outcome {
        Outcome::Serve(Negotiated {
            structured_replies: self.structured,
            transmission_flags,
        })
    }
}

/// Splits `NBD_OPT_INFO`/`NBD_OPT_GO` data into the name and the information
/// requests; `None` if the lengths do not add up.
fn parse_info_request(data: &[u8]) -> Option<(&[u8], Vec<u16>)> {
    let mut r = Cursor(data);
    let name_len = r.u32()?;
    let name = r.take(usize::try_from(name_len).ok()?)?;
    let count = usize::from(r.u16()?);
    let list = r.take(count.checked_mul(2)?)?;
    if !r.0.is_empty() {
        return None;
    }
    let requests = list
        .chunks_exact(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    Some((name, requests))
}

/// Checks the syntax of `NBD_OPT_{LIST,SET}_META_CONTEXT` data: export name,
/// query count, queries; `None` if the lengths do not add up.
fn parse_meta_context(data: &[u8]) -> Option<()> {
    let mut r = Cursor(data);
    let name_len = r.u32()?;
    r.take(usize::try_from(name_len).ok()?)?;
    let count = r.u32()?;
    for _ in 0..count {
        // Each query consumes at least 4 bytes, so this ends within data.len() / 4 rounds.
        let len = r.u32()?;
        r.take(usize::try_from(len).ok()?)?;
    }
    r.0.is_empty().then_some(())
}

/// Reads big-endian fields off the front of a byte slice.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Appends one option reply: magic, option, reply type, length, data.
fn push_reply(out: &mut Vec<u8>, opt: u32, rep: u32, data: &[u8]) {
    out.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&opt.to_be_bytes());
    out.extend_from_slice(&rep.to_be_bytes());
    // Replies are built from bounded strings: far below 4 GiB.
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

fn invalid(out: &mut Vec<u8>, opt: u32, msg: &str) {
    push_reply(out, opt, REP_ERR_INVALID, msg.as_bytes());
}

fn protocol(msg: impl Into<String>) -> HandshakeError {
    HandshakeError::Protocol(msg.into())
}

/// A client-supplied name, quoted and shortened for messages.
fn show_name(name: &[u8]) -> String {
    let lossy = String::from_utf8_lossy(name);
    format!("{:?}", truncate_str(&lossy, 256))
}

/// Fills `buf`; `Ok(false)` if the peer closed before sending any byte of it.
fn read_or_eof<S: Read>(s: &mut S, buf: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match s.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads and drops `len` bytes.
fn discard<S: Read>(s: &mut S, len: u32) -> io::Result<()> {
    let copied = io::copy(&mut s.take(u64::from(len)), &mut io::sink())?;
    if copied < u64::from(len) {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::proto::{
        self, flags::*, structured_done, structured_error, structured_offset_data_header, Command,
        Request, REQUEST_LEN,
    };
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::path::PathBuf;
    use std::process::{Command as Process, Stdio};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::thread;
    use std::time::{Duration, Instant};

    const TIMEOUT: Duration = Duration::from_secs(5);
    const NQN: &str = "nqn.2026-11.io.rdmablk:test";
    const SERVED: u16 = SEND_FLUSH | SEND_FUA | SEND_TRIM | SEND_WRITE_ZEROES | CAN_MULTI_CONN;

    fn export() -> Export {
        Export {
            name: NQN.to_string(),
            description: "rdmablk test namespace".to_string(),
            size: 64 << 20,
            min_block: 512,
            preferred_block: 4096,
            max_block: 32 << 20,
            read_only: false,
            flags: SERVED,
        }
    }

    // ---- scripted client over a socket pair ----

    /// Runs the handshake against `client`; returns the server's result.
    fn run(
        export: Export,
        client: impl FnOnce(&mut UnixStream),
    ) -> Result<Outcome, HandshakeError> {
        let (mut c, mut s) = UnixStream::pair().unwrap();
        for sock in [&c, &s] {
            sock.set_read_timeout(Some(TIMEOUT)).unwrap();
            sock.set_write_timeout(Some(TIMEOUT)).unwrap();
        }
        let server = thread::spawn(move || serve_handshake(&mut s, &export));
        client(&mut c);
        server.join().unwrap()
    }

    /// Reads the greeting and answers with `client_flags`.
    fn greet(c: &mut UnixStream, client_flags: u32) {
        let mut g = [0u8; 18];
        c.read_exact(&mut g).unwrap();
        assert_eq!(&g[0..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(&g[16..18], &[0, 3]); // FIXED_NEWSTYLE | NO_ZEROES
        c.write_all(&client_flags.to_be_bytes()).unwrap();
    }

    fn send_opt(c: &mut UnixStream, opt: u32, data: &[u8]) {
        let mut m = Vec::new();
        m.extend_from_slice(b"IHAVEOPT");
        m.extend_from_slice(&opt.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        c.write_all(&m).unwrap();
    }

    /// Reads one option reply for `opt`; returns (reply type, data).
    fn reply(c: &mut UnixStream, opt: u32) -> (u32, Vec<u8>) {
        let mut h = [0u8; 20];
        c.read_exact(&mut h).unwrap();
        assert_eq!(&h[0..8], &[0, 3, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9]);
        assert_eq!(u32::from_be_bytes(h[8..12].try_into().unwrap()), opt);
        let rep = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut data = vec![0u8; len as usize];
        c.read_exact(&mut data).unwrap();
        (rep, data)
    }

    fn info_data(name: &str, requests: &[u16]) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
        for r in requests {
            d.extend_from_slice(&r.to_be_bytes());
        }
        d
    }

    fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
        let mut d = Vec::new();
        d.extend_from_slice(&(name.len() as u32).to_be_bytes());
        d.extend_from_slice(name.as_bytes());
        d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
        for q in queries {
            d.extend_from_slice(&(q.len() as u32).to_be_bytes());
            d.extend_from_slice(q.as_bytes());
        }
        d
    }

    fn assert_closed(c: &mut UnixStream) {
        let mut b = [0u8; 1];
        assert_eq!(c.read(&mut b).unwrap(), 0, "server should have closed");
    }

    #[test]
    fn options_then_go_with_block_size() {
        let out = run(export(), |c| {
            greet(c, C_FIXED_NEWSTYLE | C_NO_ZEROES);

            // Unknown option: UNSUP, and the stream stays in sync.
            send_opt(c, 42, b"xyz");
            let (rep, msg) = reply(c, 42);
            assert_eq!(rep, REP_ERR_UNSUP);
            assert_eq!(msg, b"option 42 is not supported");

            send_opt(c, OPT_LIST, &[]);
            let (rep, data) = reply(c, OPT_LIST);
            assert_eq!(rep, REP_SERVER);
            assert_eq!(&data[0..4], &(NQN.len() as u32).to_be_bytes());
            assert_eq!(&data[4..4 + NQN.len()], NQN.as_bytes());
            assert_eq!(&data[4 + NQN.len()..], b"rdmablk test namespace");
            assert_eq!(reply(c, OPT_LIST), (REP_ACK, vec![]));
            send_opt(c, OPT_LIST, b"x");
            assert_eq!(reply(c, OPT_LIST).0, REP_ERR_INVALID);

            send_opt(c, OPT_STARTTLS, &[]);
            assert_eq!(reply(c, OPT_STARTTLS).0, REP_ERR_POLICY);

            // Metadata contexts need structured replies first.
            send_opt(
                c,
                OPT_SET_META_CONTEXT,
                &meta_data("", &["base:allocation"]),
            );
            assert_eq!(reply(c, OPT_SET_META_CONTEXT).0, REP_ERR_INVALID);
            send_opt(c, OPT_STRUCTURED_REPLY, b"junk");
            assert_eq!(reply(c, OPT_STRUCTURED_REPLY).0, REP_ERR_INVALID);
            send_opt(c, OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(reply(c, OPT_STRUCTURED_REPLY), (REP_ACK, vec![]));
            for opt in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
                send_opt(c, opt, &meta_data(NQN, &["base:allocation", "qemu:"]));
                assert_eq!(reply(c, opt), (REP_ACK, vec![]), "no contexts offered");
                send_opt(c, opt, &meta_data("", &[]));
                assert_eq!(reply(c, opt), (REP_ACK, vec![]));
                let mut bad = meta_data("", &["base:allocation"]);
                bad.pop();
                send_opt(c, opt, &bad);
                assert_eq!(reply(c, opt).0, REP_ERR_INVALID);
            }

            // Bad names and malformed requests leave negotiation open.
            send_opt(c, OPT_INFO, &info_data("nqn.other", &[]));
            let (rep, msg) = reply(c, OPT_INFO);
            assert_eq!(rep, REP_ERR_UNKNOWN);
            assert!(String::from_utf8(msg).unwrap().contains("nqn.other"));
            let mut bad = info_data("", &[INFO_BLOCK_SIZE]);
            bad.push(0);
            send_opt(c, OPT_GO, &bad);
            assert_eq!(reply(c, OPT_GO).0, REP_ERR_INVALID);
            send_opt(c, OPT_GO, &[0, 0, 0, 9, b'x']);
            assert_eq!(reply(c, OPT_GO).0, REP_ERR_INVALID);

            // Oversized option: discarded, TOO_BIG, still in sync.
            send_opt(c, 77, &vec![0xaa; 100_000]);
            assert_eq!(reply(c, 77).0, REP_ERR_TOO_BIG);

            // INFO on the default export: no name/description unless asked.
            send_opt(c, OPT_INFO, &info_data("", &[]));
            let (rep, d) = reply(c, OPT_INFO);
            assert_eq!(rep, REP_INFO);
            assert_eq!(&d[0..2], &INFO_EXPORT.to_be_bytes());
            assert_eq!(reply(c, OPT_INFO).1[0..2], INFO_BLOCK_SIZE.to_be_bytes());
            assert_eq!(reply(c, OPT_INFO), (REP_ACK, vec![]));

            // GO by name, with block size, name, description and an unknown request.
            send_opt(
                c,
                OPT_GO,
                &info_data(NQN, &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION, 999]),
            );
            let mut expect_export = INFO_EXPORT.to_be_bytes().to_vec();
            expect_export.extend_from_slice(&(64u64 << 20).to_be_bytes());
            expect_export.extend_from_slice(&(HAS_FLAGS | SERVED).to_be_bytes());
            assert_eq!(reply(c, OPT_GO), (REP_INFO, expect_export));
            let mut expect_bs = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
            for v in [512u32, 4096, 32 << 20] {
                expect_bs.extend_from_slice(&v.to_be_bytes());
            }
            assert_eq!(reply(c, OPT_GO), (REP_INFO, expect_bs));
            let mut expect_name = INFO_NAME.to_be_bytes().to_vec();
            expect_name.extend_from_slice(NQN.as_bytes());
            assert_eq!(reply(c, OPT_GO), (REP_INFO, expect_name));
            let mut expect_desc = INFO_DESCRIPTION.to_be_bytes().to_vec();
            expect_desc.extend_from_slice(b"rdmablk test namespace");
            assert_eq!(reply(c, OPT_GO), (REP_INFO, expect_desc));
            assert_eq!(reply(c, OPT_GO), (REP_ACK, vec![]));
        });
        assert_eq!(
            out.unwrap(),
            Outcome::Serve(Negotiated {
                structured_replies: true,
                transmission_flags: HAS_FLAGS | SERVED,
            })
        );
    }

    #[test]
    fn abort_closes() {
        let out = run(export(), |c| {
            greet(c, C_FIXED_NEWSTYLE);
            send_opt(c, OPT_ABORT, b"ignored");
            assert_eq!(reply(c, OPT_ABORT), (REP_ACK, vec![]));
            assert_closed(c);
        });
        assert_eq!(out.unwrap(), Outcome::Closed);
        // A client that sends ABORT and leaves at once is no error either.
        let out = run(export(), |c| {
            greet(c, C_FIXED_NEWSTYLE);
            send_opt(c, OPT_ABORT, &[]);
            c.shutdown(std::net::Shutdown::Both).unwrap();
        });
        assert_eq!(out.unwrap(), Outcome::Closed);
    }

    #[test]
    fn leaving_between_options_closes() {
        let out = run(export(), |c| {
            greet(c, C_FIXED_NEWSTYLE);
            send_opt(c, OPT_LIST, &[]);
            reply(c, OPT_LIST);
            reply(c, OPT_LIST);
            c.shutdown(std::net::Shutdown::Write).unwrap();
        });
        assert_eq!(out.unwrap(), Outcome::Closed);
        // Leaving in the middle of an option is an I/O error.
        let out = run(export(), |c| {
            greet(c, C_FIXED_NEWSTYLE);
            c.write_all(b"IHAVEOPT\0\0").unwrap();
            c.shutdown(std::net::Shutdown::Write).unwrap();
        });
        assert!(
            matches!(out, Err(HandshakeError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof)
        );
    }

    #[test]
    fn export_name_with_and_without_zeroes() {
        for (client_flags, padding) in
            [(C_FIXED_NEWSTYLE, 124), (C_FIXED_NEWSTYLE | C_NO_ZEROES, 0)]
        {
            let mut e = export();
            e.read_only = true;
            e.flags |= SEND_DF; // dropped: no structured replies
            let out = run(e, |c| {
                greet(c, client_flags);
                send_opt(c, OPT_EXPORT_NAME, NQN.as_bytes());
                let mut r = vec![0u8; 10 + padding];
                c.read_exact(&mut r).unwrap();
                assert_eq!(&r[0..8], &(64u64 << 20).to_be_bytes());
                assert_eq!(&r[8..10], &(HAS_FLAGS | READ_ONLY | SERVED).to_be_bytes());
                assert!(r[10..].iter().all(|&b| b == 0));
                assert_closed(c);
            });
            assert_eq!(
                out.unwrap(),
                Outcome::Serve(Negotiated {
                    structured_replies: false,
                    transmission_flags: HAS_FLAGS | READ_ONLY | SERVED,
                })
            );
        }
    }

    #[test]
    fn structured_replies_allow_send_df() {
        let mut e = export();
        e.flags |= SEND_DF;
        let out = run(e, |c| {
            greet(c, C_FIXED_NEWSTYLE | C_NO_ZEROES);
            send_opt(c, OPT_STRUCTURED_REPLY, &[]);
            reply(c, OPT_STRUCTURED_REPLY);
            send_opt(c, OPT_EXPORT_NAME, &[]);
            let mut r = [0u8; 10];
            c.read_exact(&mut r).unwrap();
            assert_eq!(&r[8..10], &(HAS_FLAGS | SERVED | SEND_DF).to_be_bytes());
        });
        assert!(matches!(
            out.unwrap(),
            Outcome::Serve(Negotiated {
                structured_replies: true,
                ..
            })
        ));
    }

    /// Runs `client`; the server must fail with a protocol error mentioning
    /// `needle` and close the connection.
    fn expect_violation(needle: &str, client: impl FnOnce(&mut UnixStream)) {
        let out = run(export(), |c| {
            client(c);
            assert_closed(c);
        });
        match out {
            Err(HandshakeError::Protocol(msg)) => assert!(msg.contains(needle), "{msg}"),
            other => panic!("{needle}: {other:?}"),
        }
    }

    #[test]
    fn protocol_violations_close() {
        expect_violation("unknown export", |c| {
            greet(c, C_FIXED_NEWSTYLE);
            send_opt(c, OPT_EXPORT_NAME, b"nqn.other");
        });
        expect_violation("did not advertise", |c| greet(c, C_FIXED_NEWSTYLE | 4));
        expect_violation("FIXED_NEWSTYLE", |c| greet(c, 0));
        expect_violation("not IHAVEOPT", |c| {
            greet(c, C_FIXED_NEWSTYLE);
            c.write_all(&[0u8; 16]).unwrap();
        });
        expect_violation("far beyond", |c| {
            greet(c, C_FIXED_NEWSTYLE);
            let mut h = b"IHAVEOPT".to_vec();
            h.extend_from_slice(&OPT_INFO.to_be_bytes());
            h.extend_from_slice(&u32::MAX.to_be_bytes());
            c.write_all(&h).unwrap();
        });
        expect_violation("without choosing", |c| {
            greet(c, C_FIXED_NEWSTYLE);
            for _ in 0..MAX_OPTIONS {
                send_opt(c, OPT_LIST, &[]);
                reply(c, OPT_LIST);
                reply(c, OPT_LIST);
            }
        });
    }

    #[test]
    fn info_request_parsing_is_bounded() {
        assert_eq!(
            parse_info_request(&info_data("ab", &[3, 1])),
            Some((&b"ab"[..], vec![3, 1]))
        );
        assert_eq!(parse_info_request(&[]), None);
        assert_eq!(parse_info_request(&[0xff, 0xff, 0xff, 0xff, 0, 0]), None);
        assert_eq!(parse_info_request(&[0, 0, 0, 0, 0xff, 0xff]), None);
        assert_eq!(
            parse_meta_context(&meta_data("x", &["a:", "b:c"])),
            Some(())
        );
        assert_eq!(
            parse_meta_context(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]),
            None
        );
        assert_eq!(
            parse_meta_context(&[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5]),
            None
        );
    }

    // ---- interoperability with libnbd's tools ----

    /// A temporary directory holding the server's socket, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicUsize = AtomicUsize::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("nbd-test-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Test-only transmission loop over an in-memory disk. Returns the
    /// number of requests served.
    fn transmit(s: &mut UnixStream, neg: Negotiated, e: &Export, disk: &Mutex<Vec<u8>>) -> usize {
        let mut served = 0;
        loop {
            let mut h = [0u8; REQUEST_LEN];
            if !read_or_eof(s, &mut h).unwrap() {
                return served;
            }
            let req = Request::parse(&h).unwrap();
            let mut payload = vec![0u8; req.payload_len() as usize];
            s.read_exact(&mut payload).unwrap();
            if req.command == Command::Disc {
                return served;
            }
            served += 1;
            // Only used once validate() has bounded the range by the disk size.
            let range =
                req.offset as usize..req.offset.saturating_add(u64::from(req.length)) as usize;
            let mut out = Vec::new();
            match proto::validate(&req, e.size, neg.transmission_flags, e.max_block) {
                Err(err) if neg.structured_replies => {
                    out.extend(structured_error(req.cookie, err, "rejected"));
                }
                Err(err) => out.extend(proto::simple_reply(err, req.cookie)),
                Ok(()) if req.command == Command::Read => {
                    let disk = disk.lock().unwrap();
                    if !neg.structured_replies {
                        out.extend(proto::simple_reply(0, req.cookie));
                    } else if req.length > 0 {
                        out.extend(structured_offset_data_header(
                            req.cookie, req.offset, req.length, true,
                        ));
                    } else {
                        out.extend(structured_done(req.cookie));
                    }
                    out.extend_from_slice(&disk[range]);
                }
                Ok(()) => {
                    let mut disk = disk.lock().unwrap();
                    match req.command {
                        Command::Write => disk[range].copy_from_slice(&payload),
                        Command::WriteZeroes | Command::Trim => disk[range].fill(0),
                        _ => {}
                    }
                    out.extend(proto::simple_reply(0, req.cookie));
                }
            }
            s.write_all(&out).unwrap();
        }
    }

    /// Serves `e` over `disk` on a fresh socket while `tool` runs with the
    /// arguments `args(uri)`; returns its stdout, the number of transmission
    /// requests served and the final disk.
    fn with_tool(
        e: Export,
        disk: Vec<u8>,
        tool: &str,
        name: &str,
        args: impl Fn(&str) -> Vec<String>,
    ) -> (String, usize, Vec<u8>) {
        let dir = TempDir::new();
        let sock = dir.0.join("nbd.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        listener.set_nonblocking(true).unwrap();

        let uri = format!("nbd+unix:///{name}?socket={}", sock.display());
        let mut child = match Process::new(tool)
            .args(args(&uri))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(child) => child,
            Err(err) => panic!("cannot run {tool} ({err}): apt-get install libnbd-bin"),
        };

        let done = Arc::new(AtomicBool::new(false));
        let disk = Arc::new(Mutex::new(disk));
        let server = {
            let (done, disk) = (done.clone(), disk.clone());
            thread::spawn(move || {
                let mut conns = Vec::new();
                while !done.load(Ordering::Relaxed) {
                    let mut s = match listener.accept() {
                        Ok((s, _)) => s,
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                            thread::sleep(Duration::from_millis(5));
                            continue;
                        }
                        Err(err) => panic!("accept: {err}"),
                    };
                    let (e, disk) = (e.clone(), disk.clone());
                    conns.push(thread::spawn(move || {
                        s.set_nonblocking(false).unwrap();
                        s.set_read_timeout(Some(TIMEOUT)).unwrap();
                        s.set_write_timeout(Some(TIMEOUT)).unwrap();
                        match serve_handshake(&mut s, &e).unwrap() {
                            Outcome::Serve(neg) => transmit(&mut s, neg, &e, &disk),
                            Outcome::Closed => 0,
                        }
                    }));
                }
                conns.into_iter().map(|c| c.join().unwrap()).sum::<usize>()
            })
        };

        let deadline = Instant::now() + TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                done.store(true, Ordering::Relaxed);
                panic!("{tool} did not finish within {TIMEOUT:?}");
            }
            thread::sleep(Duration::from_millis(10));
        };
        done.store(true, Ordering::Relaxed);
        let served = server.join().unwrap();
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            status.success(),
            "{tool} failed: {status}\n{stdout}\n{stderr}"
        );
        let disk = std::mem::take(&mut *disk.lock().unwrap());
        (stdout, served, disk)
    }

    /// The raw value of `"key": value` in nbdinfo's JSON (one field per line).
    fn field<'a>(json: &'a str, key: &str) -> &'a str {
        let pat = format!("\"{key}\": ");
        let at = json
            .find(&pat)
            .unwrap_or_else(|| panic!("no {key} in {json}"));
        let rest = &json[at + pat.len()..];
        rest[..rest.find([',', '\n']).unwrap_or(rest.len())].trim()
    }

    /// Runs `nbdinfo ARGS URI` against `e`; returns its JSON and the number of
    /// transmission requests it made.
    fn nbdinfo(e: Export, args: &[&str], name: &str) -> (String, usize) {
        let disk = vec![0u8; e.size as usize];
        let (json, served, _) = with_tool(e, disk, "nbdinfo", name, |uri| {
            args.iter()
                .map(|a| a.to_string())
                .chain([uri.to_string()])
                .collect()
        });
        (json, served)
    }

    #[test]
    fn nbdinfo_default_export() {
        let (json, served) = nbdinfo(export(), &["--json"], "");
        assert_eq!(field(&json, "protocol"), "\"newstyle-fixed\"");
        assert_eq!(field(&json, "structured"), "true");
        // NBD_INFO_NAME reports the canonical name of the default export.
        assert_eq!(field(&json, "export-name"), format!("\"{NQN}\""));
        assert_eq!(field(&json, "export-size"), (64u64 << 20).to_string());
        assert_eq!(field(&json, "block_size_minimum"), "512");
        assert_eq!(field(&json, "block_size_preferred"), "4096");
        assert_eq!(
            field(&json, "block_size_maximum"),
            (32u32 << 20).to_string()
        );
        for (key, value) in [
            ("is_read_only", "false"),
            ("is_rotational", "false"),
            ("can_flush", "true"),
            ("can_fua", "true"),
            ("can_trim", "true"),
            ("can_zero", "true"),
            ("can_multi_conn", "true"),
            ("can_fast_zero", "false"),
            ("can_df", "false"),
            ("can_cache", "false"),
        ] {
            assert_eq!(field(&json, key), value, "{key} in {json}");
        }
        assert!(served > 0, "nbdinfo reads the content: {json}");
    }

    #[test]
    fn nbdinfo_named_read_only_export() {
        let mut e = export();
        e.read_only = true;
        e.preferred_block = 512;
        let (json, _) = nbdinfo(e, &["--json"], NQN);
        assert_eq!(field(&json, "export-name"), format!("\"{NQN}\""));
        assert_eq!(field(&json, "is_read_only"), "true");
        assert_eq!(field(&json, "block_size_preferred"), "512");
        assert_eq!(field(&json, "description"), "\"rdmablk test namespace\"");
    }

    #[test]
    fn nbdinfo_list() {
        let (json, _) = nbdinfo(export(), &["--list", "--json"], "");
        assert_eq!(field(&json, "export-name"), format!("\"{NQN}\""));
        assert_eq!(field(&json, "description"), "\"rdmablk test namespace\"");
        assert_eq!(field(&json, "export-size"), (64u64 << 20).to_string());
        assert_eq!(field(&json, "can_multi_conn"), "true");
    }

    #[test]
    fn nbdcopy_round_trip() {
        let dir = TempDir::new();
        let mut e = export();
        e.size = 4 << 20;
        // A zero run lets nbdcopy use write-zeroes or trim.
        let mut image: Vec<u8> = (0..e.size as usize).map(|i| (i * 7 % 251) as u8).collect();
        image[1 << 20..2 << 20].fill(0);
        let src = dir.0.join("src.img");
        let dst = dir.0.join("dst.img");
        std::fs::write(&src, &image).unwrap();

        let stale = vec![0xee; e.size as usize];
        let (_, writes, disk) = with_tool(e.clone(), stale, "nbdcopy", "", |uri| {
            vec!["--flush".into(), src.display().to_string(), uri.to_string()]
        });
        assert!(writes > 0);
        assert!(disk == image, "the export holds what nbdcopy wrote");

        let (_, reads, _) = with_tool(e, disk, "nbdcopy", NQN, |uri| {
            vec![uri.to_string(), dst.display().to_string()]
        });
        assert!(reads > 0);
        assert!(
            std::fs::read(&dst).unwrap() == image,
            "nbdcopy read back the image"
        );
    }
}
