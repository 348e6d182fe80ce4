//! NVMe/TCP PDUs (NVMe/TCP Transport Specification 1.0): the common header,
//! the PDU-specific headers, header/data digests (CRC32C) and padding.
//!
//! Decoding validates every header field before anything else looks at it;
//! errors carry the Fatal Error Status and field offset that a TermReq reports.

pub mod stream;

use crate::bytes::{get_u16, get_u32, put_u16, put_u32};
use crate::nvme::{Cqe, Sqe, CQE_LEN, SQE_LEN};

/// PDU types.
pub mod pdu_type {
    pub const ICREQ: u8 = 0x00;
    pub const ICRESP: u8 = 0x01;
    pub const H2C_TERM_REQ: u8 = 0x02;
    pub const C2H_TERM_REQ: u8 = 0x03;
    pub const CAPSULE_CMD: u8 = 0x04;
    pub const CAPSULE_RESP: u8 = 0x05;
    pub const H2C_DATA: u8 = 0x06;
    pub const C2H_DATA: u8 = 0x07;
    pub const R2T: u8 = 0x09;
}

/// Common header flags.
pub mod flags {
    /// A header digest follows the PDU header.
    pub const HDGST: u8 = 0x01;
    /// A data digest follows the data.
    pub const DDGST: u8 = 0x02;
    /// Last data PDU of a transfer (H2CData / C2HData).
    pub const LAST_PDU: u8 = 0x04;
    /// C2HData only: the command completed successfully; no CapsuleResp follows.
    pub const SUCCESS: u8 = 0x08;
}

/// Fatal error status codes of a TermReq.
pub mod fes {
    pub const INVALID_HEADER_FIELD: u16 = 0x01;
    pub const PDU_SEQUENCE_ERROR: u16 = 0x02;
    pub const HEADER_DIGEST_ERROR: u16 = 0x03;
    pub const DATA_OUT_OF_RANGE: u16 = 0x04;
    pub const DATA_LIMIT_EXCEEDED: u16 = 0x05;
    pub const UNSUPPORTED_PARAMETER: u16 = 0x06;
}

/// Length of the common header.
pub const CH_LEN: usize = 8;
/// Length of a header or data digest.
pub const DIGEST_LEN: usize = 4;
/// Length of ICReq and ICResp.
pub const IC_LEN: usize = 128;
/// Header length of CapsuleCmd.
pub const CAPSULE_CMD_HLEN: usize = CH_LEN + SQE_LEN;
/// Header length of CapsuleResp, H2CData, C2HData, R2T and TermReq.
pub const SHORT_HLEN: usize = 24;
/// Largest copy of a bad PDU header a TermReq carries.
pub const TERM_REQ_MAX_DATA: usize = 128;

/// Which digests a connection negotiated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    pub header: bool,
    pub data: bool,
}

impl Digests {
    fn from_bits(b: u8) -> Self {
        Digests {
            header: b & 1 != 0,
            data: b & 2 != 0,
        }
    }

    fn bits(self) -> u8 {
        self.header as u8 | (self.data as u8) << 1
    }
}

/// Identifies a data transfer: H2CData, C2HData and R2T share these fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transfer {
    /// Command capsule CID of the command the data belongs to.
    pub cccid: u16,
    /// Transfer tag from the R2T (reserved in C2HData).
    pub ttag: u16,
    /// Byte offset of this data in the command's data.
    pub offset: u32,
    /// Byte count.
    pub len: u32,
}

/// A PDU-specific header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    IcReq {
        pfv: u16,
        /// Host PDU data alignment, in dwords, 0's based.
        hpda: u8,
        digests: Digests,
        /// Maximum outstanding R2Ts per command, 0's based.
        maxr2t: u32,
    },
    IcResp {
        pfv: u16,
        /// Controller PDU data alignment, in dwords, 0's based.
        cpda: u8,
        digests: Digests,
        /// Maximum H2CData payload the controller accepts.
        maxh2cdata: u32,
    },
    /// H2CTermReq (`from_host`) or C2HTermReq.
    TermReq {
        from_host: bool,
        fes: u16,
        fei: u32,
    },
    CapsuleCmd(Sqe),
    CapsuleResp(Cqe),
    H2CData(Transfer),
    C2HData(Transfer),
    R2T(Transfer),
}

impl Header {
    /// The PDU type code.
    pub fn pdu_type(&self) -> u8 {
        match self {
            Header::IcReq { .. } => pdu_type::ICREQ,
            Header::IcResp { .. } => pdu_type::ICRESP,
            Header::TermReq {
                from_host: true, ..
            } => pdu_type::H2C_TERM_REQ,
            Header::TermReq {
                from_host: false, ..
            } => pdu_type::C2H_TERM_REQ,
            Header::CapsuleCmd(_) => pdu_type::CAPSULE_CMD,
            Header::CapsuleResp(_) => pdu_type::CAPSULE_RESP,
            Header::H2CData(_) => pdu_type::H2C_DATA,
            Header::C2HData(_) => pdu_type::C2H_DATA,
            Header::R2T(_) => pdu_type::R2T,
        }
    }
}

/// The header length the specification fixes for each PDU type.
fn hlen_of(pdu_type: u8) -> Option<usize> {
    match pdu_type {
        pdu_type::ICREQ | pdu_type::ICRESP => Some(IC_LEN),
        pdu_type::CAPSULE_CMD => Some(CAPSULE_CMD_HLEN),
        pdu_type::H2C_TERM_REQ
        | pdu_type::C2H_TERM_REQ
        | pdu_type::CAPSULE_RESP
        | pdu_type::H2C_DATA
        | pdu_type::C2H_DATA
        | pdu_type::R2T => Some(SHORT_HLEN),
        _ => None,
    }
}

/// Whether a PDU type may carry data (after PDO).
fn carries_data(pdu_type: u8) -> bool {
    matches!(
        pdu_type,
        pdu_type::CAPSULE_CMD | pdu_type::H2C_DATA | pdu_type::C2H_DATA
    )
}

/// A decoded PDU, borrowing its data from the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pdu<'a> {
    /// Common header flags as received.
    pub flags: u8,
    pub header: Header,
    /// The data (in-capsule data, H2C/C2H data, or a TermReq's copy of the bad header).
    pub data: &'a [u8],
    /// False when a data digest was present and did not match.
    pub data_digest_ok: bool,
}

/// A malformed PDU: what a TermReq reports before the connection closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// A header field is invalid; `offset` is its byte offset in the PDU.
    #[error("invalid PDU header field at byte {offset}: {what}")]
    InvalidField { offset: u32, what: &'static str },
    /// The header digest does not match the header.
    #[error("header digest mismatch")]
    HeaderDigest,
}

impl PduError {
    /// Fatal Error Status for the TermReq.
    pub fn fes(&self) -> u16 {
        match self {
            PduError::InvalidField { .. } => fes::INVALID_HEADER_FIELD,
            PduError::HeaderDigest => fes::HEADER_DIGEST_ERROR,
        }
    }

    /// Fatal Error Information for the TermReq.
    pub fn fei(&self) -> u32 {
        match self {
            PduError::InvalidField { offset, .. } => *offset,
            PduError::HeaderDigest => 0,
        }
    }
}

fn invalid(offset: u32, what: &'static str) -> PduError {
    PduError::InvalidField { offset, what }
}

/// Length of the PDU that starts at `buf`, once its common header is there.
/// Fails on a header that can never be valid, so the caller does not wait
/// for (or allocate) a bogus length.
pub fn peek_len(buf: &[u8], max_pdu: usize) -> Result<Option<usize>, PduError> {
    if buf.len() < CH_LEN {
        return Ok(None);
    }
    let ty = buf[0];
    let hlen = hlen_of(ty).ok_or(invalid(0, "unknown PDU type"))?;
    if buf[2] as usize != hlen {
        return Err(invalid(2, "HLEN does not match the PDU type"));
    }
    let plen = get_u32(buf, 4) as usize;
    if plen < hlen {
        return Err(invalid(4, "PLEN is shorter than the header"));
    }
    if plen > max_pdu {
        return Err(invalid(
            4,
            "PLEN exceeds the largest PDU this connection accepts",
        ));
    }
    Ok(Some(plen))
}

/// Where a PDU's parts lie, known from its header alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Framing {
    pub header: Header,
    /// Common header flags.
    pub flags: u8,
    /// Total PDU length (PLEN).
    pub plen: usize,
    /// Offset of the data in the PDU.
    pub data_at: usize,
    /// Bytes of data.
    pub data_len: usize,
    /// Whether a data digest follows the data.
    pub data_digest: bool,
}

/// Decodes and validates the header of the PDU at the start of `buf`:
/// `Ok(None)` until the header (and header digest) is buffered. The data
/// need not be there yet, so that a receiver can place large data directly.
pub fn decode_framing(
    buf: &[u8],
    expect: Digests,
    max_pdu: usize,
) -> Result<Option<Framing>, PduError> {
    let Some(plen) = peek_len(buf, max_pdu)? else {
        return Ok(None);
    };
    let ty = buf[0];
    let fl = buf[1];
    let hlen = buf[2] as usize;
    let pdo = buf[3] as usize;
    let is_ic = matches!(ty, pdu_type::ICREQ | pdu_type::ICRESP);
    let is_term = matches!(ty, pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ);

    if is_ic && plen != IC_LEN {
        return Err(invalid(4, "ICReq/ICResp PLEN must be 128"));
    }
    let hd = if is_ic || is_term {
        0
    } else {
        if (fl & flags::HDGST != 0) != expect.header {
            return Err(invalid(
                1,
                "HDGSTF does not match the negotiated header digest",
            ));
        }
        if expect.header {
            DIGEST_LEN
        } else {
            0
        }
    };
    if plen < hlen + hd {
        return Err(invalid(4, "PLEN is shorter than header and digest"));
    }
    if buf.len() < hlen + hd {
        return Ok(None);
    }
    let b = &buf[..hlen + hd];
    if hd != 0 && crc32c::crc32c(&b[..hlen]) != get_u32(b, hlen) {
        return Err(PduError::HeaderDigest);
    }

    let (mut data_at, mut data_len, mut data_digest) = (plen, 0, false);
    if is_term {
        (data_at, data_len) = (hlen, plen - hlen);
    } else if plen > hlen + hd {
        if !carries_data(ty) {
            return Err(invalid(
                4,
                "PLEN counts data but this PDU type carries none",
            ));
        }
        if pdo < hlen + hd || pdo > plen {
            return Err(invalid(3, "PDO points outside the PDU"));
        }
        data_digest = fl & flags::DDGST != 0;
        if data_digest != expect.data {
            return Err(invalid(
                1,
                "DDGSTF does not match the negotiated data digest",
            ));
        }
        let dd = if data_digest { DIGEST_LEN } else { 0 };
        if plen < pdo + dd {
            return Err(invalid(4, "PLEN is shorter than PDO and data digest"));
        }
        (data_at, data_len) = (pdo, plen - dd - pdo);
    }

    let header = match ty {
        pdu_type::ICREQ => Header::IcReq {
            pfv: get_u16(b, 8),
            hpda: b[10],
            digests: Digests::from_bits(b[11]),
            maxr2t: get_u32(b, 12),
        },
        pdu_type::ICRESP => Header::IcResp {
            pfv: get_u16(b, 8),
            cpda: b[10],
            digests: Digests::from_bits(b[11]),
            maxh2cdata: get_u32(b, 12),
        },
        pdu_type::H2C_TERM_REQ | pdu_type::C2H_TERM_REQ => Header::TermReq {
            from_host: ty == pdu_type::H2C_TERM_REQ,
            fes: get_u16(b, 8),
            fei: get_u32(b, 10),
        },
        pdu_type::CAPSULE_CMD => Header::CapsuleCmd(Sqe::from_bytes(&b[8..8 + SQE_LEN])),
        pdu_type::CAPSULE_RESP => Header::CapsuleResp(Cqe::from_bytes(&b[8..8 + CQE_LEN])),
        pdu_type::H2C_DATA => Header::H2CData(transfer(b)),
        pdu_type::C2H_DATA => Header::C2HData(transfer(b)),
        _ => Header::R2T(transfer(b)),
    };
    if let Header::H2CData(t) | Header::C2HData(t) = header {
        if t.len as usize != data_len {
            return Err(invalid(16, "DATAL does not match the data the PDU carries"));
        }
    }
    Ok(Some(Framing {
        header,
        flags: fl,
        plen,
        data_at,
        data_len,
        data_digest,
    }))
}

/// Decodes the PDU at the start of `buf`. Returns `Ok(None)` until the whole
/// PDU is buffered, otherwise the PDU and its length. `expect` is what the
/// connection negotiated (ICReq/ICResp never carry digests). `max_pdu` bounds
/// PLEN.
pub fn decode(
    buf: &[u8],
    expect: Digests,
    max_pdu: usize,
) -> Result<Option<(Pdu<'_>, usize)>, PduError> {
    let Some(f) = decode_framing(buf, expect, max_pdu)? else {
        return Ok(None);
    };
    if buf.len() < f.plen {
        return Ok(None);
    }
    let data = &buf[f.data_at..f.data_at + f.data_len];
    let data_digest_ok =
        !f.data_digest || crc32c::crc32c(data) == get_u32(buf, f.plen - DIGEST_LEN);
    Ok(Some((
        Pdu {
            flags: f.flags,
            header: f.header,
            data,
            data_digest_ok,
        },
        f.plen,
    )))
}

fn transfer(b: &[u8]) -> Transfer {
    Transfer {
        cccid: get_u16(b, 8),
        ttag: get_u16(b, 10),
        offset: get_u32(b, 12),
        len: get_u32(b, 16),
    }
}

/// Appends the header part of a PDU to `out`: common header, PDU-specific
/// header, header digest and padding up to PDO. The caller appends
/// `data_len` bytes of data and then, when `digests.data` and there is data,
/// [`data_digest`] of it. `extra_flags` adds LAST_PDU / SUCCESS. `data_align`
/// is the peer's requested data alignment in bytes ((PDA + 1) * 4; 1 for none).
/// Returns the PDU's total length (PLEN).
pub fn encode_header(
    out: &mut Vec<u8>,
    header: &Header,
    extra_flags: u8,
    data_len: usize,
    digests: Digests,
    data_align: usize,
) -> usize {
    let ty = header.pdu_type();
    let hlen = hlen_of(ty).expect("known PDU type");
    let is_ic = matches!(ty, pdu_type::ICREQ | pdu_type::ICRESP);
    let is_term = matches!(header, Header::TermReq { .. });
    let hd = if digests.header && !is_ic && !is_term {
        DIGEST_LEN
    } else {
        0
    };
    let has_data = data_len > 0 && !is_term;
    let dd = if digests.data && has_data {
        DIGEST_LEN
    } else {
        0
    };
    let pdo = if has_data {
        (hlen + hd).next_multiple_of(data_align.max(1))
    } else {
        0
    };
    let plen = if has_data {
        pdo + data_len + dd
    } else {
        hlen + hd + data_len
    };
    let mut fl = extra_flags;
    if hd != 0 {
        fl |= flags::HDGST;
    }
    if dd != 0 {
        fl |= flags::DDGST;
    }

    let start = out.len();
    out.resize(start + hlen, 0);
    let b = &mut out[start..];
    b[0] = ty;
    b[1] = fl;
    b[2] = hlen as u8;
    b[3] = pdo as u8;
    put_u32(b, 4, plen as u32);
    match *header {
        Header::IcReq {
            pfv,
            hpda,
            digests,
            maxr2t,
        } => {
            put_u16(b, 8, pfv);
            b[10] = hpda;
            b[11] = digests.bits();
            put_u32(b, 12, maxr2t);
        }
        Header::IcResp {
            pfv,
            cpda,
            digests,
            maxh2cdata,
        } => {
            put_u16(b, 8, pfv);
            b[10] = cpda;
            b[11] = digests.bits();
            put_u32(b, 12, maxh2cdata);
        }
        Header::TermReq { fes, fei, .. } => {
            put_u16(b, 8, fes);
            put_u32(b, 10, fei);
        }
        Header::CapsuleCmd(sqe) => b[8..8 + SQE_LEN].copy_from_slice(&sqe.0),
        Header::CapsuleResp(cqe) => b[8..8 + CQE_LEN].copy_from_slice(&cqe.to_bytes()),
        Header::H2CData(t) | Header::C2HData(t) | Header::R2T(t) => {
            put_u16(b, 8, t.cccid);
            put_u16(b, 10, t.ttag);
            put_u32(b, 12, t.offset);
            put_u32(b, 16, t.len);
        }
    }
    if hd != 0 {
        let crc = crc32c::crc32c(&out[start..start + hlen]);
        out.extend_from_slice(&crc.to_le_bytes());
    }
    if has_data {
        out.resize(start + pdo, 0);
    }
    plen
}

/// Splits a transfer (`offset`, `len`) into the headers of data PDUs of at
/// most `max` bytes each, the last flagged LAST_PDU: how an R2T is answered
/// with H2CData, and how a read goes out as C2HData.
pub fn split_transfer(t: Transfer, max: usize) -> impl Iterator<Item = (Transfer, u8)> {
    let (start, end) = (t.offset as usize, t.offset as usize + t.len as usize);
    let max = max.max(1);
    (start..end).step_by(max).map(move |at| {
        let n = (end - at).min(max);
        let piece = Transfer {
            offset: at as u32,
            len: n as u32,
            ..t
        };
        (piece, if at + n == end { flags::LAST_PDU } else { 0 })
    })
}

/// The data digest of `data`, in wire byte order.
pub fn data_digest(data: &[u8]) -> [u8; 4] {
    crc32c::crc32c(data).to_le_bytes()
}

/// Continues a data digest over several pieces: start with 0.
pub fn data_digest_append(crc: u32, piece: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, piece)
}

/// Appends a whole PDU with its data to `out`: the header part as
/// [`encode_header`] writes it, the data, and the data digest when
/// `digests.data` and there is data. Anything already in `out` is kept, so
/// a send queue's recycled vector can take it without allocating.
pub fn encode_into(
    out: &mut Vec<u8>,
    header: &Header,
    extra_flags: u8,
    data: &[u8],
    digests: Digests,
    data_align: usize,
) {
    encode_header(out, header, extra_flags, data.len(), digests, data_align);
    out.extend_from_slice(data);
    let is_term = matches!(header, Header::TermReq { .. });
    if digests.data && !data.is_empty() && !is_term {
        out.extend_from_slice(&data_digest(data));
    }
}

/// Encodes a whole PDU with its data into a new vector (convenience for
/// small PDUs and tests; the data path appends data itself).
pub fn encode(
    header: &Header,
    extra_flags: u8,
    data: &[u8],
    digests: Digests,
    data_align: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(SHORT_HLEN * 4 + data.len());
    encode_into(&mut out, header, extra_flags, data, digests, data_align);
    out
}

#[cfg(test)]
mod tests;
