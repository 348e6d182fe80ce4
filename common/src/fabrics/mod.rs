//! NVMe over Fabrics commands: Connect, Property Get/Set, Disconnect, the
//! discovery log page, and the transports.

pub mod discovery;
mod transport;

pub use discovery::{DiscoveryEntry, DISCOVERY_ENTRY_LEN, DISCOVERY_LOG_HEADER_LEN};
pub use transport::{Transport, UnknownTransport};

use crate::bytes::{get_nqn, get_u16, get_u32, get_u64, put_str, put_u16, put_u32, put_u64};
use crate::nvme::{Sgl, Sqe, FABRICS_OPCODE};

/// The well-known NQN of discovery subsystems.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Fabrics command types (byte 4 of a Fabrics command).
pub mod fctype {
    pub const PROPERTY_SET: u8 = 0x00;
    pub const CONNECT: u8 = 0x01;
    pub const PROPERTY_GET: u8 = 0x04;
    pub const AUTH_SEND: u8 = 0x05;
    pub const AUTH_RECV: u8 = 0x06;
    pub const DISCONNECT: u8 = 0x08;
}

/// Connect response dword 0, bit 17: Authentication Required (ATR): the
/// queue authenticates (DH-HMAC-CHAP) before other commands.
pub const CONNECT_ATR: u32 = 1 << 17;

/// Size of the Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;

/// Connect command fields carried in the SQE.
/// Connect command attributes (CATTR), NVMe over Fabrics 1.1, Figure 20.
pub mod cattr {
    /// The host disables SQ flow control: responses carry SQHD FFFFh.
    pub const DISABLE_SQ_FLOW: u8 = 1 << 2;
}

/// The SQHD of every response on a queue without SQ flow control.
pub const SQHD_FLOW_DISABLED: u16 = 0xffff;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectCmd {
    pub recfmt: u16,
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    pub cattr: u8,
    /// Keep-alive timeout in milliseconds (admin queue only).
    pub kato: u32,
}

impl ConnectCmd {
    pub fn from_sqe(sqe: &Sqe) -> Self {
        ConnectCmd {
            recfmt: get_u16(&sqe.0, 40),
            qid: get_u16(&sqe.0, 42),
            sqsize: get_u16(&sqe.0, 44),
            cattr: sqe.0[46],
            kato: get_u32(&sqe.0, 48),
        }
    }

    /// Builds the Connect SQE; the 1024-byte data goes as described by `sgl`.
    pub fn to_sqe(&self, cid: u16, sgl: &Sgl) -> Sqe {
        let mut s = Sqe::new(FABRICS_OPCODE, cid);
        s.0[4] = fctype::CONNECT;
        s.set_sgl(sgl);
        put_u16(&mut s.0, 40, self.recfmt);
        put_u16(&mut s.0, 42, self.qid);
        put_u16(&mut s.0, 44, self.sqsize);
        s.0[46] = self.cattr;
        put_u32(&mut s.0, 48, self.kato);
        s
    }
}

/// The 1024-byte data of a Connect command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectData {
    pub hostid: [u8; 16],
    /// 0xFFFF on the admin queue (dynamic model), the controller's id on I/O queues.
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
}

impl ConnectData {
    /// Offset of SUBNQN in the data (for Connect Invalid Parameters' IPO).
    pub const SUBNQN_OFFSET: u16 = 256;
    /// Offset of HOSTNQN in the data.
    pub const HOSTNQN_OFFSET: u16 = 512;
    /// Offset of CNTLID in the data.
    pub const CNTLID_OFFSET: u16 = 16;

    /// Parses the data; `b` must hold at least 1024 bytes.
    pub fn parse(b: &[u8]) -> Self {
        let mut hostid = [0; 16];
        hostid.copy_from_slice(&b[..16]);
        ConnectData {
            hostid,
            cntlid: get_u16(b, 16),
            subnqn: get_nqn(b, 256, 256),
            hostnqn: get_nqn(b, 512, 256),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; CONNECT_DATA_LEN];
        b[..16].copy_from_slice(&self.hostid);
        put_u16(&mut b, 16, self.cntlid);
        put_str(&mut b, 256, 256, &self.subnqn, 0);
        put_str(&mut b, 512, 256, &self.hostnqn, 0);
        b
    }
}

/// Connect response "Invalid Parameters" detail for CQE dword 0: whether the
/// bad parameter is in the data (`in_data`) and its byte offset.
pub fn invalid_param_dw0(in_data: bool, offset: u16) -> u32 {
    (offset as u32) << 16 | in_data as u32
}

/// Property Get/Set fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PropertyCmd {
    /// Property size is 8 bytes (else 4).
    pub wide: bool,
    pub offset: u32,
    /// Value to set (Property Set only).
    pub value: u64,
}

impl PropertyCmd {
    pub fn from_sqe(sqe: &Sqe) -> Self {
        PropertyCmd {
            wide: sqe.0[40] & 7 == 1,
            offset: get_u32(&sqe.0, 44),
            value: get_u64(&sqe.0, 48),
        }
    }

    /// Builds a Property Get (`set == false`) or Property Set command.
    pub fn to_sqe(&self, cid: u16, set: bool) -> Sqe {
        let mut s = Sqe::new(FABRICS_OPCODE, cid);
        s.0[4] = if set {
            fctype::PROPERTY_SET
        } else {
            fctype::PROPERTY_GET
        };
        s.set_sgl(&Sgl::Null);
        s.0[40] = self.wide as u8;
        put_u32(&mut s.0, 44, self.offset);
        if set {
            put_u64(&mut s.0, 48, self.value);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_layout() {
        let c = ConnectCmd {
            recfmt: 0,
            qid: 1,
            sqsize: 127,
            cattr: 0,
            kato: 0,
        };
        let s = c.to_sqe(
            9,
            &Sgl::InCapsule {
                offset: 0,
                len: 1024,
            },
        );
        assert_eq!(s.opcode(), 0x7f);
        assert_eq!(s.fctype(), fctype::CONNECT);
        assert_eq!(get_u16(&s.0, 42), 1);
        assert_eq!(get_u16(&s.0, 44), 127);
        assert_eq!(ConnectCmd::from_sqe(&s), c);

        let d = ConnectData {
            hostid: [1; 16],
            cntlid: 0xffff,
            subnqn: "nqn.2026-11.io.rdmablk:a".into(),
            hostnqn: "nqn.2026-11.io.rdmablk:h".into(),
        };
        let b = d.encode();
        assert_eq!(b.len(), 1024);
        assert_eq!(&b[256..260], b"nqn.");
        assert_eq!(ConnectData::parse(&b), d);
        // NQNs are exact bytes up to the NUL: trailing blanks stay.
        let mut padded = b.clone();
        padded[512 + d.hostnqn.len()] = b' ';
        assert_eq!(
            ConnectData::parse(&padded).hostnqn,
            format!("{} ", d.hostnqn)
        );
    }

    #[test]
    fn property_layout() {
        let p = PropertyCmd {
            wide: true,
            offset: 0,
            value: 0,
        };
        let s = p.to_sqe(3, false);
        assert_eq!(s.fctype(), fctype::PROPERTY_GET);
        assert_eq!(s.0[40], 1);
        assert_eq!(PropertyCmd::from_sqe(&s), p);
    }
}
