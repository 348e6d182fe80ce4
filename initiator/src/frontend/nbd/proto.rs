//! NBD transmission phase: request parsing, reply encoding and request checks.
//!
//! Pure functions over byte arrays, big-endian on the wire, as laid out in the
//! NBD protocol document (`doc/proto.md` of the NBD project).

use thiserror::Error;

/// Size of a request header on the wire (compact headers).
pub const REQUEST_LEN: usize = 28;
/// Size of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Size of a structured reply chunk header, without payload.
pub const STRUCTURED_HEADER_LEN: usize = 20;

/// `NBD_REQUEST_MAGIC`, first field of every request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// `NBD_SIMPLE_REPLY_MAGIC`, first field of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_STRUCTURED_REPLY_MAGIC`, first field of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// `NBD_REPLY_FLAG_DONE`: this chunk is the last one of its reply.
const REPLY_FLAG_DONE: u16 = 1 << 0;
/// `NBD_REPLY_TYPE_NONE`.
const REPLY_TYPE_NONE: u16 = 0;
/// `NBD_REPLY_TYPE_OFFSET_DATA`.
const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// `NBD_REPLY_TYPE_ERROR`.
const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

/// Longest string the protocol allows (export names, error messages).
pub const MAX_STRING_LEN: usize = 4096;

/// Command flags (per request) and transmission flags (per export).
pub mod flags {
    /// `NBD_CMD_FLAG_FUA`: persist before replying; valid on any command once
    /// `SEND_FUA` is advertised.
    pub const FUA: u16 = 1 << 0;
    /// `NBD_CMD_FLAG_NO_HOLE`: write-zeroes must leave the range allocated.
    pub const NO_HOLE: u16 = 1 << 1;
    /// `NBD_CMD_FLAG_DF`: reply to this read with at most one content chunk.
    pub const DF: u16 = 1 << 2;
    /// `NBD_CMD_FLAG_REQ_ONE`: block status for one extent only.
    pub const REQ_ONE: u16 = 1 << 3;
    /// `NBD_CMD_FLAG_FAST_ZERO`: fail write-zeroes with `ENOTSUP` unless it is fast.
    pub const FAST_ZERO: u16 = 1 << 4;

    /// `NBD_FLAG_HAS_FLAGS`: always set.
    pub const HAS_FLAGS: u16 = 1 << 0;
    /// `NBD_FLAG_READ_ONLY`: the export rejects writes.
    pub const READ_ONLY: u16 = 1 << 1;
    /// `NBD_FLAG_SEND_FLUSH`: the server handles `NBD_CMD_FLUSH`.
    pub const SEND_FLUSH: u16 = 1 << 2;
    /// `NBD_FLAG_SEND_FUA`: the server honours `NBD_CMD_FLAG_FUA`.
    pub const SEND_FUA: u16 = 1 << 3;
    /// `NBD_FLAG_ROTATIONAL`: hint that the medium is rotational.
    pub const ROTATIONAL: u16 = 1 << 4;
    /// `NBD_FLAG_SEND_TRIM`: the server handles `NBD_CMD_TRIM`.
    pub const SEND_TRIM: u16 = 1 << 5;
    /// `NBD_FLAG_SEND_WRITE_ZEROES`: the server handles `NBD_CMD_WRITE_ZEROES`
    /// and `NBD_CMD_FLAG_NO_HOLE`.
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    /// `NBD_FLAG_SEND_DF`: reads honour `NBD_CMD_FLAG_DF` (structured replies only).
    pub const SEND_DF: u16 = 1 << 7;
    /// `NBD_FLAG_CAN_MULTI_CONN`: flush and FUA are visible across connections.
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    /// `NBD_FLAG_SEND_RESIZE`: resize extension.
    pub const SEND_RESIZE: u16 = 1 << 9;
    /// `NBD_FLAG_SEND_CACHE`: the server handles `NBD_CMD_CACHE`.
    pub const SEND_CACHE: u16 = 1 << 10;
    /// `NBD_FLAG_SEND_FAST_ZERO`: write-zeroes honours `NBD_CMD_FLAG_FAST_ZERO`.
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Error values carried in replies (`NBD_E*`).
pub mod errno {
    /// Operation not permitted (write to a read-only export).
    pub const EPERM: u32 = 1;
    /// Input/output error.
    pub const EIO: u32 = 5;
    /// Cannot allocate memory (avoid).
    pub const ENOMEM: u32 = 12;
    /// Invalid argument.
    pub const EINVAL: u32 = 22;
    /// No space left on device (write beyond the end).
    pub const ENOSPC: u32 = 28;
    /// Value too large (only for `DF` reads).
    pub const EOVERFLOW: u32 = 75;
    /// Operation not supported (only for `FAST_ZERO` write-zeroes).
    pub const ENOTSUP: u32 = 95;
    /// Server is shutting down.
    pub const ESHUTDOWN: u32 = 108;
}

/// Request type (`NBD_CMD_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `NBD_CMD_READ` (0).
    Read,
    /// `NBD_CMD_WRITE` (1); `length` bytes of payload follow the header.
    Write,
    /// `NBD_CMD_DISC` (2): soft disconnect, no reply.
    Disc,
    /// `NBD_CMD_FLUSH` (3).
    Flush,
    /// `NBD_CMD_TRIM` (4).
    Trim,
    /// `NBD_CMD_CACHE` (5).
    Cache,
    /// `NBD_CMD_WRITE_ZEROES` (6).
    WriteZeroes,
    /// `NBD_CMD_BLOCK_STATUS` (7).
    BlockStatus,
    /// Any other type value.
    Unknown(u16),
}

impl From<u16> for Command {
    fn from(v: u16) -> Self {
        match v {
            0 => Command::Read,
            1 => Command::Write,
            2 => Command::Disc,
            3 => Command::Flush,
            4 => Command::Trim,
            5 => Command::Cache,
            6 => Command::WriteZeroes,
            7 => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }
}

impl From<Command> for u16 {
    fn from(c: Command) -> Self {
        match c {
            Command::Read => 0,
            Command::Write => 1,
            Command::Disc => 2,
            Command::Flush => 3,
            Command::Trim => 4,
            Command::Cache => 5,
            Command::WriteZeroes => 6,
            Command::BlockStatus => 7,
            Command::Unknown(v) => v,
        }
    }
}

/// Errors decoding transmission-phase messages.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ProtoError {
    /// The header does not start with `NBD_REQUEST_MAGIC`: the stream is out of sync.
    #[error("bad request magic {0:#010x}, expected 0x25609513: the client sent garbage or the stream lost sync")]
    BadMagic(u32),
}

/// A request header as sent by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags (`flags::FUA`, `NO_HOLE`, `DF`, `REQ_ONE`, `FAST_ZERO`).
    pub flags: u16,
    /// Request type.
    pub command: Command,
    /// Opaque value echoed in every reply to this request (the spec's "handle").
    pub cookie: u64,
    /// Byte offset into the export.
    pub offset: u64,
    /// Byte length of the range.
    pub length: u32,
}

impl Request {
    /// Decodes a request header; any command value is accepted (`Command::Unknown`).
    pub fn parse(b: &[u8; REQUEST_LEN]) -> Result<Request, ProtoError> {
        let magic = be_u32(&b[0..4]);
        if magic != REQUEST_MAGIC {
            return Err(ProtoError::BadMagic(magic));
        }
        Ok(Request {
            flags: be_u16(&b[4..6]),
            command: Command::from(be_u16(&b[6..8])),
            cookie: be_u64(&b[8..16]),
            offset: be_u64(&b[16..24]),
            length: be_u32(&b[24..28]),
        })
    }

    /// Encodes the header as a client would send it.
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&u16::from(self.command).to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Bytes of payload that follow this header on the wire (`length` for a
    /// write, else 0). They must be consumed even when the request is rejected.
    pub fn payload_len(&self) -> u32 {
        match self.command {
            Command::Write => self.length,
            _ => 0,
        }
    }
}

/// Checks a request against the export before it is executed.
///
/// `transmission_flags` are the flags sent to the client at the end of the
/// handshake (`Negotiated::transmission_flags`): a command or command flag is
/// valid only if the protocol documents it for that command and the feature
/// was advertised. Returns the errno for the reply:
/// - unknown command, unadvertised command, flag not valid for the command,
///   `BLOCK_STATUS` (no metadata context is ever selected), non-zero
///   offset/length on `FLUSH` → `EINVAL`;
/// - write, trim or write-zeroes on a read-only export → `EPERM`;
/// - write or write-zeroes past the end (or `offset + length` overflowing) →
///   `ENOSPC`; read, trim or cache past the end → `EINVAL`;
/// - read, write or cache longer than `max_block` → `EINVAL` (trim and
///   write-zeroes carry no payload and are not bounded by it: the server
///   splits them).
///
/// `DISC` is always accepted: it has no reply. Zero-length requests are
/// accepted (the protocol leaves them unspecified but forbids disconnecting);
/// the caller can complete them at once. Alignment to the minimum block size
/// is not enforced: unaligned requests are served by read-modify-write.
pub fn validate(
    req: &Request,
    export_size: u64,
    transmission_flags: u16,
    max_block: u32,
) -> Result<(), u32> {
    use flags::*;
    let advertised = |f: u16| transmission_flags & f != 0;
    let if_advertised = |f: u16, flag: u16| if advertised(f) { flag } else { 0 };

    // Which flags the command may carry, and whether the command was advertised.
    let (allowed, exposed) = match req.command {
        Command::Disc => return Ok(()),
        Command::Read => (if_advertised(SEND_DF, DF), true),
        Command::Write => (0, true),
        Command::Flush => (0, advertised(SEND_FLUSH)),
        Command::Trim => (0, advertised(SEND_TRIM)),
        Command::Cache => (0, advertised(SEND_CACHE)),
        Command::WriteZeroes => (
            NO_HOLE | if_advertised(SEND_FAST_ZERO, FAST_ZERO),
            advertised(SEND_WRITE_ZEROES),
        ),
        Command::BlockStatus | Command::Unknown(_) => return Err(errno::EINVAL),
    };
    let allowed = allowed | if_advertised(SEND_FUA, FUA);
    if !exposed || req.flags & !allowed != 0 {
        return Err(errno::EINVAL);
    }

    let writes = matches!(
        req.command,
        Command::Write | Command::Trim | Command::WriteZeroes
    );
    if writes && advertised(READ_ONLY) {
        return Err(errno::EPERM);
    }

    if req.command == Command::Flush {
        return if req.offset == 0 && req.length == 0 {
            Ok(())
        } else {
            Err(errno::EINVAL)
        };
    }

    let in_bounds = req
        .offset
        .checked_add(u64::from(req.length))
        .is_some_and(|end| end <= export_size);
    if !in_bounds {
        return Err(match req.command {
            Command::Write | Command::WriteZeroes => errno::ENOSPC,
            _ => errno::EINVAL,
        });
    }

    let bounded = !matches!(req.command, Command::Trim | Command::WriteZeroes);
    if bounded && req.length > max_block {
        return Err(errno::EINVAL);
    }
    Ok(())
}

/// Simple reply header; for a successful read without structured replies,
/// `length` bytes of data follow it.
pub fn simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut b = [0u8; SIMPLE_REPLY_LEN];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// Structured reply chunk header (magic, flags, type, cookie, payload length).
fn structured_header(cookie: u64, flags: u16, kind: u16, len: u32) -> [u8; STRUCTURED_HEADER_LEN] {
    let mut b = [0u8; STRUCTURED_HEADER_LEN];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b[16..20].copy_from_slice(&len.to_be_bytes());
    b
}

/// `NBD_REPLY_TYPE_OFFSET_DATA` chunk header including its 8-byte offset;
/// `data_len` bytes of data for export `offset` follow it. Set `done` only when
/// no error can be detected any more while the data is sent.
///
/// # Panics
/// If `data_len` is 0 (answer a zero-length read with [`structured_done`]) or
/// larger than `u32::MAX - 8` (reads that large must be split into chunks).
pub fn structured_offset_data_header(
    cookie: u64,
    offset: u64,
    data_len: u32,
    done: bool,
) -> [u8; STRUCTURED_HEADER_LEN + 8] {
    assert!(
        data_len > 0,
        "an OFFSET_DATA chunk carries at least one byte"
    );
    let len = data_len
        .checked_add(8)
        .expect("OFFSET_DATA chunk longer than u32::MAX - 8: split the read");
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    let mut b = [0u8; STRUCTURED_HEADER_LEN + 8];
    b[..STRUCTURED_HEADER_LEN].copy_from_slice(&structured_header(
        cookie,
        flags,
        REPLY_TYPE_OFFSET_DATA,
        len,
    ));
    b[STRUCTURED_HEADER_LEN..].copy_from_slice(&offset.to_be_bytes());
    b
}

/// Final `NBD_REPLY_TYPE_ERROR` chunk: `error` (non-zero `errno` value) and a
/// message for humans, cut at a character boundary to the protocol's 4096-byte
/// string limit.
pub fn structured_error(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let msg = truncate_str(message, MAX_STRING_LEN);
    // Fits: at most 4096 bytes.
    let msg_len = msg.len() as u16;
    let payload_len = 4 + 2 + u32::from(msg_len);
    let mut v = Vec::with_capacity(STRUCTURED_HEADER_LEN + payload_len as usize);
    v.extend_from_slice(&structured_header(
        cookie,
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        payload_len,
    ));
    v.extend_from_slice(&error.to_be_bytes());
    v.extend_from_slice(&msg_len.to_be_bytes());
    v.extend_from_slice(msg.as_bytes());
    v
}

/// Final `NBD_REPLY_TYPE_NONE` chunk: the request succeeded (if no error
/// chunk came before).
pub fn structured_done(cookie: u64) -> [u8; STRUCTURED_HEADER_LEN] {
    structured_header(cookie, REPLY_FLAG_DONE, REPLY_TYPE_NONE, 0)
}

/// Longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub(crate) fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::flags::*;
    use super::*;

    const SIZE: u64 = 1 << 30;
    const MAX: u32 = 32 << 20;
    const ALL: u16 = HAS_FLAGS | SEND_FLUSH | SEND_FUA | SEND_TRIM | SEND_WRITE_ZEROES;

    fn req(command: Command, flags: u16, offset: u64, length: u32) -> Request {
        Request {
            flags,
            command,
            cookie: 7,
            offset,
            length,
        }
    }

    #[test]
    fn request_layout_matches_spec() {
        let wire: [u8; REQUEST_LEN] = [
            0x25, 0x60, 0x95, 0x13, // magic
            0x00, 0x01, // flags: FUA
            0x00, 0x01, // type: WRITE
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // cookie
            0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, // offset 1 MiB
            0x00, 0x00, 0x10, 0x00, // length 4096
        ];
        let r = Request::parse(&wire).unwrap();
        assert_eq!(
            r,
            Request {
                flags: FUA,
                command: Command::Write,
                cookie: 0x0102_0304_0506_0708,
                offset: 1 << 20,
                length: 4096,
            }
        );
        assert_eq!(r.encode(), wire);
        assert_eq!(r.payload_len(), 4096);
    }

    #[test]
    fn request_bad_magic_is_an_error() {
        let mut wire = req(Command::Read, 0, 0, 512).encode();
        wire[0] = 0x67;
        let e = Request::parse(&wire).unwrap_err();
        assert_eq!(e, ProtoError::BadMagic(0x6760_9513));
        assert!(e.to_string().contains("0x25609513"), "{e}");
    }

    #[test]
    fn command_values_round_trip() {
        let known = [
            (0, Command::Read),
            (1, Command::Write),
            (2, Command::Disc),
            (3, Command::Flush),
            (4, Command::Trim),
            (5, Command::Cache),
            (6, Command::WriteZeroes),
            (7, Command::BlockStatus),
            (8, Command::Unknown(8)),
            (0xffff, Command::Unknown(0xffff)),
        ];
        for (v, c) in known {
            assert_eq!(Command::from(v), c);
            assert_eq!(u16::from(c), v);
            let r = req(c, 0, 0, 0);
            assert_eq!(Request::parse(&r.encode()).unwrap(), r);
        }
        assert_eq!(req(Command::Read, 0, 0, 512).payload_len(), 0);
    }

    #[test]
    fn flag_values_match_spec() {
        assert_eq!([FUA, NO_HOLE, DF, REQ_ONE, FAST_ZERO], [1, 2, 4, 8, 16]);
        let t = [
            HAS_FLAGS,
            READ_ONLY,
            SEND_FLUSH,
            SEND_FUA,
            ROTATIONAL,
            SEND_TRIM,
            SEND_WRITE_ZEROES,
            SEND_DF,
            CAN_MULTI_CONN,
            SEND_RESIZE,
            SEND_CACHE,
            SEND_FAST_ZERO,
        ];
        for (bit, f) in t.iter().enumerate() {
            assert_eq!(*f, 1 << bit);
        }
        use super::errno::*;
        assert_eq!(
            [EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP, ESHUTDOWN],
            [1, 5, 12, 22, 28, 75, 95, 108]
        );
    }

    #[test]
    fn simple_reply_layout() {
        assert_eq!(
            simple_reply(errno::EIO, 0x1122_3344_5566_7788),
            [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 5, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]
        );
    }

    #[test]
    fn structured_offset_data_layout() {
        let h = structured_offset_data_header(0xaabb, 0x1000, 512, true);
        assert_eq!(
            h,
            [
                0x66, 0x8e, 0x33, 0xef, // magic
                0x00, 0x01, // flags: DONE
                0x00, 0x01, // type: OFFSET_DATA
                0, 0, 0, 0, 0, 0, 0xaa, 0xbb, // cookie
                0x00, 0x00, 0x02, 0x08, // length: 8 + 512
                0, 0, 0, 0, 0, 0, 0x10, 0x00, // offset
            ]
        );
        let h = structured_offset_data_header(1, 0, u32::MAX - 8, false);
        assert_eq!(&h[4..6], &[0, 0]);
        assert_eq!(&h[16..20], &u32::MAX.to_be_bytes());
    }

    #[test]
    #[should_panic(expected = "split the read")]
    fn structured_offset_data_too_long_panics() {
        structured_offset_data_header(1, 0, u32::MAX - 7, true);
    }

    #[test]
    fn structured_error_layout() {
        let v = structured_error(9, errno::EINVAL, "bad");
        assert_eq!(
            v,
            [
                0x66, 0x8e, 0x33, 0xef, // magic
                0x00, 0x01, // flags: DONE
                0x80, 0x01, // type: ERROR
                0, 0, 0, 0, 0, 0, 0, 9, // cookie
                0, 0, 0, 9, // length: 4 + 2 + 3
                0, 0, 0, 22, // error
                0, 3, // message length
                b'b', b'a', b'd',
            ]
        );
        // Over-long messages are cut at a character boundary within 4096 bytes.
        let long = "é".repeat(3000); // 6000 bytes, 2 per char
        let v = structured_error(9, errno::EIO, &long);
        assert_eq!(&v[24..26], &4096u16.to_be_bytes());
        assert_eq!(v.len(), 20 + 6 + 4096);
        assert_eq!(&v[16..20], &(6u32 + 4096).to_be_bytes());
        let v = structured_error(9, errno::EIO, &format!("x{long}"));
        assert_eq!(&v[24..26], &4095u16.to_be_bytes());
        assert!(std::str::from_utf8(&v[26..]).is_ok());
    }

    #[test]
    fn structured_done_layout() {
        assert_eq!(
            structured_done(0x0102_0304_0506_0708),
            [0x66, 0x8e, 0x33, 0xef, 0x00, 0x01, 0x00, 0x00, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0]
        );
    }

    #[test]
    fn validate_accepts_good_requests() {
        for c in [
            Command::Read,
            Command::Write,
            Command::Trim,
            Command::WriteZeroes,
        ] {
            assert_eq!(
                validate(&req(c, 0, 0, 4096), SIZE, ALL, MAX),
                Ok(()),
                "{c:?}"
            );
            assert_eq!(
                validate(&req(c, FUA, SIZE - 512, 512), SIZE, ALL, MAX),
                Ok(())
            );
            // Zero length is left to the caller.
            assert_eq!(validate(&req(c, 0, SIZE, 0), SIZE, ALL, MAX), Ok(()));
        }
        assert_eq!(
            validate(&req(Command::Read, 0, 0, MAX), SIZE, ALL, MAX),
            Ok(())
        );
        assert_eq!(
            validate(&req(Command::Flush, 0, 0, 0), SIZE, ALL, MAX),
            Ok(())
        );
        assert_eq!(
            validate(&req(Command::Flush, FUA, 0, 0), SIZE, ALL, MAX),
            Ok(())
        );
        let nh = req(Command::WriteZeroes, NO_HOLE | FUA, 0, 4096);
        assert_eq!(validate(&nh, SIZE, ALL, MAX), Ok(()));
        // Trim and write-zeroes are not bounded by max_block.
        let big = req(Command::Trim, 0, 0, MAX + 512);
        assert_eq!(validate(&big, SIZE, ALL, MAX), Ok(()));
        let fz = req(Command::WriteZeroes, FAST_ZERO, 0, MAX + 512);
        assert_eq!(validate(&fz, SIZE, ALL | SEND_FAST_ZERO, MAX), Ok(()));
        // DISC needs no checks: it has no reply.
        let disc = req(Command::Disc, 0xffff, 5, 5);
        assert_eq!(validate(&disc, SIZE, READ_ONLY, MAX), Ok(()));
        let df = req(Command::Read, DF, 0, 512);
        assert_eq!(validate(&df, SIZE, ALL | SEND_DF, MAX), Ok(()));
        let cache = req(Command::Cache, 0, 0, 512);
        assert_eq!(validate(&cache, SIZE, ALL | SEND_CACHE, MAX), Ok(()));
    }

    #[test]
    fn validate_rejects_bad_commands_and_flags() {
        let e = |r: Request, tf: u16| validate(&r, SIZE, tf, MAX);
        assert_eq!(
            e(req(Command::Unknown(42), 0, 0, 0), ALL),
            Err(errno::EINVAL)
        );
        assert_eq!(
            e(req(Command::BlockStatus, 0, 0, 512), ALL),
            Err(errno::EINVAL)
        );
        // Commands whose feature was not advertised.
        assert_eq!(
            e(req(Command::Flush, 0, 0, 0), HAS_FLAGS),
            Err(errno::EINVAL)
        );
        assert_eq!(
            e(req(Command::Trim, 0, 0, 512), HAS_FLAGS),
            Err(errno::EINVAL)
        );
        assert_eq!(
            e(req(Command::WriteZeroes, 0, 0, 512), HAS_FLAGS),
            Err(errno::EINVAL)
        );
        assert_eq!(e(req(Command::Cache, 0, 0, 512), ALL), Err(errno::EINVAL));
        // Flags not advertised, not valid for the command, or unknown.
        assert_eq!(
            e(req(Command::Write, FUA, 0, 512), HAS_FLAGS),
            Err(errno::EINVAL)
        );
        assert_eq!(e(req(Command::Read, DF, 0, 512), ALL), Err(errno::EINVAL));
        assert_eq!(
            e(req(Command::Write, DF, 0, 512), ALL | SEND_DF),
            Err(errno::EINVAL)
        );
        assert_eq!(
            e(req(Command::Write, NO_HOLE, 0, 512), ALL),
            Err(errno::EINVAL)
        );
        assert_eq!(
            e(req(Command::WriteZeroes, FAST_ZERO, 0, 512), ALL),
            Err(errno::EINVAL)
        );
        assert_eq!(
            e(req(Command::Read, REQ_ONE, 0, 512), ALL),
            Err(errno::EINVAL)
        );
        assert_eq!(
            e(req(Command::Read, 1 << 5, 0, 512), ALL),
            Err(errno::EINVAL)
        );
        assert_eq!(e(req(Command::Flush, 0, 512, 0), ALL), Err(errno::EINVAL));
        assert_eq!(e(req(Command::Flush, 0, 0, 512), ALL), Err(errno::EINVAL));
    }

    #[test]
    fn validate_read_only() {
        let ro = ALL | READ_ONLY;
        for c in [Command::Write, Command::Trim, Command::WriteZeroes] {
            assert_eq!(
                validate(&req(c, 0, 0, 512), SIZE, ro, MAX),
                Err(errno::EPERM)
            );
        }
        assert_eq!(
            validate(&req(Command::Read, 0, 0, 512), SIZE, ro, MAX),
            Ok(())
        );
        assert_eq!(
            validate(&req(Command::Flush, 0, 0, 0), SIZE, ro, MAX),
            Ok(())
        );
    }

    #[test]
    fn validate_bounds() {
        let e =
            |c: Command, f: u16, off: u64, len: u32| validate(&req(c, f, off, len), SIZE, ALL, MAX);
        // Past the end: ENOSPC for writes, EINVAL otherwise.
        assert_eq!(e(Command::Write, 0, SIZE - 512, 1024), Err(errno::ENOSPC));
        assert_eq!(e(Command::WriteZeroes, 0, SIZE, 1), Err(errno::ENOSPC));
        assert_eq!(e(Command::Read, 0, SIZE - 512, 1024), Err(errno::EINVAL));
        assert_eq!(e(Command::Trim, 0, SIZE, 512), Err(errno::EINVAL));
        assert_eq!(e(Command::Read, 0, SIZE + 1, 0), Err(errno::EINVAL));
        // offset + length overflowing u64.
        assert_eq!(e(Command::Read, 0, u64::MAX, 2), Err(errno::EINVAL));
        assert_eq!(e(Command::Write, 0, u64::MAX - 1, 512), Err(errno::ENOSPC));
        // Longer than max_block.
        assert_eq!(e(Command::Read, 0, 0, MAX + 1), Err(errno::EINVAL));
        assert_eq!(e(Command::Write, 0, 0, MAX + 512), Err(errno::EINVAL));
        assert_eq!(e(Command::WriteZeroes, 0, 0, MAX + 512), Ok(()));
    }
}
