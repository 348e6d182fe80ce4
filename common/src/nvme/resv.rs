//! Reservations (NVMe Base 2.1, 8.1.22, and its reservation commands): the reservation
//! types, the fields of Reservation Register, Acquire, Release and Report,
//! the Reservation Status data structure (extended: 128-bit host
//! identifiers) and the Reservation Notification log page (80h).

use super::Sqe;
use crate::bytes::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};

/// A reservation type (RTYPE).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResvType {
    WriteExclusive = 1,
    ExclusiveAccess = 2,
    WriteExclusiveRegistrantsOnly = 3,
    ExclusiveAccessRegistrantsOnly = 4,
    WriteExclusiveAllRegistrants = 5,
    ExclusiveAccessAllRegistrants = 6,
}

impl ResvType {
    /// Every type, by value.
    pub const ALL: [ResvType; 6] = [
        ResvType::WriteExclusive,
        ResvType::ExclusiveAccess,
        ResvType::WriteExclusiveRegistrantsOnly,
        ResvType::ExclusiveAccessRegistrantsOnly,
        ResvType::WriteExclusiveAllRegistrants,
        ResvType::ExclusiveAccessAllRegistrants,
    ];

    pub fn from_u8(v: u8) -> Option<ResvType> {
        ResvType::ALL.get((v as usize).wrapping_sub(1)).copied()
    }

    /// Whether every registrant holds the reservation (All Registrants).
    pub fn all_registrants(self) -> bool {
        matches!(
            self,
            ResvType::WriteExclusiveAllRegistrants | ResvType::ExclusiveAccessAllRegistrants
        )
    }

    /// Whether registrants that do not hold it may still write (and read):
    /// the Registrants Only and All Registrants types.
    pub fn admits_registrants(self) -> bool {
        !matches!(self, ResvType::WriteExclusive | ResvType::ExclusiveAccess)
    }

    /// Whether those it does not admit may not read either (Exclusive Access).
    pub fn excludes_readers(self) -> bool {
        matches!(
            self,
            ResvType::ExclusiveAccess
                | ResvType::ExclusiveAccessRegistrantsOnly
                | ResvType::ExclusiveAccessAllRegistrants
        )
    }
}

/// Reservation Capabilities (Identify Namespace RESCAP, byte 31).
pub mod rescap {
    /// Persist Through Power Loss.
    pub const PTPL: u8 = 1 << 0;
    /// All six types (bits 1 to 6).
    pub const ALL_TYPES: u8 = 0x7e;
    /// Ignore Existing Key as defined in revision 1.3 and later.
    pub const IEKEY_1_3: u8 = 1 << 7;
}

/// Reservation Notification types (log page 80h, and the mask bits of
/// feature 82h: `1 << type`).
pub mod notice {
    pub const REGISTRATION_PREEMPTED: u8 = 1;
    pub const RESERVATION_RELEASED: u8 = 2;
    pub const RESERVATION_PREEMPTED: u8 = 3;
    /// Every maskable notice (feature 82h, CDW11 bits 3:1).
    pub const MASKABLE: u32 = 0b1110;
}

/// Reservation Register Action (CDW10 bits 2:0).
pub mod rrega {
    pub const REGISTER: u8 = 0;
    pub const UNREGISTER: u8 = 1;
    pub const REPLACE: u8 = 2;
}

/// Reservation Acquire Action (CDW10 bits 2:0).
pub mod racqa {
    pub const ACQUIRE: u8 = 0;
    pub const PREEMPT: u8 = 1;
    pub const PREEMPT_AND_ABORT: u8 = 2;
}

/// Reservation Release Action (CDW10 bits 2:0).
pub mod rrela {
    pub const RELEASE: u8 = 0;
    pub const CLEAR: u8 = 1;
}

/// Data bytes of Register and Acquire (two keys), of Release (one).
pub const KEYS_LEN: usize = 16;
pub const KEY_LEN: usize = 8;

/// The fields of Reservation Register, Acquire and Release: CDW10 and the
/// keys of the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResvCmd {
    /// The action (RREGA, RACQA or RRELA).
    pub action: u8,
    /// Ignore Existing Key (bit 3).
    pub iekey: bool,
    /// Reservation type (Acquire, Release: bits 15:8).
    pub rtype: u8,
    /// Change Persist Through Power Loss state (Register: bits 31:30).
    pub cptpl: u8,
    /// Current reservation key.
    pub crkey: u64,
    /// New (Register) or preempt (Acquire) reservation key.
    pub key2: u64,
}

impl ResvCmd {
    /// Decodes CDW10 of `sqe` and the keys in `data` (absent keys read 0).
    pub fn parse(sqe: &Sqe, data: &[u8]) -> ResvCmd {
        let cdw10 = sqe.cdw(10);
        let key = |at: usize| {
            data.get(at..at + KEY_LEN)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        ResvCmd {
            action: (cdw10 & 7) as u8,
            iekey: cdw10 & 1 << 3 != 0,
            rtype: (cdw10 >> 8) as u8,
            cptpl: (cdw10 >> 30) as u8,
            crkey: key(0),
            key2: key(8),
        }
    }

    /// CDW10 for these fields, and the data (both keys; a Release sends
    /// only the first 8 bytes).
    pub fn encode(&self) -> (u32, [u8; KEYS_LEN]) {
        let cdw10 = self.action as u32 & 7
            | (self.iekey as u32) << 3
            | (self.rtype as u32) << 8
            | (self.cptpl as u32 & 3) << 30;
        let mut data = [0u8; KEYS_LEN];
        data[..8].copy_from_slice(&self.crkey.to_le_bytes());
        data[8..].copy_from_slice(&self.key2.to_le_bytes());
        (cdw10, data)
    }
}

/// Bytes of the extended Reservation Status header, and of each Registered
/// Controller extended data structure.
pub const STATUS_EXT_HEADER: usize = 64;
pub const REGISTRANT_EXT_LEN: usize = 64;

/// A registrant as Reservation Report lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registrant {
    /// FFFFh: a host (all its controllers) rather than one controller.
    pub cntlid: u16,
    /// Holds the reservation (RCSTS bit 0).
    pub holds: bool,
    pub hostid: [u8; 16],
    pub rkey: u64,
}

/// The Reservation Status extended data structure (Report with EDS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResvStatus {
    /// Generation: bumped by each Register, preempt and Clear.
    pub gen: u32,
    /// The reservation's type, 0 when none is held.
    pub rtype: u8,
    /// Persist Through Power Loss State.
    pub ptpls: bool,
    pub registrants: Vec<Registrant>,
}

impl ResvStatus {
    /// The structure, cut or padded to `len` bytes (REGCTL counts every
    /// registrant, listed or not).
    pub fn encode(&self, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; STATUS_EXT_HEADER + REGISTRANT_EXT_LEN * self.registrants.len()];
        put_u32(&mut b, 0, self.gen);
        b[4] = self.rtype;
        put_u16(&mut b, 5, self.registrants.len() as u16);
        b[9] = self.ptpls as u8;
        for (i, r) in self.registrants.iter().enumerate() {
            let at = STATUS_EXT_HEADER + i * REGISTRANT_EXT_LEN;
            put_u16(&mut b, at, r.cntlid);
            b[at + 2] = r.holds as u8;
            put_u64(&mut b, at + 8, r.rkey);
            b[at + 16..at + 32].copy_from_slice(&r.hostid);
        }
        b.resize(len, 0);
        b
    }

    /// Parses a structure of at least the header; registrants that the
    /// buffer does not hold whole are left out.
    pub fn parse(b: &[u8]) -> Option<ResvStatus> {
        if b.len() < STATUS_EXT_HEADER {
            return None;
        }
        let count = get_u16(b, 5) as usize;
        let registrants = (0..count)
            .map(|i| STATUS_EXT_HEADER + i * REGISTRANT_EXT_LEN)
            .take_while(|at| at + REGISTRANT_EXT_LEN <= b.len())
            .map(|at| Registrant {
                cntlid: get_u16(b, at),
                holds: b[at + 2] & 1 != 0,
                rkey: get_u64(b, at + 8),
                hostid: b[at + 16..at + 32].try_into().expect("16 bytes"),
            })
            .collect();
        Some(ResvStatus {
            gen: get_u32(b, 0),
            rtype: b[4],
            ptpls: b[9] & 1 != 0,
            registrants,
        })
    }
}

/// Bytes of the Reservation Notification log page.
pub const NOTICE_LOG_LEN: usize = 64;

/// One Reservation Notification log page (80h).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoticeLog {
    /// Log Page Count: which notice this is (0: the page is empty).
    pub count: u64,
    /// Reservation Notification Log Page Type (`notice`; 0 when empty).
    pub kind: u8,
    /// Number of Available Log Pages after this one (at most 255).
    pub available: u8,
    pub nsid: u32,
}

impl NoticeLog {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; NOTICE_LOG_LEN];
        put_u64(&mut b, 0, self.count);
        b[8] = self.kind;
        b[9] = self.available;
        put_u32(&mut b, 12, self.nsid);
        b
    }

    pub fn parse(b: &[u8]) -> Option<NoticeLog> {
        (b.len() >= 16).then(|| NoticeLog {
            count: get_u64(b, 0),
            kind: b[8],
            available: b[9],
            nsid: get_u32(b, 12),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_fields_round_trip() {
        let c = ResvCmd {
            action: racqa::PREEMPT_AND_ABORT,
            iekey: true,
            rtype: 4,
            cptpl: 3,
            crkey: 0x1122_3344_5566_7788,
            key2: 42,
        };
        let (cdw10, data) = c.encode();
        let mut sqe = Sqe::new(super::super::nvm::RESV_ACQUIRE, 1);
        sqe.set_cdw(10, cdw10);
        assert_eq!(cdw10, 2 | 1 << 3 | 4 << 8 | 3 << 30);
        assert_eq!(ResvCmd::parse(&sqe, &data), c);
        assert_eq!(ResvCmd::parse(&sqe, &data[..8]).key2, 0, "a short buffer");
    }

    /// NVMe Base 2.1, Reservation Report: the Reservation Status Extended
    /// Data Structure is a 64-byte header, then 64 bytes per registrant,
    /// its key at 8 and its host identifier at 16.
    #[test]
    fn status_layout() {
        let s = ResvStatus {
            gen: 7,
            rtype: 5,
            ptpls: true,
            registrants: vec![
                Registrant {
                    cntlid: 0xffff,
                    holds: true,
                    hostid: [0xab; 16],
                    rkey: 9,
                },
                Registrant {
                    cntlid: 0xffff,
                    holds: true,
                    hostid: [0xcd; 16],
                    rkey: 10,
                },
            ],
        };
        let b = s.encode(4096);
        assert_eq!(b.len(), 4096);
        assert_eq!((get_u32(&b, 0), b[4], get_u16(&b, 5), b[9]), (7, 5, 2, 1));
        assert_eq!(get_u64(&b, 64 + 8), 9);
        assert_eq!(&b[64 + 16..64 + 32], &[0xab; 16]);
        assert_eq!(ResvStatus::parse(&b), Some(s.clone()));
        let cut = ResvStatus::parse(&s.encode(64 + 64)).expect("header");
        assert_eq!((cut.registrants.len(), get_u16(&s.encode(64), 5)), (1, 2));
    }

    #[test]
    fn types() {
        assert_eq!(ResvType::from_u8(0), None);
        assert_eq!(ResvType::from_u8(7), None);
        for t in ResvType::ALL {
            assert_eq!(ResvType::from_u8(t as u8), Some(t));
        }
        assert!(ResvType::ExclusiveAccessAllRegistrants.all_registrants());
        assert!(!ResvType::WriteExclusive.admits_registrants());
        assert!(ResvType::ExclusiveAccessRegistrantsOnly.excludes_readers());
    }

    #[test]
    fn notice_log_layout() {
        let n = NoticeLog {
            count: 3,
            kind: notice::RESERVATION_RELEASED,
            available: 1,
            nsid: 2,
        };
        let b = n.encode();
        assert_eq!((b[8], b[9], get_u32(&b, 12)), (2, 1, 2));
        assert_eq!(NoticeLog::parse(&b), Some(n));
    }
}
