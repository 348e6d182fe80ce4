//! The checks the NBD fuzz targets (`fuzz/fuzz_targets/`) and the corpus
//! replay test (`initiator/tests/fuzz_corpus.rs`) run on bytes from an NBD
//! client, so that libFuzzer on nightly and the replay of the committed
//! corpus on stable run the very same code. The NVMe-oF decoders' checks are
//! in `rdmablk_common::fuzzing`.
//!
//! A failed check panics: libFuzzer keeps the input as a crash, the replay
//! test fails and names the corpus file.

use std::io::{self, Read, Write};

use crate::frontend::nbd::handshake::{serve_handshake, Export, Negotiated, Outcome};
use crate::frontend::nbd::proto::{
    errno, flags, validate, Command, ProtoError, Request, REQUEST_LEN, REQUEST_MAGIC,
};

/// The checks of one fuzz target, on one input.
pub type Check = fn(&[u8]);

/// Every fuzz target of this crate: its name (the directory of its corpus,
/// `fuzz/corpus/<name>/`, and of its libFuzzer target) and its checks.
pub const TARGETS: &[(&str, Check)] = &[
    ("nbd_handshake", nbd_handshake),
    ("nbd_request", nbd_request),
];

/// Requests decoded after a handshake at most.
const MAX_REQUESTS: usize = 64;

// Handshake wire values (NBD protocol document).
const NBDMAGIC: &[u8; 8] = b"NBDMAGIC";
const IHAVEOPT: &[u8; 8] = b"IHAVEOPT";
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_ABORT: u32 = 2;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
/// Error replies have bit 31 set.
const REP_FLAG_ERROR: u32 = 1 << 31;

/// The export the handshake serves: as `nbd::serve` sets one up for a
/// writable namespace, or a read-only one offering every optional feature.
fn export(read_only: bool) -> Export {
    let base = flags::SEND_FLUSH | flags::SEND_FUA | flags::CAN_MULTI_CONN;
    Export {
        name: "nqn.2026-11.io.rdmablk:fuzz".to_string(),
        description: "rdmablk: namespace 1 of nqn.2026-11.io.rdmablk:fuzz".to_string(),
        size: 64 << 20,
        min_block: 512,
        preferred_block: 4096,
        max_block: 2 << 20,
        read_only,
        flags: if read_only {
            base | flags::SEND_TRIM
                | flags::SEND_WRITE_ZEROES
                | flags::SEND_DF
                | flags::SEND_CACHE
                | flags::SEND_FAST_ZERO
        } else {
            base | flags::SEND_TRIM | flags::SEND_WRITE_ZEROES
        },
    }
}

/// A client connection: reads come from the input, a few bytes at a time,
/// writes are kept.
struct Client<'a> {
    input: &'a [u8],
    at: usize,
    output: Vec<u8>,
}

impl Read for Client<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Short reads, as a socket gives them.
        let n = buf.len().min(self.input.len() - self.at).min(7);
        buf[..n].copy_from_slice(&self.input[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Write for Client<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The NBD handshake, server side ([`serve_handshake`], which parses the
/// client's flags and options, among them `NBD_OPT_INFO`/`NBD_OPT_GO` and
/// the metadata context requests): the input is what the client sends,
/// from its flags on; what follows a successful negotiation is read as
/// transmission requests, as the transmission loop reads them.
///
/// Checks: the server greets; every option the server read gets exactly one
/// final reply (ACK or error) carrying its option number, after any
/// informational replies, and nothing else is written but the
/// `NBD_OPT_EXPORT_NAME` answer that ends a negotiation; the server never
/// reads past the option that ends negotiation, which is `NBD_OPT_GO` or
/// `NBD_OPT_EXPORT_NAME` when the export is served, `NBD_OPT_ABORT` or the
/// end of input when the client left; the transmission flags are consistent;
/// then every request checks as in [`nbd_request`].
pub fn nbd_handshake(data: &[u8]) {
    let export = export(data.len() % 2 == 1);
    let mut client = Client {
        input: data,
        at: 0,
        output: Vec::new(),
    };
    let outcome = serve_handshake(&mut client, &export);
    let Client { at, output, .. } = client;
    assert!(at <= data.len());

    let greeting = output.get(..18).expect("no greeting");
    assert_eq!(&greeting[..8], NBDMAGIC);
    assert_eq!(&greeting[8..16], IHAVEOPT);

    // The options the server read whole, as (option, end in the input).
    let mut options = Vec::new();
    let mut pos = 4;
    while let Some(h) = data.get(pos..pos + 16) {
        let opt = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes"));
        let end = pos + 16 + u32::from_be_bytes(h[12..16].try_into().expect("4 bytes")) as usize;
        if end > at {
            break;
        }
        options.push((opt, end));
        pos = end;
    }

    // The replies: per option, informational ones then one final one.
    let mut finals = Vec::new();
    let mut pending: Option<u32> = None;
    let mut rest = &output[18..];
    let mut export_name_answer = false;
    while !rest.is_empty() {
        let magic = rest
            .get(..8)
            .map(|m| u64::from_be_bytes(m.try_into().expect("8 bytes")));
        if magic != Some(OPT_REPLY_MAGIC) {
            // Only the NBD_OPT_EXPORT_NAME answer is not a reply: size,
            // transmission flags and, unless NO_ZEROES, 124 zero bytes.
            assert!(
                rest.len() == 10 || (rest.len() == 134 && rest[10..].iter().all(|&b| b == 0)),
                "{} bytes of output that are not an option reply",
                rest.len()
            );
            assert_eq!(rest[..8], export.size.to_be_bytes());
            export_name_answer = true;
            break;
        }
        let h = rest.get(..20).expect("truncated option reply");
        let opt = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes"));
        let rep = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(h[16..20].try_into().expect("4 bytes")) as usize;
        assert!(20 + len <= rest.len(), "option reply longer than written");
        assert!(
            pending.is_none_or(|p| p == opt),
            "replies to two options interleave"
        );
        if rep == REP_ACK || rep & REP_FLAG_ERROR != 0 {
            finals.push(opt);
            pending = None;
        } else {
            pending = Some(opt);
        }
        rest = &rest[20 + len..];
    }
    assert!(pending.is_none(), "option {pending:?} got no final reply");
    let answered: Vec<u32> = options
        .iter()
        .map(|&(opt, _)| opt)
        .take(finals.len())
        .collect();
    assert_eq!(
        finals, answered,
        "final replies do not match the options read"
    );

    match outcome {
        Ok(Outcome::Serve(neg)) => {
            let &(last, end) = options.last().expect("served without an option");
            assert_eq!(end, at, "read past the option that ended negotiation");
            assert!(
                matches!(last, OPT_GO | OPT_EXPORT_NAME),
                "served after option {last}"
            );
            assert_eq!(export_name_answer, last == OPT_EXPORT_NAME);
            let expected_finals = options.len() - usize::from(export_name_answer);
            assert_eq!(finals.len(), expected_finals, "an option went unanswered");
            check_negotiated(&neg, &export);
            transmission(&data[at..], &neg, &export);
        }
        Ok(Outcome::Closed) => {
            assert!(!export_name_answer);
            let aborted = options
                .last()
                .is_some_and(|&(o, e)| o == OPT_ABORT && e == at);
            assert!(
                aborted || at == data.len(),
                "closed at byte {at} of {}",
                data.len()
            );
            assert_eq!(finals.len(), options.len(), "an option went unanswered");
        }
        Err(_) => assert!(!export_name_answer),
    }
}

/// The transmission flags a client is told must follow the protocol's rules.
fn check_negotiated(neg: &Negotiated, export: &Export) {
    let f = neg.transmission_flags;
    assert!(f & flags::HAS_FLAGS != 0);
    assert_eq!(f & flags::READ_ONLY != 0, export.read_only);
    assert!(
        neg.structured_replies || f & flags::SEND_DF == 0,
        "SEND_DF without structured replies"
    );
    assert!(f & flags::SEND_FAST_ZERO == 0 || f & flags::SEND_WRITE_ZEROES != 0);
    assert_eq!(
        f & !(flags::HAS_FLAGS | flags::READ_ONLY) & !export.flags,
        0
    );
}

/// Requests after the handshake, as the transmission loop takes them: a bad
/// magic or `NBD_CMD_DISC` ends the connection, a write's payload is skipped.
fn transmission(mut data: &[u8], neg: &Negotiated, export: &Export) {
    for _ in 0..MAX_REQUESTS {
        let Some((hdr, rest)) = data.split_first_chunk::<REQUEST_LEN>() else {
            return;
        };
        let Some(r) = check_request(hdr) else {
            return;
        };
        if r.command == Command::Disc {
            return;
        }
        check_validate(&r, export.size, neg.transmission_flags, export.max_block);
        let Some(after) = rest.get(r.payload_len() as usize..) else {
            return;
        };
        data = after;
    }
}

/// One NBD request header ([`Request::parse`]) and its checks against the
/// export ([`validate`]): the input is the 28-byte header, then any number of
/// 14-byte export descriptions (size, transmission flags, largest block) to
/// validate it against; without one, the export `nbd::serve` sets up.
///
/// Checks: only a bad magic is refused, and the error carries it; a parsed
/// request re-encodes to the very bytes; a write's payload is its length,
/// other requests have none; `validate` accepts only requests the protocol
/// allows for the export (command and flags advertised, range inside the
/// export without overflow, length within the largest block for commands that
/// carry data, nothing that writes to a read-only export) and refuses with
/// the errno the protocol names.
pub fn nbd_request(data: &[u8]) {
    let Some((hdr, rest)) = data.split_first_chunk::<REQUEST_LEN>() else {
        return;
    };
    let Some(r) = check_request(hdr) else {
        return;
    };
    let mut exports = rest.chunks_exact(14).peekable();
    if exports.peek().is_none() {
        let e = export(false);
        check_validate(&r, e.size, e.flags | flags::HAS_FLAGS, e.max_block);
    }
    for e in exports {
        let size = u64::from_be_bytes(e[..8].try_into().expect("8 bytes"));
        let tflags = u16::from_be_bytes([e[8], e[9]]);
        let max_block = u32::from_be_bytes(e[10..14].try_into().expect("4 bytes"));
        check_validate(&r, size, tflags, max_block);
    }
}

fn check_request(hdr: &[u8; REQUEST_LEN]) -> Option<Request> {
    match Request::parse(hdr) {
        Err(ProtoError::BadMagic(m)) => {
            assert_ne!(m, REQUEST_MAGIC);
            assert_eq!(m.to_be_bytes(), hdr[..4]);
            None
        }
        Ok(r) => {
            assert_eq!(&r.encode(), hdr, "request changed through encode");
            let payload = if r.command == Command::Write {
                r.length
            } else {
                0
            };
            assert_eq!(r.payload_len(), payload);
            Some(r)
        }
    }
}

fn check_validate(r: &Request, size: u64, tflags: u16, max_block: u32) {
    let verdict = validate(r, size, tflags, max_block);
    let has = |f: u16| tflags & f != 0;
    let read_only = has(flags::READ_ONLY);
    let writes = matches!(
        r.command,
        Command::Write | Command::Trim | Command::WriteZeroes
    );
    match verdict {
        Ok(()) => {
            let (advertised, allowed) = match r.command {
                Command::Disc => return,
                Command::Read => (true, if has(flags::SEND_DF) { flags::DF } else { 0 }),
                Command::Write => (true, 0),
                Command::Flush => (has(flags::SEND_FLUSH), 0),
                Command::Trim => (has(flags::SEND_TRIM), 0),
                Command::Cache => (has(flags::SEND_CACHE), 0),
                Command::WriteZeroes => (
                    has(flags::SEND_WRITE_ZEROES),
                    flags::NO_HOLE
                        | if has(flags::SEND_FAST_ZERO) {
                            flags::FAST_ZERO
                        } else {
                            0
                        },
                ),
                Command::BlockStatus | Command::Unknown(_) => {
                    panic!("{:?} accepted", r.command)
                }
            };
            assert!(advertised, "{:?} accepted though not advertised", r.command);
            let fua = if has(flags::SEND_FUA) { flags::FUA } else { 0 };
            assert_eq!(
                r.flags & !(allowed | fua),
                0,
                "flags {:#x} accepted on {:?}",
                r.flags,
                r.command
            );
            assert!(
                !(writes && read_only),
                "{:?} accepted on a read-only export",
                r.command
            );
            if r.command == Command::Flush {
                assert_eq!((r.offset, r.length), (0, 0));
                return;
            }
            let end = r.offset.checked_add(u64::from(r.length));
            assert!(
                end.is_some_and(|e| e <= size),
                "range past the export accepted"
            );
            if matches!(r.command, Command::Read | Command::Write | Command::Cache) {
                assert!(
                    r.length <= max_block,
                    "{} bytes above the largest block",
                    r.length
                );
            }
        }
        Err(e) => match e {
            errno::EINVAL => {}
            errno::EPERM => assert!(writes && read_only, "EPERM for {r:?}"),
            errno::ENOSPC => {
                assert!(matches!(r.command, Command::Write | Command::WriteZeroes));
            }
            other => panic!("validate answered errno {other} for {r:?}"),
        },
    }
}
