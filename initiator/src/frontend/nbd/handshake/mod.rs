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
mod tests;
