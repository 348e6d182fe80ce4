//! The 32-byte RDMA CM private data of NVMe/RDMA (NVMe over Fabrics, RDMA
//! transport binding): what the host asks for when it connects a queue, what
//! the controller answers, and why it refuses.

use crate::bytes::{get_u16, put_u16};

/// Length of every NVMe/RDMA private data block.
pub const PRIVATE_DATA_LEN: usize = 32;

/// The host's connect request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Record format; 0 is the only one defined.
    pub recfmt: u16,
    /// Queue id: 0 for the admin queue.
    pub qid: u16,
    /// Responses the host can receive at once (not 0's based).
    pub hrqsize: u16,
    /// Host send queue size, 0's based: the queue holds `hsqsize + 1` entries.
    pub hsqsize: u16,
    /// Controller id for an I/O queue (0xFFFF or 0 when unused).
    pub cntlid: u16,
}

/// The controller's accept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectReply {
    pub recfmt: u16,
    /// Commands the controller can receive at once.
    pub crqsize: u16,
}

/// Why a controller refused a queue (the reject's status field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum RejectStatus {
    InvalidPrivateDataLength = 1,
    InvalidRecfmt = 2,
    InvalidQid = 3,
    InvalidHsqsize = 4,
    InvalidHrqsize = 5,
    NoResources = 6,
    InvalidIrd = 7,
    InvalidOrd = 8,
    InvalidCntlid = 9,
}

impl RejectStatus {
    fn from_code(c: u16) -> Option<RejectStatus> {
        use RejectStatus::*;
        Some(match c {
            1 => InvalidPrivateDataLength,
            2 => InvalidRecfmt,
            3 => InvalidQid,
            4 => InvalidHsqsize,
            5 => InvalidHrqsize,
            6 => NoResources,
            7 => InvalidIrd,
            8 => InvalidOrd,
            9 => InvalidCntlid,
            _ => return None,
        })
    }

    /// What the status means, for logs and error messages.
    pub fn describe(self) -> &'static str {
        use RejectStatus::*;
        match self {
            InvalidPrivateDataLength => "invalid private data length",
            InvalidRecfmt => "invalid record format",
            InvalidQid => "invalid queue id",
            InvalidHsqsize => "invalid host send queue size",
            InvalidHrqsize => "invalid host receive queue size",
            NoResources => "no resources",
            InvalidIrd => "invalid IRD",
            InvalidOrd => "invalid ORD",
            InvalidCntlid => "invalid controller id",
        }
    }
}

impl ConnectRequest {
    /// Decodes a request; the reject status when it cannot be accepted as one.
    pub fn decode(b: &[u8]) -> Result<ConnectRequest, RejectStatus> {
        if b.len() < PRIVATE_DATA_LEN {
            return Err(RejectStatus::InvalidPrivateDataLength);
        }
        let r = ConnectRequest {
            recfmt: get_u16(b, 0),
            qid: get_u16(b, 2),
            hrqsize: get_u16(b, 4),
            hsqsize: get_u16(b, 6),
            cntlid: get_u16(b, 8),
        };
        if r.recfmt != 0 {
            return Err(RejectStatus::InvalidRecfmt);
        }
        Ok(r)
    }

    pub fn encode(&self) -> [u8; PRIVATE_DATA_LEN] {
        let mut b = [0u8; PRIVATE_DATA_LEN];
        put_u16(&mut b, 0, self.recfmt);
        put_u16(&mut b, 2, self.qid);
        put_u16(&mut b, 4, self.hrqsize);
        put_u16(&mut b, 6, self.hsqsize);
        put_u16(&mut b, 8, self.cntlid);
        b
    }
}

impl ConnectReply {
    pub fn decode(b: &[u8]) -> Option<ConnectReply> {
        (b.len() >= 4).then(|| ConnectReply {
            recfmt: get_u16(b, 0),
            crqsize: get_u16(b, 2),
        })
    }

    pub fn encode(&self) -> [u8; PRIVATE_DATA_LEN] {
        let mut b = [0u8; PRIVATE_DATA_LEN];
        put_u16(&mut b, 0, self.recfmt);
        put_u16(&mut b, 2, self.crqsize);
        b
    }
}

/// Encodes a reject.
pub fn encode_reject(st: RejectStatus) -> [u8; 4] {
    let mut b = [0u8; 4];
    put_u16(&mut b, 2, st as u16);
    b
}

/// Decodes a reject's private data: the status, or the raw code when unknown.
pub fn decode_reject(b: &[u8]) -> Result<RejectStatus, Option<u16>> {
    if b.len() < 4 {
        return Err(None);
    }
    let code = get_u16(b, 2);
    RejectStatus::from_code(code).ok_or(Some(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel host's request for an I/O queue of 128 entries
    /// (drivers/nvme/host/rdma.c: hrqsize = queue size, hsqsize = sqsize).
    #[test]
    fn request_layout_matches_the_kernel_host() {
        let b = ConnectRequest {
            recfmt: 0,
            qid: 3,
            hrqsize: 128,
            hsqsize: 127,
            cntlid: 1,
        }
        .encode();
        assert_eq!(&b[..10], &[0, 0, 3, 0, 128, 0, 127, 0, 1, 0]);
        assert!(b[10..].iter().all(|&x| x == 0));
        assert_eq!(ConnectRequest::decode(&b).unwrap().hsqsize, 127);
    }

    #[test]
    fn bad_requests_are_refused_with_their_status() {
        assert_eq!(
            ConnectRequest::decode(&[0u8; 8]),
            Err(RejectStatus::InvalidPrivateDataLength)
        );
        let mut b = [0u8; 32];
        b[0] = 1;
        assert_eq!(ConnectRequest::decode(&b), Err(RejectStatus::InvalidRecfmt));
    }

    #[test]
    fn reply_and_reject_round_trip() {
        let r = ConnectReply {
            recfmt: 0,
            crqsize: 32,
        };
        assert_eq!(ConnectReply::decode(&r.encode()), Some(r));
        let rej = encode_reject(RejectStatus::InvalidHsqsize);
        assert_eq!(rej, [0, 0, 4, 0]);
        assert_eq!(decode_reject(&rej), Ok(RejectStatus::InvalidHsqsize));
        assert_eq!(decode_reject(&[0, 0, 77, 0]), Err(Some(77)));
    }
}
