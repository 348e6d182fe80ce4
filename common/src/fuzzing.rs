//! The checks the fuzz targets (`fuzz/fuzz_targets/`) and the corpus replay
//! test (`common/tests/fuzz_corpus.rs`) run: one function per decoder that
//! bytes from the network reach, so that libFuzzer on nightly and the replay
//! of the committed corpus on stable run the very same code.
//!
//! Each function takes arbitrary bytes, feeds them to the decoder the way the
//! transport does, and asserts more than "does not panic": decoded lengths
//! and slices stay inside the input, what decodes re-encodes and decodes to
//! the same value, a truncated PDU makes the receiver wait rather than fail.
//! A failed check panics: libFuzzer keeps the input as a crash, the replay
//! test fails and names the corpus file.
//!
//! The NBD decoders live in the host crate: `rdmablk::fuzzing`.

use crate::bytes::{get_u16, get_u32};
use crate::fabrics::discovery::{self, DiscoveryEntry};
use crate::fabrics::{
    fctype, ConnectCmd, ConnectData, PropertyCmd, CONNECT_DATA_LEN, DISCOVERY_ENTRY_LEN,
    DISCOVERY_LOG_HEADER_LEN,
};
use crate::nvme::{Sgl, Sqe, PSDT_SGL, SQE_LEN};
use crate::rdma::private_data::{
    decode_reject, encode_reject, ConnectReply, ConnectRequest, RejectStatus, PRIVATE_DATA_LEN,
};
use crate::tcp::{self, flags, Digests, Framing, Header, PduError, Transfer, CH_LEN, DIGEST_LEN};

/// The checks of one fuzz target, on one input.
pub type Check = fn(&[u8]);

/// Every fuzz target of this crate: its name (the directory of its corpus,
/// `fuzz/corpus/<name>/`, and of its libFuzzer target) and its checks.
pub const TARGETS: &[(&str, Check)] = &[
    ("tcp_pdu", tcp_pdu),
    ("fabrics_connect", fabrics_connect),
    ("sgl", sgl),
    ("rdma_private_data", rdma_private_data),
    ("discovery_log", discovery_log),
];

/// PLEN bound the NVMe/TCP checks decode with: above any fuzz input, so a
/// long PLEN means "wait for more", as on a real connection.
const MAX_PDU: usize = 1 << 20;

/// PDUs decoded back to back from one input at most.
const MAX_STREAM_PDUS: usize = 64;

/// NVMe/TCP PDU framing ([`tcp::peek_len`], [`tcp::decode_framing`],
/// [`tcp::decode`]) on bytes as they arrive on a connection: the input is
/// decoded as a stream of PDUs, under each of the four digest settings a
/// connection can negotiate.
///
/// Checks: the three decoders agree; a PDU's parts (data, digests) lie inside
/// its PLEN and its data never overlaps its header; every prefix of an
/// accepted PDU is "wait" rather than an error, and bytes after it change
/// nothing; PLEN is bounded by `max_pdu`; an error carries a Fatal Error
/// Status and an offset inside the header, as a TermReq needs; every decoded
/// PDU re-encodes to bytes that decode to the same header, flags and data
/// with a correct data digest, at any data alignment; an R2T splits into
/// H2CData pieces that cover it exactly (when it is inside a command's data).
pub fn tcp_pdu(data: &[u8]) {
    for header in [false, true] {
        for digest in [false, true] {
            let expect = Digests {
                header,
                data: digest,
            };
            let mut rest = data;
            for _ in 0..MAX_STREAM_PDUS {
                let Some(n) = tcp_one(rest, expect) else {
                    break;
                };
                rest = &rest[n..];
            }
        }
    }
}

/// Checks the PDU at the start of `buf`; its length when it decoded whole.
fn tcp_one(buf: &[u8], expect: Digests) -> Option<usize> {
    let peek = tcp::peek_len(buf, MAX_PDU);
    let framing = tcp::decode_framing(buf, expect, MAX_PDU);
    let decoded = tcp::decode(buf, expect, MAX_PDU);
    match peek {
        Ok(None) => assert!(
            buf.len() < CH_LEN,
            "peek_len waits on a whole common header"
        ),
        Ok(Some(plen)) => {
            assert!(
                (CH_LEN..=MAX_PDU).contains(&plen),
                "peek_len gave PLEN {plen}"
            );
            if let Ok(Some(f)) = &framing {
                assert_eq!(f.plen, plen, "decode_framing and peek_len disagree on PLEN");
            }
        }
        Err(e) => assert_eq!(
            framing,
            Err(e),
            "decode_framing accepted what peek_len refused"
        ),
    }
    match (framing, decoded) {
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "decode and decode_framing fail differently");
            check_pdu_error(&a);
            None
        }
        (Ok(None), Ok(None)) => None,
        (Ok(Some(f)), Ok(None)) => {
            check_framing(buf, expect, &f);
            assert!(
                buf.len() < f.plen,
                "decode waits on a whole PDU of {} bytes",
                f.plen
            );
            None
        }
        (Ok(Some(f)), Ok(Some((pdu, n)))) => {
            check_framing(buf, expect, &f);
            check_pdu(buf, expect, &f, &pdu, n);
            Some(n)
        }
        (f, d) => panic!("decode_framing gave {f:?} but decode gave {d:?}"),
    }
}

/// What a TermReq reports must make sense: a known status, an offset inside
/// the largest PDU header.
fn check_pdu_error(e: &PduError) {
    assert!(
        matches!(
            e.fes(),
            tcp::fes::INVALID_HEADER_FIELD | tcp::fes::HEADER_DIGEST_ERROR
        ),
        "FES {:#x} for {e:?}",
        e.fes()
    );
    assert!(e.fei() < tcp::IC_LEN as u32, "FEI {} for {e:?}", e.fei());
}

fn check_framing(buf: &[u8], expect: Digests, f: &Framing) {
    let hlen = buf[2] as usize;
    assert_eq!(f.header.pdu_type(), buf[0], "PDU type changed");
    assert_eq!(f.flags, buf[1], "flags changed");
    assert!(f.plen <= MAX_PDU);
    let dd = if f.data_digest { DIGEST_LEN } else { 0 };
    let end = f
        .data_at
        .checked_add(f.data_len)
        .expect("data end overflows");
    assert!(
        end + dd <= f.plen,
        "data {}+{} (+{dd}) past PLEN {}",
        f.data_at,
        f.data_len,
        f.plen
    );
    assert!(
        f.data_len == 0 || f.data_at >= hlen,
        "data at {} overlaps the header",
        f.data_at
    );
    assert!(
        !f.data_digest || expect.data,
        "a data digest that was not negotiated"
    );
    if let Header::H2CData(t) | Header::C2HData(t) = f.header {
        assert_eq!(
            t.len as usize, f.data_len,
            "DATAL differs from the data carried"
        );
    }
    // A receiver calls the decoders on whatever has arrived: every prefix
    // must be "wait" (or the same framing once the header is there), never an
    // error. The answer only changes around the common header, the PDU
    // header and its digest, and PLEN.
    let interesting = [0, 1, CH_LEN - 1, CH_LEN, CH_LEN + 1]
        .into_iter()
        .chain(hlen.saturating_sub(1)..=hlen + DIGEST_LEN + 1)
        .chain([f.plen - 1]);
    for k in interesting.filter(|&k| k < buf.len().min(f.plen)) {
        let part = &buf[..k];
        match tcp::decode_framing(part, expect, MAX_PDU) {
            Ok(None) => {}
            Ok(Some(g)) => assert_eq!(&g, f, "framing of a {k}-byte prefix differs"),
            Err(e) => panic!("a {k}-byte prefix of an acceptable PDU fails: {e:?}"),
        }
        assert_eq!(
            tcp::decode(part, expect, MAX_PDU),
            Ok(None),
            "a {k}-byte prefix of a {}-byte PDU does not wait",
            f.plen
        );
    }
}

fn check_pdu(buf: &[u8], expect: Digests, f: &Framing, pdu: &tcp::Pdu<'_>, n: usize) {
    assert_eq!(n, f.plen);
    assert!(n <= buf.len());
    assert_eq!(pdu.header, f.header);
    assert_eq!(pdu.flags, f.flags);
    assert!(
        std::ptr::eq(pdu.data, &buf[f.data_at..f.data_at + f.data_len]),
        "the data is not the PDU's own bytes"
    );
    if f.data_digest {
        let ok = tcp::data_digest(pdu.data) == buf[n - DIGEST_LEN..n];
        assert_eq!(pdu.data_digest_ok, ok, "data digest verdict is wrong");
    } else {
        assert!(
            pdu.data_digest_ok,
            "data digest failed without a data digest"
        );
    }
    // Bytes after the PDU change nothing; PLEN is held to max_pdu.
    assert_eq!(tcp::decode(&buf[..n], expect, MAX_PDU), Ok(Some((*pdu, n))));
    assert_eq!(tcp::decode(buf, expect, n), Ok(Some((*pdu, n))));
    assert!(
        tcp::decode(buf, expect, n - 1).is_err(),
        "a {n}-byte PDU passes max_pdu {}",
        n - 1
    );

    // Re-encoding: the same header, flags that matter, data, and a good digest.
    let extra = pdu.flags & (flags::LAST_PDU | flags::SUCCESS);
    for align in [1, 8, 128] {
        let re = tcp::encode(&pdu.header, extra, pdu.data, expect, align);
        let (again, m) = tcp::decode(&re, expect, MAX_PDU)
            .unwrap_or_else(|e| panic!("re-encoded {:?} does not decode: {e}", pdu.header))
            .unwrap_or_else(|| panic!("re-encoded {:?} is incomplete", pdu.header));
        assert_eq!(m, re.len(), "re-encoded PLEN differs from its length");
        assert_eq!(again.header, pdu.header, "header changed through encode");
        assert_eq!(again.data, pdu.data, "data changed through encode");
        assert_eq!(again.flags & (flags::LAST_PDU | flags::SUCCESS), extra);
        assert!(again.data_digest_ok, "encode wrote a bad data digest");
        let at = again.data.as_ptr() as usize - re.as_ptr() as usize;
        let term = matches!(pdu.header, Header::TermReq { .. });
        assert!(
            term || again.data.is_empty() || at.is_multiple_of(align),
            "data at {at} is not {align}-aligned"
        );
    }

    if let Header::R2T(t) = pdu.header {
        check_r2t_split(t);
    }
}

/// How a host answers an R2T that lies inside its command's data (it checks
/// that first: a command moves at most `u32::MAX` bytes).
fn check_r2t_split(t: Transfer) {
    let end = u64::from(t.offset) + u64::from(t.len);
    if end > u64::from(u32::MAX) {
        return;
    }
    // A piece size from the R2T itself, so that the pieces stay few.
    let max = (t.len as usize / 7).max(1) + t.ttag as usize % 4096;
    let mut at = u64::from(t.offset);
    let mut pieces = tcp::split_transfer(t, max).peekable();
    while let Some((p, fl)) = pieces.next() {
        assert_eq!((p.cccid, p.ttag), (t.cccid, t.ttag));
        assert_eq!(u64::from(p.offset), at, "pieces are not contiguous");
        assert!(
            p.len > 0 && p.len as usize <= max,
            "piece of {} bytes, max {max}",
            p.len
        );
        at += u64::from(p.len);
        let last = pieces.peek().is_none();
        assert_eq!(
            fl,
            if last { flags::LAST_PDU } else { 0 },
            "LAST_PDU misplaced"
        );
    }
    assert_eq!(at, end, "pieces do not cover the R2T");
}

/// The Connect command as the controller takes it from a capsule: the input
/// is the 64-byte SQE followed by the command's data. The SQE is also read as
/// a Property Get/Set.
///
/// Checks: Connect and Property fields survive `to_sqe`/`from_sqe`; Connect
/// data (parsed, as the controller does, only when 1024 bytes are there)
/// holds exactly the input's HOSTID and CNTLID, NQNs without NUL that are
/// the field's bytes when they are UTF-8 and at most 3 bytes per byte when
/// not, ignores bytes past 1024, and survives `encode`/`parse` when its NQNs
/// fit their fields.
pub fn fabrics_connect(data: &[u8]) {
    let Some((raw, payload)) = data.split_first_chunk::<SQE_LEN>() else {
        return;
    };
    let sqe = Sqe(*raw);
    let cid = sqe.cid();

    let cmd = ConnectCmd::from_sqe(&sqe);
    let sgl = sqe.sgl();
    let back = cmd.to_sqe(cid, &sgl);
    assert_eq!(ConnectCmd::from_sqe(&back), cmd, "Connect fields changed");
    assert_eq!((back.cid(), back.fctype()), (cid, fctype::CONNECT));
    if sgl.check().is_ok() {
        assert_eq!(back.sgl(), sgl, "Connect SGL changed");
    }

    let prop = PropertyCmd::from_sqe(&sqe);
    assert_eq!(PropertyCmd::from_sqe(&prop.to_sqe(cid, true)), prop);
    let get = PropertyCmd::from_sqe(&prop.to_sqe(cid, false));
    assert_eq!(get, PropertyCmd { value: 0, ..prop });

    if payload.len() < CONNECT_DATA_LEN {
        return;
    }
    let d = ConnectData::parse(payload);
    assert_eq!(d.hostid[..], payload[..16]);
    assert_eq!(
        d.cntlid,
        get_u16(payload, ConnectData::CNTLID_OFFSET.into())
    );
    for (nqn, at) in [
        (&d.subnqn, ConnectData::SUBNQN_OFFSET),
        (&d.hostnqn, ConnectData::HOSTNQN_OFFSET),
    ] {
        let field = &payload[at as usize..at as usize + 256];
        check_text_field(nqn, field, false);
    }
    assert_eq!(ConnectData::parse(&payload[..CONNECT_DATA_LEN]), d);
    let enc = d.encode();
    assert_eq!(enc.len(), CONNECT_DATA_LEN);
    if d.subnqn.len() <= 256 && d.hostnqn.len() <= 256 {
        assert_eq!(
            ConnectData::parse(&enc),
            d,
            "Connect data changed through encode"
        );
    }
}

/// A string decoded from a fixed-width field: the bytes up to the first NUL,
/// lossily decoded, with trailing blanks removed when `trimmed`.
fn check_text_field(s: &str, field: &[u8], trimmed: bool) {
    let raw_len = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    assert!(!s.contains('\0'), "{s:?} holds a NUL");
    assert!(
        s.len() <= 3 * raw_len,
        "{s:?} is longer than lossy decoding makes it"
    );
    if let Ok(exact) = std::str::from_utf8(&field[..raw_len]) {
        let expected = if trimmed { exact.trim_end() } else { exact };
        assert_eq!(s, expected, "not the field's text");
    }
}

/// SGL descriptors ([`Sgl::from_bytes`], also as [`Sqe::sgl`] reads them):
/// the first 16 bytes of the input.
///
/// Checks: only `Unsupported` fails `check`, and it keeps the identifier;
/// every supported descriptor re-encodes with the same identifier and the
/// same bytes in the fields it defines, decodes back to itself, and survives
/// `Sqe::set_sgl` (which marks the command as using SGLs); a keyed length
/// fits 24 bits.
pub fn sgl(data: &[u8]) {
    let Some(raw) = data.first_chunk::<16>() else {
        return;
    };
    let s = Sgl::from_bytes(raw);
    let mut in_sqe = Sqe::default();
    in_sqe.0[24..40].copy_from_slice(raw);
    assert_eq!(in_sqe.sgl(), s, "the SQE reads another descriptor");
    assert_eq!(s.check().is_err(), matches!(s, Sgl::Unsupported(_)));

    let enc = s.to_bytes();
    match s {
        Sgl::Unsupported(id) => {
            assert_eq!(id, raw[15]);
            assert!(s.is_empty());
            return;
        }
        Sgl::InCapsule { .. } => assert_eq!(enc[..12], raw[..12]),
        Sgl::Transport { .. } => assert_eq!(enc[8..12], raw[8..12]),
        Sgl::Keyed { len, .. } => {
            assert_eq!(enc[..15], raw[..15]);
            assert!(len < 1 << 24, "keyed length {len:#x} exceeds 24 bits");
        }
        Sgl::Null => assert_eq!(get_u32(raw, 8), 0),
    }
    assert_eq!(enc[15], raw[15], "identifier changed");
    assert_eq!(
        Sgl::from_bytes(&enc),
        s,
        "descriptor changed through to_bytes"
    );
    let mut sqe = Sqe::default();
    sqe.set_sgl(&s);
    assert_eq!(sqe.sgl(), s);
    assert_eq!(sqe.psdt(), PSDT_SGL);
}

/// NVMe/RDMA CM private data: the input as the controller receives it in a
/// connect request, and as the host receives it in an accept or a reject.
///
/// Checks: a request is refused for its length exactly when it is shorter
/// than 32 bytes, for its format exactly when RECFMT is not 0, and for
/// nothing else; an accepted request, a reply and a known reject status
/// re-encode to the input's bytes; an unknown reject code is the input's.
pub fn rdma_private_data(data: &[u8]) {
    match ConnectRequest::decode(data) {
        Ok(r) => {
            assert!(data.len() >= PRIVATE_DATA_LEN);
            assert_eq!(r.recfmt, 0);
            let enc = r.encode();
            assert_eq!(enc[..10], data[..10], "request fields changed");
            assert_eq!(ConnectRequest::decode(&enc), Ok(r));
        }
        Err(RejectStatus::InvalidPrivateDataLength) => assert!(data.len() < PRIVATE_DATA_LEN),
        Err(RejectStatus::InvalidRecfmt) => {
            assert!(data.len() >= PRIVATE_DATA_LEN && get_u16(data, 0) != 0);
        }
        Err(other) => panic!("decode refused a request with {other:?}, which it cannot judge"),
    }
    match ConnectReply::decode(data) {
        Some(r) => {
            let enc = r.encode();
            assert_eq!(enc[..4], data[..4], "reply fields changed");
            assert_eq!(ConnectReply::decode(&enc), Some(r));
        }
        None => assert!(data.len() < 4),
    }
    match decode_reject(data) {
        Ok(st) => {
            assert_eq!(encode_reject(st)[2..4], data[2..4], "reject status changed");
            assert!(!st.describe().is_empty());
        }
        Err(None) => assert!(data.len() < 4),
        Err(Some(code)) => assert_eq!(code, get_u16(data, 2)),
    }
}

/// The discovery log page as the host receives it ([`discovery::parse_log_header`],
/// [`discovery::parse_log_entries`]): the input is the page.
///
/// Checks: the entries are those the buffer holds completely, as many as
/// NUMREC says at most; each is decoded from its own 1024 bytes, with
/// strings that hold no NUL nor trailing blanks and that re-encode to
/// themselves when they fit their fields; a page encoded from the entries
/// decodes to them again.
pub fn discovery_log(data: &[u8]) {
    let entries = discovery::parse_log_entries(data);
    let whole = data.len().saturating_sub(DISCOVERY_LOG_HEADER_LEN) / DISCOVERY_ENTRY_LEN;
    let numrec = if data.len() >= 16 {
        discovery::parse_log_header(data).1
    } else {
        0
    };
    assert_eq!(
        entries.len() as u64,
        numrec.min(whole as u64),
        "not the entries the buffer holds"
    );
    let mut all_fit = true;
    for (i, e) in entries.iter().enumerate() {
        let at = DISCOVERY_LOG_HEADER_LEN + i * DISCOVERY_ENTRY_LEN;
        let raw = &data[at..at + DISCOVERY_ENTRY_LEN];
        assert_eq!(&DiscoveryEntry::parse(raw), e);
        assert_eq!([e.trtype, e.adrfam, e.subtype, e.treq], raw[..4]);
        assert_eq!(e.tsas[..], raw[768..800]);
        let mut fit = true;
        for (s, off, width) in [
            (&e.trsvcid, 32, 32),
            (&e.subnqn, 256, 256),
            (&e.traddr, 512, 256),
        ] {
            check_text_field(s, &raw[off..off + width], true);
            assert_eq!(s.trim_end(), s, "{s:?} keeps trailing blanks");
            fit &= s.len() <= width;
        }
        if fit {
            let mut b = vec![0u8; DISCOVERY_ENTRY_LEN];
            e.encode_into(&mut b);
            assert_eq!(
                &DiscoveryEntry::parse(&b),
                e,
                "entry changed through encode"
            );
        }
        all_fit &= fit;
    }
    let genctr = if data.len() >= 16 {
        discovery::parse_log_header(data).0
    } else {
        0
    };
    let page = discovery::encode_log(genctr, &entries);
    assert_eq!(
        discovery::parse_log_header(&page),
        (genctr, entries.len() as u64)
    );
    if all_fit {
        assert_eq!(discovery::parse_log_entries(&page), entries);
    }
}

/// Largest corpus file committed: libFuzzer's default input bound.
pub const MAX_CORPUS_FILE: usize = 4096;

/// Runs every file of `corpus/<target>/` through the check of `target` in
/// `targets` (this crate's [`TARGETS`] or the host crate's); fails naming
/// each input that panics. The stable replay tests of both crates use it.
pub fn replay(targets: &[(&str, Check)], target: &str, corpus: &std::path::Path) {
    let check = targets
        .iter()
        .find(|(name, _)| *name == target)
        .unwrap_or_else(|| panic!("no fuzz target {target}"))
        .1;
    let dir = corpus.join(target);
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus directory entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} holds no corpus", dir.display());
    let mut failed = Vec::new();
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(
            data.len() <= MAX_CORPUS_FILE,
            "{} is {} bytes: minimize it (cargo fuzz tmin) below {MAX_CORPUS_FILE}",
            f.display(),
            data.len()
        );
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&data)));
        if run.is_err() {
            failed.push(f.display().to_string());
        }
    }
    assert!(failed.is_empty(), "{target}: failing inputs: {failed:#?}");
    eprintln!("{target}: {} inputs replayed", files.len());
}
